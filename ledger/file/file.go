// Package file is a Ledger in one local file (bbolt): durable across
// restarts with no server to run, for one gateway process on one machine.
// Every write commits (fsync) before it returns; concurrent writes share
// commits through bbolt's Batch. Transitions are the ones of the memory
// ledger (package fsm), applied inside a transaction.
//
// Layout: bucket "jobs" maps a job id (UUIDv7, so byte order is creation
// order) to the job as JSON, attempts included; bucket "keys" maps
// owner hash + 0x00 + key hash to the job id (the uniqueness of (owner,
// key) is the key of this bucket); bucket "expiry" indexes completed and
// failed jobs by expires_at (8-byte big-endian Unix nanoseconds + id), and
// bucket "leases" indexes starting attempts by deadline, so that sweeps
// read only what is due.
package file

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/record"
)

var (
	bucketJobs   = []byte("jobs")
	bucketKeys   = []byte("keys")
	bucketExpiry = []byte("expiry")
	bucketLeases = []byte("leases")
)

// Options configure a Ledger.
type Options struct {
	// Timeout bounds the wait for the file lock held by another process
	// (or another config of this process). Default 5s.
	Timeout time.Duration
	// Now is the ledger's clock; default time.Now.
	Now func() time.Time
}

// Ledger is a file ledger.
type Ledger struct {
	fsm.Applier // the transitions of one job, over update

	db        *bolt.DB
	group     groupCommit
	completed *near.Cache // replayable jobs read lately, by identity
	now       func() time.Time

	mu      sync.Mutex
	changed map[string]chan struct{} // job id → closed on its next change
}

// Open opens (or creates) the ledger file at path.
func Open(path string, opts Options) (*Ledger, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: opts.Timeout,
		// The free page list is rebuilt at open instead of written at
		// every commit, where it grows with the file.
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	})
	if err != nil {
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketJobs, bucketKeys, bucketExpiry, bucketLeases} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	l := &Ledger{
		db: db, group: groupCommit{db: db}, now: opts.Now,
		completed: near.New(10000, 64<<20),
		changed:   make(map[string]chan struct{}),
	}
	l.Applier = fsm.Applier{Update: l.update}
	return l, nil
}

// Path returns the ledger file's path.
func (l *Ledger) Path() string { return l.db.Path() }

// Close closes the file.
func (l *Ledger) Close() error { return l.db.Close() }

func identity(owner, key []byte) []byte {
	id := make([]byte, 0, len(owner)+1+len(key))
	id = append(id, owner...)
	id = append(id, 0)
	return append(id, key...)
}

func timeKey(t time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(t.UnixNano()))
	return append(k, id...)
}

// index returns the expiry and lease index entries of a job.
func index(j *ledger.Job) (expiry []byte, leases [][]byte) {
	if !j.ExpiresAt.IsZero() {
		expiry = timeKey(j.ExpiresAt, j.ID)
	}
	for _, a := range j.Attempts {
		if a.State == ledger.AttemptStarting {
			leases = append(leases, timeKey(a.Deadline, j.ID))
		}
	}
	return expiry, leases
}

type txn struct {
	tx     *bolt.Tx
	jobs   *bolt.Bucket
	keys   *bolt.Bucket
	expiry *bolt.Bucket
	leases *bolt.Bucket
}

func wrap(tx *bolt.Tx) txn {
	return txn{tx: tx, jobs: tx.Bucket(bucketJobs), keys: tx.Bucket(bucketKeys),
		expiry: tx.Bucket(bucketExpiry), leases: tx.Bucket(bucketLeases)}
}

func (t txn) load(id string) (*ledger.Job, error) {
	v := t.jobs.Get([]byte(id))
	if v == nil {
		return nil, nil
	}
	j, err := record.Decode(v)
	if err != nil {
		return nil, fmt.Errorf("file ledger: job %s: %w", id, err)
	}
	return j, nil
}

// put stores j, moving its index entries from those of old (nil: new).
func (t txn) put(old, j *ledger.Job) error {
	if old != nil {
		if err := t.unindex(old); err != nil {
			return err
		}
	}
	if err := t.jobs.Put([]byte(j.ID), record.Encode(j)); err != nil {
		return err
	}
	if err := t.keys.Put(identity(j.OwnerHash, j.KeyHash), []byte(j.ID)); err != nil {
		return err
	}
	exp, leases := index(j)
	if exp != nil {
		if err := t.expiry.Put(exp, nil); err != nil {
			return err
		}
	}
	for _, k := range leases {
		if err := t.leases.Put(k, nil); err != nil {
			return err
		}
	}
	return nil
}

