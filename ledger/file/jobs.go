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
	return l.users.Done, nil
}

// load reads the job jobID: nil when there is none.
func (l *Ledger) load(jobID string) (*ledger.Job, error) {
	j, _, err := l.loadRecord(jobID)
	return j, err
}

// loadRecord reads the job jobID and its record: nil when there is none.
func (l *Ledger) loadRecord(jobID string) (*ledger.Job, []byte, error) {
	v, closer, err := l.db.Get(jobKey(jobID))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("file ledger: %w", err)
	}
	rec := bytes.Clone(v) // a decoded job may share its record
	closer.Close()
	j, err := record.Decode(rec)
	if err != nil {
		return nil, nil, fmt.Errorf("file ledger: job %s: %w", jobID, err)
	}
	return j, rec, nil
}

// named returns the id of the job of an owner's key (identityKey), "" when
// there is none.
func (l *Ledger) named(identity []byte) (string, error) {
	v, closer, err := l.db.Get(identity)
	if errors.Is(err, pebble.ErrNotFound) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("file ledger: %w", err)
	}
	defer closer.Close()
	return string(v), nil
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

// put writes j, whose indexes had shape before, to b.
func put(b *pebble.Batch, j *ledger.Job, before shape) {
	b.Set(jobKey(j.ID), record.Encode(j), nil)
	reindex(b, j.ID, before, shapeOf(j))
}

// remove writes the removal of j to b: its record, its index entries, and
// its key when the key still names it (named).
func remove(b *pebble.Batch, j *ledger.Job, named string) {
	b.Delete(jobKey(j.ID), nil)
	reindex(b, j.ID, shapeOf(j), shape{})
	if named == j.ID {
		b.Delete(identityKey(j.OwnerHash, j.KeyHash), nil)
	}
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
	key := l.keys.of(string(identity))
	key.Lock()
	defer key.Unlock()
	now := l.now()
	if j := l.replays.Get(cached, now); j != nil {
		if r, ok := near.Answer(j, &p, now); ok {
			return r, nil
		}
	}
	id, err := l.named(identity)
	if err != nil {
		return ledger.Reservation{}, err
	}
	b := l.db.NewBatch()
	if id != "" {
		job := l.jobs.of(id)
		job.Lock()
		defer job.Unlock()
		j, err := l.load(id)
		if err != nil {
			b.Close()
			return ledger.Reservation{}, err
		}
		switch {
		case j != nil && j.Expired(now):
			remove(b, j, id) // and a new job takes its key, below
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
			put(b, j, before)
			if err := write(b); err != nil {
				return ledger.Reservation{}, err
			}
			l.waiters.Wake(id)
			return r, nil
		}
	}
	j := fsm.NewJob(p, now)
	put(b, j, shape{})
	b.Set(identity, []byte(j.ID), nil)
	if err := write(b); err != nil {
		return ledger.Reservation{}, err
	}
	if id != "" {
		l.waiters.Wake(id) // an expired job, gone
	}
	a := j.Attempts[0]
	return ledger.Reservation{Outcome: ledger.Created, Job: j, Attempt: &a, Now: now}, nil
}

// update runs fn on the unexpired job jobID under its lock, stores what fn
// left, whatever fn returned, and wakes the job's waiters (fsm.Applier).
func (l *Ledger) update(jobID string, fn func(j *ledger.Job, now time.Time) error) error {
	done, err := l.open()
	if err != nil {
		return err
	}
	defer done()
	job := l.jobs.of(jobID)
	job.Lock()
	defer job.Unlock()
	// Read under the lock: transitions happen in the clock's order, so a
	// repeat's time (Completion.Job.ReadAt) is never before the state it
	// returns.
	now := l.now()
	j, old, err := l.loadRecord(jobID)
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
		b.Set(jobKey(j.ID), rec, nil)
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
	id, err := l.named(identityKey(ownerHash, keyHash))
	if err != nil {
		return nil, err
	}
	if id == "" {
		return nil, ledger.ErrNotFound
	}
	j, err := l.current(id, now)
	if err != nil {
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
