package file

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/record"
	"github.com/onejob/onejob/ledger/notify"
)

// errClosed is what a call on a closed ledger returns.
var errClosed = errors.New("file ledger: closed")

// open holds off Close while a call uses the database; the call runs done
// when it is finished with it.
func (l *Ledger) open() (done func(), err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errClosed
	}
	l.users.Add(1)
	l.mu.Unlock()
	if !l.used.Load() { // a read of a shared line, not a write, on most calls
		l.used.Store(true)
	}
	return l.users.Done, nil
}

// load reads the job jobID: nil when there is none.
func (l *Ledger) load(jobID string) (*ledger.Job, error) {
	identity, err := l.identity(jobID)
	if err != nil || identity == nil {
		return nil, err
	}
	j, _, err := l.read(identity, jobID)
	return j, err
}

// identity returns the identity key of the job jobID (j<id>), nil when
// there is no such job.
func (l *Ledger) identity(jobID string) ([]byte, error) {
	v, closer, err := l.db.Get(jobKey(jobID))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

// lockJob takes the lock of the key of job jobID (a job's key never
// changes), as every transition of the job does, and returns the key and
// the lock's unlock; a nil key when there is no such job, nothing locked.
func (l *Ledger) lockJob(jobID string) (identity []byte, unlock func(), err error) {
	identity, err = l.identity(jobID)
	if err != nil || identity == nil {
		return nil, nil, err
	}
	lock := l.locks.of(string(identity))
	lock.Lock()
	return identity, lock.Unlock, nil
}

// read reads the job of an owner's key (identity) and its record: nil
// when there is none, or when jobID is not "" and the key's job is
// another.
func (l *Ledger) read(identity []byte, jobID string) (*ledger.Job, []byte, error) {
	rec, err := l.lookup(identity)
	if rec == nil || err != nil {
		return nil, nil, err
	}
	j, err := record.Decode(rec)
	if err != nil {
		return nil, nil, fmt.Errorf("file ledger: the job of key %x: %w", identity, err)
	}
	if jobID != "" && j.ID != jobID {
		return nil, nil, nil
	}
	return j, rec, nil
}

// lookup returns a copy of the record of an owner's key (identity), nil
// when there is none. Most keys looked up are fresh ones (a reservation's),
// which no table holds, and most tables are on the last level: Pebble's
// Get reads no Bloom filter there, so it would read a table's index and
// data block to find nothing — at millions of jobs, blocks out of the cache
// and often out of the page cache. An iterator reads the last level's
// filters when asked to, and is told so.
func (l *Ledger) lookup(identity []byte) ([]byte, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{UseL6Filters: true})
	if err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	defer it.Close() // what it read is copied, or its error returned, before
	if !it.SeekPrefixGE(identity) || !bytes.Equal(it.Key(), identity) {
		if err := it.Error(); err != nil {
			return nil, fmt.Errorf("file ledger: %w", err)
		}
		return nil, nil
	}
	v, err := it.ValueAndErr()
	if err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	return bytes.Clone(v), nil // a decoded job may share its record
}

// write commits b, durably: its changes are visible only once they are on
// disk.
func write(b *pebble.Batch) error {
	defer b.Close()
	if err := b.Commit(pebble.Sync); err != nil {
		return fmt.Errorf("file ledger: %w", err)
	}
	return nil
}

// create writes to b the new job j of an owner's key (identity): its
// record, its id's entry, and its index entries.
func create(b *pebble.Batch, identity []byte, j *ledger.Job) {
	b.Set(jobKey(j.ID), identity, nil)
	put(b, identity, j, shape{})
}

// put writes j, the job of identity, whose indexes had shape before, to b.
func put(b *pebble.Batch, identity []byte, j *ledger.Job, before shape) {
	b.Set(identity, record.Encode(j), nil)
	reindex(b, j.ID, before, shapeOf(j))
}

// remove writes the removal of j, the job of identity, to b: its record,
// its id's entry and its index entries.
func remove(b *pebble.Batch, identity []byte, j *ledger.Job) {
	b.Delete(identity, nil)
	b.Delete(jobKey(j.ID), nil)
	reindex(b, j.ID, shapeOf(j), shape{})
}

// Reserve implements ledger.Ledger.
func (l *Ledger) Reserve(_ context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	done, err := l.open()
	if err != nil {
		return ledger.Reservation{}, err
	}
	defer done()
	identity := identityKey(p.OwnerHash, p.KeyHash)
	cached := near.Key(p.OwnerHash, p.KeyHash)
	lock := l.locks.of(string(identity))
	lock.Lock()
	defer lock.Unlock()
	now := l.now()
	if j := l.replays.Get(cached, now); j != nil {
		if r, ok := near.Answer(j, &p, now); ok {
			return r, nil
		}
	}
	j, _, err := l.read(identity, "")
	if err != nil {
		return ledger.Reservation{}, err
	}
	b := l.db.NewBatch()
	switch {
	case j != nil && j.Expired(now):
		remove(b, identity, j) // and a new job takes its key, below
		l.replays.Forget(cached)
	case j != nil:
		gen := l.replays.Gen()
		before := shapeOf(j)
		r, changed := fsm.Reserve(j, p, now)
		if !changed {
			b.Close()
			if r.Outcome == ledger.Done && fsm.AtRest(j) {
				l.replays.Put(cached, j, j.ExpiresAt, gen)
			}
			return r, nil
		}
		put(b, identity, j, before)
		if err := write(b); err != nil {
			return ledger.Reservation{}, err
		}
		l.waiters.Wake(j.ID)
		return r, nil
	}
	gone := j
	j = fsm.NewJob(p, now)
	create(b, identity, j)
	if err := write(b); err != nil {
		return ledger.Reservation{}, err
	}
	if gone != nil {
		l.waiters.Wake(gone.ID) // an expired job, gone
	}
	a := j.Attempts[0]
	return ledger.Reservation{Outcome: ledger.Created, Job: j, Attempt: &a, Now: now}, nil
}