func (t txn) unindex(j *ledger.Job) error {
	exp, leases := index(j)
	if exp != nil {
		if err := t.expiry.Delete(exp); err != nil {
			return err
		}
	}
	for _, k := range leases {
		if err := t.leases.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// remove deletes a job, its identity and its index entries.
func (t txn) remove(j *ledger.Job) error {
	if err := t.unindex(j); err != nil {
		return err
	}
	if err := t.jobs.Delete([]byte(j.ID)); err != nil {
		return err
	}
	ident := identity(j.OwnerHash, j.KeyHash)
	if bytes.Equal(t.keys.Get(ident), []byte(j.ID)) {
		return t.keys.Delete(ident)
	}
	return nil
}

// write runs fn in a read-write transaction committed with others (see
// groupCommit). fn may run more than once, so it must set its results
// afresh each time; it returns only storage errors, and keeps outcomes
// such as ErrStale in its own variables.
func (l *Ledger) write(fn func(t txn, now time.Time) error) error {
	now := l.now()
	return l.group.do(func(tx *bolt.Tx) error { return fn(wrap(tx), now) })
}

// notify wakes the waiters of the given jobs.
func (l *Ledger) notify(ids ...string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, id := range ids {
		if ch, ok := l.changed[id]; ok {
			close(ch)
			delete(l.changed, id)
		}
	}
}

// Reserve implements ledger.Ledger. Most reservations of a known key
// (replays, duplicates in flight, mismatches) change nothing: they are
// answered from a read-only transaction, without a commit.
func (l *Ledger) Reserve(_ context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	ident, at := identity(p.OwnerHash, p.KeyHash), l.now() // ident is near.Key's form too
	if j := l.completed.Get(string(ident), at); j != nil {
		if r, ok := near.Answer(j, &p, at); ok {
			return r, nil
		}
	}
	var (
		r       ledger.Reservation
		changed []string
		done    bool
	)
	err := l.db.View(func(tx *bolt.Tx) error {
		t := wrap(tx)
		id := t.keys.Get(identity(p.OwnerHash, p.KeyHash))
		if id == nil {
			return nil
		}
		j, err := t.load(string(id))
		if err != nil || j == nil {
			return err
		}
		now := l.now()
		if j.Expired(now) {
			return nil
		}
		var ch bool
		r, ch = fsm.Reserve(j, p, now)
		done = !ch
		if done && r.Outcome == ledger.Done && near.Replayable(j) {
			// Keep it for the next replays: this process is the only
			// writer of the file, and a completed job does not change
			// before it expires.
			l.completed.Put(string(ident), j, j.ExpiresAt)
		}
		return nil
	})
	if err != nil || done {
		return r, err
	}
	err = l.write(func(t txn, now time.Time) error {
		changed = nil
		var old *ledger.Job
		if id := t.keys.Get(identity(p.OwnerHash, p.KeyHash)); id != nil {
			j, err := t.load(string(id))
			if err != nil {
				return err
			}
			if j != nil && j.Expired(now) {
				if err := t.remove(j); err != nil {
					return err
				}
				changed = append(changed, j.ID)
				j = nil
			}
			old = j
		}
		if old == nil {
			j := fsm.NewJob(p, now)
			a := j.Attempts[0]
			r = ledger.Reservation{Outcome: ledger.Created, Job: j.Clone(), Attempt: &a, Now: now}
			return t.put(nil, j)
		}
		j := old.Clone()
		var ch bool
		r, ch = fsm.Reserve(j, p, now)
		if !ch {
			return nil
		}
		changed = append(changed, j.ID)
		return t.put(old, j)
	})
	if err != nil {
		return ledger.Reservation{}, err
	}
	l.notify(changed...)
	return r, nil
}

// update applies fn to one unexpired job in a batched transaction and
// stores the result. fn's error is an outcome (ErrStale, ...): the job is
// stored all the same, as the fsm records what it can.
func (l *Ledger) update(jobID string, fn func(j *ledger.Job, now time.Time) error) error {
	var outcome error
	err := l.write(func(t txn, now time.Time) error {
		outcome = nil
		old, err := t.load(jobID)
		if err != nil {
			return err
		}
		if old == nil || old.Expired(now) {
			outcome = ledger.ErrNotFound
			return nil
		}
		j := old.Clone()
		outcome = fn(j, now)
		return t.put(old, j)
	})
	if err != nil {
		return err
	}
	l.notify(jobID)
	return outcome
}

// get reads a job with leases applied, and the channel closed on its next
// change (registered before the read).
func (l *Ledger) get(jobID string) (*ledger.Job, time.Time, <-chan struct{}, error) {
	l.mu.Lock()
	ch, ok := l.changed[jobID]
	if !ok {
		ch = make(chan struct{})
		l.changed[jobID] = ch
	}
	l.mu.Unlock()
	now := l.now()
	var j *ledger.Job
	err := l.db.View(func(tx *bolt.Tx) error {
		var err error
		j, err = wrap(tx).load(jobID)
		return err
	})
	if err != nil {
		return nil, now, nil, err
	}
	if j == nil || j.Expired(now) {
		return nil, now, nil, ledger.ErrNotFound
	}
	fsm.ApplyLeases(j, now)
	return j, now, ch, nil
}

// Job implements ledger.Ledger.
func (l *Ledger) Job(_ context.Context, jobID string) (*ledger.Job, error) {
	j, now, _, err := l.get(jobID)
	if j != nil {
		j.ReadAt = now
	}
	return j, err
}

// Find implements ledger.Ledger: the keys bucket, keyed by owner and key
// together, names the job.
func (l *Ledger) Find(_ context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	now := l.now()
	var j *ledger.Job
	err := l.db.View(func(tx *bolt.Tx) error {
		t := wrap(tx)
		id := t.keys.Get(identity(ownerHash, keyHash))
		if id == nil {
			return nil
		}
		var err error
		j, err = t.load(string(id))
		return err
	})
	if err != nil {
		return nil, err
	}
	if j == nil || j.Expired(now) {
		return nil, ledger.ErrNotFound
	}
	fsm.ApplyLeases(j, now)
	j.ReadAt = now
	return j, nil
}

// Wait implements ledger.Ledger.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	return ledger.WaitSettled(ctx, func() (*ledger.Job, time.Time, <-chan struct{}, error) {
		return l.get(jobID)
	})
}

