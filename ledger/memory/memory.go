// Package memory is a Ledger held in process memory: for tests and demos.
// Nothing survives a restart.
package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/record"
)

// Ledger is an in-memory ledger. The zero value is not usable: call New.
type Ledger struct {
	fsm.Applier // the transitions of one job, over update

	now func() time.Time

	mu      sync.Mutex
	byKey   map[string]*entry // owner hash + key hash
	byID    map[string]*entry
	replays *near.Cache // settled jobs replayed lately, decoded, by identity
}

// entry is one job. A job that may still change is held as itself; once
// it settles (completed, its answer stored, no attempt in flight: how
// nearly every job spends its retention) it is held as its record, one
// slice with no pointers in it, which the garbage collector does not scan.
// A transition that changes a settled job (a lookup marking a late attempt
// lost, say) decodes it and stores it again.
type entry struct {
	key, id   string // the maps' keys
	expiresAt int64  // Unix nanoseconds; 0: no expiry yet
	job       *ledger.Job
	packed    []byte        // the job's record when job is nil
	changed   chan struct{} // made for the first waiter, closed on the next change
}

// load returns the entry's job, decoded when it is settled: a caller that
// changes it calls store.
func (e *entry) load() (*ledger.Job, error) {
	if e.job != nil {
		return e.job, nil
	}
	j, err := record.Decode(e.packed)
	if err != nil {
		return nil, fmt.Errorf("memory ledger: job %s: %w", e.id, err)
	}
	return j, nil
}

// store keeps j as the entry's job, packed when it is settled.
func (e *entry) store(j *ledger.Job) {
	e.expiresAt = 0
	if !j.ExpiresAt.IsZero() {
		e.expiresAt = j.ExpiresAt.UnixNano()
	}
	if settled(j) {
		e.job, e.packed = nil, record.Encode(j)
	} else {
		e.job, e.packed = j, nil
	}
}

// settled reports whether j changes only by a transition: it is completed
// with its answer stored and no attempt is starting, so no lease can run out.
func settled(j *ledger.Job) bool {
	if !near.Replayable(j) {
		return false
	}
	for i := range j.Attempts {
		if j.Attempts[i].State == ledger.AttemptStarting {
			return false
		}
	}
	return true
}

// expired is the job's Expired, read without decoding it.
func (e *entry) expired(now time.Time) bool {
	return e.expiresAt != 0 && now.UnixNano() >= e.expiresAt
}

// wait returns the channel closed on the job's next change.
func (e *entry) wait() <-chan struct{} {
	if e.changed == nil {
		e.changed = make(chan struct{})
	}
	return e.changed
}

// notify wakes the job's waiters. l.mu must be held.
func (e *entry) notify() {
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// Option configures a Ledger.
type Option func(*Ledger)

// WithClock sets the ledger's clock, by which deadlines and expiry are
// judged. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(l *Ledger) { l.now = now }
}

// New returns an empty in-memory ledger.
func New(opts ...Option) *Ledger {
	l := &Ledger{
		now:     time.Now,
		byKey:   make(map[string]*entry),
		byID:    make(map[string]*entry),
		replays: near.New(10000, 64<<20),
	}
	l.Applier = fsm.Applier{Update: l.update}
	for _, o := range opts {
		o(l)
	}
	return l
}

func identity(owner, key []byte) string {
	var b strings.Builder
	b.Grow(len(owner) + len(key) + 1)
	b.Write(owner)
	b.WriteByte(0)
	b.Write(key)
	return b.String()
}

// Reserve implements ledger.Ledger.
func (l *Ledger) Reserve(_ context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	now := l.now()
	id := identity(p.OwnerHash, p.KeyHash)
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byKey[id]
	if e != nil && e.expired(now) {
		l.remove(e)
		e = nil
	}
	if e == nil {
		j := fsm.NewJob(p, now)
		e = &entry{key: id, id: j.ID}
		e.store(j)
		l.byKey[id] = e
		l.byID[j.ID] = e
		a := j.Attempts[0]
		return ledger.Reservation{Outcome: ledger.Created, Job: j.Clone(), Attempt: &a, Now: now}, nil
	}
	if e.job == nil {
		// Settled: a replay, answered from the jobs replayed lately when
		// it is one of them.
		if j := l.replays.Get(id, now); j != nil {
			if r, ok := near.Answer(j, &p, now); ok {
				return r, nil
			}
		}
	}
	j, err := e.load()
	if err != nil {
		return ledger.Reservation{}, err
	}
	r, changed := fsm.Reserve(j, p, now)
	switch {
	case changed:
		e.store(j)
		e.notify()
	case r.Outcome == ledger.Done && e.job == nil:
		l.replays.Put(id, j, j.ExpiresAt)
	}
	return r, nil
}

