// Package record is the compact binary form of a job: the file ledger's
// record on disk, and the memory ledger's form of a job that settled, which
// the garbage collector need not scan.
package record

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"maps"
	"math"
	"slices"
	"time"

	"github.com/onejob/onejob/ledger"
)

// Jobs are stored in a compact binary record: a format byte, then every
// field in a fixed order, integers as varints, strings and byte slices
// length-prefixed. Records of the first releases are JSON objects, read
// still (they start with '{', never a format byte), and so are records of
// format 1, which lack the fingerprint's scheme.
const (
	recordV1 = 0x01
	recordV2 = 0x02 // the fingerprint's scheme after its version; each attempt's resend flag
	recordV3 = 0x03 // each attempt's lookups after its resend flag
	recordV4 = 0x04 // each attempt's scope after its lookups
)

// recordFormat is the oldest format that holds j: a job whose attempts
// have no scope is written as format 3, and one no lookup touched either
// as format 2, which gateways of earlier releases read too.
func recordFormat(j *ledger.Job) byte {
	format := byte(recordV2)
	for i := range j.Attempts {
		if j.Attempts[i].Scope != "" {
			return recordV4
		}
		if j.Attempts[i].Lookup != nil {
			format = recordV3
		}
	}
	return format
}

// ErrCorrupt is the error of Decode for a record it cannot read.
var ErrCorrupt = errors.New("corrupt job record")

// Encode returns j's record, in the oldest format that holds it.
func Encode(j *ledger.Job) []byte {
	b := make([]byte, 0, 256+len(j.Attempts)*96+responseSize(j.Response))
	format := recordFormat(j)
	b = append(b, format)
	b = appendString(b, j.ID)
	b = appendBytes(b, j.OwnerHash)
	b = appendBytes(b, j.KeyHash)
	b = appendBytes(b, j.Fingerprint)
	b = binary.AppendVarint(b, int64(j.FingerprintVersion))
	b = appendString(b, j.FingerprintScheme)
	b = appendString(b, string(j.State))
	b = binary.AppendVarint(b, j.Version)
	b = appendString(b, j.CompletedBy)
	b = binary.AppendVarint(b, int64(j.Retention))
	b = appendTime(b, j.CreatedAt)
	b = appendTime(b, j.CompletedAt)
	b = appendTime(b, j.ExpiresAt)
	if r := j.Response; r == nil {
		b = append(b, 0)
	} else {
		b = append(b, 1)
		b = binary.AppendVarint(b, int64(r.Status))
		b = binary.AppendUvarint(b, uint64(len(r.Header)))
		// In order: a job's record is the same bytes however often it is
		// encoded, so that a writer can tell a change from none.
		for _, name := range slices.Sorted(maps.Keys(r.Header)) {
			values := r.Header[name]
			b = appendString(b, name)
			b = binary.AppendUvarint(b, uint64(len(values)))
			for _, v := range values {
				b = appendString(b, v)
			}
		}
		if r.Body == nil {
			b = append(b, 0)
		} else {
			b = append(b, 1)
			b = appendBytes(b, r.Body)
		}
		b = binary.AppendVarint(b, r.Size)
		b = appendBool(b, r.Stored)
	}
	b = binary.AppendUvarint(b, uint64(len(j.Attempts)))
	for i := range j.Attempts {
		a := &j.Attempts[i]
		b = appendString(b, a.ID)
		b = appendString(b, a.JobID)
		b = binary.AppendVarint(b, int64(a.Number))
		b = appendString(b, a.Provider)
		b = appendString(b, string(a.State))
		b = binary.AppendVarint(b, a.JobVersion)
		b = appendTime(b, a.StartedAt)
		b = appendTime(b, a.Deadline)
		b = appendTime(b, a.FinishedAt)
		b = appendString(b, a.Error)
		b = appendBool(b, a.Resend)
		if format >= recordV3 {
			b = appendLookup(b, a.Lookup)
		}
		if format >= recordV4 {
			b = appendString(b, a.Scope)
		}
	}
	return b
}