// Jobs implements ledger.Ledger: a walk of the jobs bucket from the newest
// (or from the cursor) backwards.
func (l *Ledger) Jobs(_ context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	limit := ledger.EffectiveLimit(q.Limit)
	now := l.now()
	var page ledger.JobPage
	err := l.db.View(func(tx *bolt.Tx) error {
		c := wrap(tx).jobs.Cursor()
		var k, v []byte
		if q.Before != "" {
			k, v = c.Seek([]byte(q.Before))
			if k == nil {
				k, v = c.Last()
			}
			for k != nil && bytes.Compare(k, []byte(q.Before)) >= 0 {
				k, v = c.Prev()
			}
		} else {
			k, v = c.Last()
		}
		for ; k != nil; k, v = c.Prev() {
			j, err := record.Decode(v)
			if err != nil {
				return fmt.Errorf("file ledger: job %s: %w", k, err)
			}
			if j.Expired(now) {
				continue
			}
			fsm.ApplyLeases(j, now)
			if !fsm.Matches(j, q) {
				continue
			}
			if len(page.Jobs) == limit {
				page.Next = page.Jobs[limit-1].ID
				return nil
			}
			page.Jobs = append(page.Jobs, j)
		}
		return nil
	})
	return page, err
}

// Sweep implements ledger.Ledger.
func (l *Ledger) Sweep(_ context.Context, limit int) (ledger.SweepStats, error) {
	var (
		st      ledger.SweepStats
		changed []string
	)
	err := l.db.Update(func(tx *bolt.Tx) error {
		st, changed = ledger.SweepStats{}, nil
		t := wrap(tx)
		now := l.now()
		due := func(b *bolt.Bucket) (ids []string) {
			c := b.Cursor()
			for k, _ := c.First(); k != nil && len(ids) < limit; k, _ = c.Next() {
				if int64(binary.BigEndian.Uint64(k[:8])) > now.UnixNano() {
					break
				}
				if id := string(k[8:]); !slices.Contains(ids, id) {
					ids = append(ids, id)
				}
			}
			return ids
		}
		for _, id := range due(t.leases) {
			old, err := t.load(id)
			if err != nil || old == nil {
				return err
			}
			j := old.Clone()
			if n := fsm.ApplyLeases(j, now); n > 0 {
				st.Unknown += n
				changed = append(changed, id)
				if err := t.put(old, j); err != nil {
					return err
				}
			}
		}
		for _, id := range due(t.expiry) {
			j, err := t.load(id)
			if err != nil {
				return err
			}
			if j == nil || !j.Expired(now) {
				continue
			}
			if err := t.remove(j); err != nil {
				return err
			}
			st.Removed++
			changed = append(changed, id)
		}
		return nil
	})
	l.notify(changed...)
	return st, err
}

var _ ledger.Ledger = (*Ledger)(nil)