// update runs fn on the unexpired job jobID under its key's lock, stores
// what fn left, whatever fn returned, and wakes the job's waiters
// (fsm.Applier).
func (l *Ledger) update(jobID string, fn func(j *ledger.Job, now time.Time) error) error {
	done, err := l.open()
	if err != nil {
		return err
	}
	defer done()
	identity, unlock, err := l.lockJob(jobID)
	if err != nil {
		return err
	}
	if identity == nil {
		return ledger.ErrNotFound
	}
	defer unlock()
	// Read under the lock: transitions happen in the clock's order, so a
	// repeat's time (Completion.Job.ReadAt) is never before the state it
	// returns.
	now := l.now()
	j, old, err := l.read(identity, jobID)
	if err != nil {
		return err
	}
	if j == nil || j.Expired(now) {
		return ledger.ErrNotFound
	}
	before := shapeOf(j)
	l.replays.Forget(near.Key(j.OwnerHash, j.KeyHash)) // the copy replays read would be older
	outcome := fn(j, now)
	if rec := record.Encode(j); !bytes.Equal(rec, old) {
		b := l.db.NewBatch()
		b.Set(identity, rec, nil)
		reindex(b, j.ID, before, shapeOf(j))
		if err := write(b); err != nil {
			return err
		}
		l.waiters.Wake(jobID)
	}
	return outcome
}

// current returns the unexpired job jobID with its leases applied, or
// ErrNotFound.
func (l *Ledger) current(jobID string, now time.Time) (*ledger.Job, error) {
	j, err := l.load(jobID)
	if err != nil {
		return nil, err
	}
	return live(j, now)
}

// live returns j, read at now, with its leases applied; ErrNotFound when
// it is nil or its retention ended.
func live(j *ledger.Job, now time.Time) (*ledger.Job, error) {
	if j == nil || j.Expired(now) {
		return nil, ledger.ErrNotFound
	}
	fsm.ApplyLeases(j, now)
	return j, nil
}

// Job implements ledger.Ledger.
func (l *Ledger) Job(_ context.Context, jobID string) (*ledger.Job, error) {
	done, err := l.open()
	if err != nil {
		return nil, err
	}
	defer done()
	now := l.now()
	j, err := l.current(jobID, now)
	if err != nil {
		return nil, err
	}
	j.ReadAt = now
	return j, nil
}

// Find implements ledger.Ledger.
func (l *Ledger) Find(_ context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	done, err := l.open()
	if err != nil {
		return nil, err
	}
	defer done()
	now := l.now()
	j, _, err := l.read(identityKey(ownerHash, keyHash), "")
	if err != nil {
		return nil, err
	}
	if j, err = live(j, now); err != nil {
		return nil, err
	}
	j.ReadAt = now
	return j, nil
}

// Wait implements ledger.Ledger.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	changed, cancel := l.waiters.Register(jobID) // before the first read
	defer cancel()
	return notify.WaitSettled(ctx, func() (*ledger.Job, time.Time, <-chan struct{}, error) {
		done, err := l.open()
		if err != nil {
			return nil, time.Time{}, nil, err
		}
		defer done()
		now := l.now()
		j, err := l.current(jobID, now)
		return j, now, changed, err
	})
}

// Jobs implements ledger.Ledger. Jobs of every state, or completed ones,
// are read from the newest id down; jobs of another state only from the
// jobs not at rest (o), the only ones that can be in it.
func (l *Ledger) Jobs(_ context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	done, err := l.open()
	if err != nil {
		return ledger.JobPage{}, err
	}
	defer done()
	limit := ledger.EffectiveLimit(q.Limit)
	now := l.now()
	var page ledger.JobPage
	take := func(id string) (bool, error) {
		if q.Before != "" && id >= q.Before {
			return true, nil
		}
		j, err := l.current(id, now)
		if errors.Is(err, ledger.ErrNotFound) {
			return true, nil // removed since
		}
		if err != nil || !fsm.Matches(j, q) {
			return err == nil, err
		}
		if len(page.Jobs) == limit {
			page.Next = page.Jobs[limit-1].ID
			return false, nil
		}
		page.Jobs = append(page.Jobs, j)
		return true, nil
	}
	if q.State == "" || q.State == ledger.JobCompleted {
		it, err := l.db.NewIter(prefixBounds(prefixJob))
		if err != nil {
			return ledger.JobPage{}, fmt.Errorf("file ledger: %w", err)
		}
		defer it.Close()
		ok := it.Last()
		if q.Before != "" {
			ok = it.SeekLT(jobKey(q.Before))
		}
		for ; ok; ok = it.Prev() {
			more, err := take(string(it.Key()[1:]))
			if err != nil || !more {
				return page, err
			}
		}
		return page, it.Error()
	}
	ids, err := l.openIDs()
	if err != nil {
		return ledger.JobPage{}, err
	}
	slices.SortFunc(ids, func(a, b string) int { return strings.Compare(b, a) })
	for _, id := range ids {
		more, err := take(id)
		if err != nil || !more {
			return page, err
		}
	}
	return page, nil
}

// openIDs returns the ids of the jobs not at rest.
func (l *Ledger) openIDs() ([]string, error) {
	it, err := l.db.NewIter(prefixBounds(prefixOpen))
	if err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	defer it.Close()
	var ids []string
	for ok := it.First(); ok; ok = it.Next() {
		ids = append(ids, string(it.Key()[1:]))
	}
	return ids, it.Error()
}