// remove deletes the entry and wakes its waiters. l.mu must be held.
func (l *Ledger) remove(e *entry) {
	delete(l.byKey, e.key)
	delete(l.byID, e.id)
	l.replays.Forget(e.key)
	e.notify()
}

// update runs fn on the job under the lock, stores what fn left and wakes
// waiters.
func (l *Ledger) update(jobID string, fn func(j *ledger.Job, now time.Time) error) error {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID[jobID]
	if e == nil || e.expired(now) {
		return ledger.ErrNotFound
	}
	if e.job == nil {
		l.replays.Forget(e.key) // the copy replays read would be older
	}
	j, err := e.load()
	if err != nil {
		return err
	}
	err = fn(j, now)
	e.store(j)
	e.notify()
	return err
}

// current returns the entry's job with leases applied (waking its
// waiters when one ran out), for a read; the job may be the entry's own.
// l.mu must be held.
func (e *entry) current(now time.Time) (*ledger.Job, error) {
	j, err := e.load()
	if err != nil {
		return nil, err
	}
	if e.job != nil && fsm.ApplyLeases(j, now) > 0 {
		e.store(j)
		e.notify()
	}
	return j, nil
}

// get returns a snapshot of the job with leases applied, and the channel
// that is closed on its next change.
func (l *Ledger) get(jobID string) (*ledger.Job, <-chan struct{}, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID[jobID]
	if e == nil || e.expired(now) {
		return nil, nil, ledger.ErrNotFound
	}
	j, err := e.current(now)
	if err != nil {
		return nil, nil, err
	}
	return snapshot(e, j), e.wait(), nil
}

// snapshot returns j, the job of e, as a copy the caller may keep: a job
// decoded for the read is one already.
func snapshot(e *entry, j *ledger.Job) *ledger.Job {
	if j == e.job {
		return j.Clone()
	}
	return j
}

// Job implements ledger.Ledger.
func (l *Ledger) Job(_ context.Context, jobID string) (*ledger.Job, error) {
	now := l.now()
	j, _, err := l.get(jobID)
	if j != nil {
		j.ReadAt = now
	}
	return j, err
}

// Find implements ledger.Ledger.
func (l *Ledger) Find(_ context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byKey[identity(ownerHash, keyHash)]
	if e == nil || e.expired(now) {
		return nil, ledger.ErrNotFound
	}
	j, err := e.current(now)
	if err != nil {
		return nil, err
	}
	j = snapshot(e, j)
	j.ReadAt = now
	return j, nil
}

// Jobs implements ledger.Ledger.
func (l *Ledger) Jobs(_ context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	limit := ledger.EffectiveLimit(q.Limit)
	now := l.now()
	l.mu.Lock()
	var jobs []*ledger.Job
	for _, e := range l.byID {
		if e.expired(now) || (q.Before != "" && e.id >= q.Before) {
			continue
		}
		j, err := e.current(now)
		if err != nil {
			l.mu.Unlock()
			return ledger.JobPage{}, err
		}
		if fsm.Matches(j, q) {
			jobs = append(jobs, snapshot(e, j))
		}
	}
	l.mu.Unlock()
	slices.SortFunc(jobs, func(a, b *ledger.Job) int { return strings.Compare(b.ID, a.ID) })
	var page ledger.JobPage
	if len(jobs) > limit {
		jobs = jobs[:limit]
		page.Next = jobs[limit-1].ID
	}
	page.Jobs = jobs
	return page, nil
}

// Wait implements ledger.Ledger.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	return ledger.WaitSettled(ctx, func() (*ledger.Job, time.Time, <-chan struct{}, error) {
		j, changed, err := l.get(jobID)
		return j, l.now(), changed, err
	})
}

// Sweep implements ledger.Ledger.
func (l *Ledger) Sweep(_ context.Context, limit int) (ledger.SweepStats, error) {
	var st ledger.SweepStats
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.byID {
		if e.expired(now) {
			if st.Removed < limit {
				l.remove(e)
				st.Removed++
			}
			continue
		}
		if e.job == nil {
			continue // settled: no lease to run out
		}
		if n := fsm.ApplyLeases(e.job, now); n > 0 {
			st.Unknown += n
			e.store(e.job)
			e.notify()
		}
	}
	return st, nil
}

// Close implements ledger.Ledger.
func (l *Ledger) Close() error { return nil }

// Len returns the number of jobs held, expired or not.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.byID)
}

var _ ledger.Ledger = (*Ledger)(nil)