// appendLookup writes 0 for an attempt no lookup touched, else 1 and the
// record.
func appendLookup(b []byte, l *ledger.Lookup) []byte {
	if l == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.AppendVarint(b, int64(l.Tries))
	b = binary.AppendVarint(b, int64(l.LastStatus))
	b = appendTime(b, l.LastAt)
	b = appendTime(b, l.NextAt)
	b = appendBool(b, l.Settled)
	b = appendString(b, l.Holder)
	return appendTime(b, l.Until)
}

func responseSize(r *ledger.Response) int {
	if r == nil {
		return 0
	}
	return len(r.Body) + 64*len(r.Header)
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendBytes(b, s []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// appendTime writes 0 for the zero time, else 1 and the Unix time in
// nanoseconds.
func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return append(b, 0)
	}
	return binary.AppendVarint(append(b, 1), t.UnixNano())
}

// Decode reads a record written by Encode, or a JSON record.
func Decode(v []byte) (*ledger.Job, error) {
	if len(v) > 0 && v[0] == '{' {
		var j ledger.Job
		if err := json.Unmarshal(v, &j); err != nil {
			return nil, err
		}
		return &j, nil
	}
	if len(v) == 0 || v[0] < recordV1 || v[0] > recordV4 {
		return nil, ErrCorrupt
	}
	d := decoder{b: v[1:]}
	j := &ledger.Job{
		ID:                 d.string(),
		OwnerHash:          d.bytes(),
		KeyHash:            d.bytes(),
		Fingerprint:        d.bytes(),
		FingerprintVersion: d.int(),
	}
	if v[0] >= recordV2 {
		j.FingerprintScheme = d.string()
	}
	j.State = ledger.JobState(d.string())
	j.Version = d.varint()
	j.CompletedBy = d.string()
	j.Retention = time.Duration(d.varint())
	j.CreatedAt, j.CompletedAt, j.ExpiresAt = d.time(), d.time(), d.time()
	if d.flag() {
		r := &ledger.Response{Status: d.int()}
		if n := d.count(); n > 0 {
			r.Header = make(map[string][]string, n)
			for range n {
				name := d.string()
				values := make([]string, d.count())
				for i := range values {
					values[i] = d.string()
				}
				r.Header[name] = values
			}
		}
		if d.flag() {
			r.Body = d.bytes()
			if r.Body == nil {
				r.Body = []byte{}
			}
		}
		r.Size = d.varint()
		r.Stored = d.flag()
		j.Response = r
	}
	if n := d.count(); n > 0 {
		j.Attempts = make([]ledger.Attempt, n)
		for i := range j.Attempts {
			j.Attempts[i] = ledger.Attempt{
				ID:         d.string(),
				JobID:      d.string(),
				Number:     d.int(),
				Provider:   d.string(),
				State:      ledger.AttemptState(d.string()),
				JobVersion: d.varint(),
				StartedAt:  d.time(),
				Deadline:   d.time(),
				FinishedAt: d.time(),
				Error:      d.string(),
			}
			if v[0] >= recordV2 {
				j.Attempts[i].Resend = d.flag()
			}
			if v[0] >= recordV3 && d.flag() {
				j.Attempts[i].Lookup = &ledger.Lookup{
					Tries: d.int(), LastStatus: d.int(), LastAt: d.time(), NextAt: d.time(),
					Settled: d.flag(), Holder: d.string(), Until: d.time(),
				}
			}
			if v[0] >= recordV4 {
				j.Attempts[i].Scope = d.string()
			}
		}
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, ErrCorrupt
	}
	return j, nil
}

// decoder reads a record; after the first error every read returns zero
// values and err stays set.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	d.err, d.b = ErrCorrupt, nil
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int {
	v := d.varint()
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail()
		return 0
	}
	return int(v)
}

// count reads a number of items, each at least one byte long.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return 0
	}
	return int(n)
}

func (d *decoder) bytes() []byte {
	n := d.count()
	if d.err != nil || n == 0 {
		return nil
	}
	v := make([]byte, n)
	copy(v, d.b)
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string {
	n := d.count()
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) flag() bool {
	if len(d.b) == 0 {
		d.fail()
		return false
	}
	v := d.b[0]
	d.b = d.b[1:]
	switch v {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail()
	return false
}

func (d *decoder) time() time.Time {
	if !d.flag() {
		return time.Time{}
	}
	return time.Unix(0, d.varint())
}
