package file

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"io"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// The key space (see the package doc): one byte says what a key holds.
const (
	prefixJob    = 'j' // j<id>: the job's identity key (k...)
	prefixKey    = 'k' // k<len(owner)><owner><key>, the identity key: the record of the job of an owner's key
	prefixExpiry = 'x' // x<expiry, Unix ns, big-endian><id>: nothing
	prefixOpen   = 'o' // o<id>: nothing; the job is not at rest
	totalKey     = "n" // the number of jobs, a sum of varint deltas (sumMerger)
	formatKey    = "v" // the layout's version
)

func jobKey(id string) []byte { return append([]byte{prefixJob}, id...) }

func identityKey(owner, key []byte) []byte {
	b := make([]byte, 0, 2+len(owner)+len(key))
	b = binary.AppendUvarint(append(b, prefixKey), uint64(len(owner)))
	return append(append(b, owner...), key...)
}

func expiryKey(at time.Time, id string) []byte {
	b := binary.BigEndian.AppendUint64([]byte{prefixExpiry}, uint64(at.UnixNano()))
	return append(b, id...)
}

func openKey(id string) []byte { return append([]byte{prefixOpen}, id...) }

// prefixBounds are the iterator bounds of every key that starts with p.
func prefixBounds(p byte) *pebble.IterOptions {
	return &pebble.IterOptions{LowerBound: []byte{p}, UpperBound: upperBound([]byte{p})}
}

// upperBound returns the first key after every key that starts with
// prefix, nil when there is none (prefix is all 0xff).
func upperBound(prefix []byte) []byte {
	end := bytes.Clone(prefix)
	for i := len(end) - 1; i >= 0; i-- {
		if end[i] < 0xff {
			end[i]++
			return end[:i+1]
		}
	}
	return nil
}

// shape is what the indexes hold of a job: when it expires (zero: not
// yet), and whether it is at rest (fsm.AtRest). A job that is not there
// has the zero shape.
type shape struct {
	expires time.Time
	open    bool
	exists  bool
}

func shapeOf(j *ledger.Job) shape {
	return shape{expires: j.ExpiresAt, open: !fsm.AtRest(j), exists: true}
}

// reindex writes to b the changes of job id's index entries from before to
// after, and of the count of jobs.
func reindex(b *pebble.Batch, id string, before, after shape) {
	if !before.expires.Equal(after.expires) {
		if !before.expires.IsZero() {
			b.Delete(expiryKey(before.expires, id), nil)
		}
		if !after.expires.IsZero() {
			b.Set(expiryKey(after.expires, id), nil, nil)
		}
	}
	switch {
	case after.open && !before.open:
		b.Set(openKey(id), nil, nil)
	case before.open && !after.open:
		b.Delete(openKey(id), nil)
	}
	switch {
	case after.exists && !before.exists:
		b.Merge([]byte(totalKey), binary.AppendVarint(nil, 1), nil)
	case before.exists && !after.exists:
		b.Merge([]byte(totalKey), binary.AppendVarint(nil, -1), nil)
	}
}

// sumMerger adds up the varint deltas written to a key: the count of jobs
// changes with every job made or removed, without a read.
var sumMerger = &pebble.Merger{
	Name: "onejob.sum",
	Merge: func(_, value []byte) (pebble.ValueMerger, error) {
		s := new(sum)
		return s, s.MergeNewer(value)
	},
}

type sum struct{ n int64 }

func (s *sum) MergeNewer(v []byte) error {
	d, n := binary.Varint(v)
	if n <= 0 || n != len(v) {
		return errors.New("file ledger: a count that is not a varint")
	}
	s.n += d
	return nil
}

func (s *sum) MergeOlder(v []byte) error { return s.MergeNewer(v) }

func (s *sum) Finish(bool) ([]byte, io.Closer, error) {
	return binary.AppendVarint(nil, s.n), nil, nil
}

// stripes are locks by hash: the transitions of the job of an owner's
// key (and the making and removing of it) take the key's stripe, so that
// they run one at a time, and others beside them.
type stripes [256]stripe

// stripe is a lock held across a commit, which waits for the log's sync:
// a channel of one, as a goroutine waiting for a channel counts as
// blocked in a synctest bubble (the simulation's), where one waiting for
// a mutex would keep the bubble's clock from reaching the sync's timer.
type stripe chan struct{}

func (s stripe) Lock()   { s <- struct{}{} }
func (s stripe) Unlock() { <-s }

var stripeSeed = maphash.MakeSeed()

func newStripes() (s stripes) {
	for i := range s {
		s[i] = make(stripe, 1)
	}
	return s
}

func (s *stripes) of(key string) stripe {
	return s[maphash.String(stripeSeed, key)%uint64(len(s))]
}
