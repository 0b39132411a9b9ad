// Package memory is a Ledger held in process memory: for tests and demos.
// Nothing survives a restart.
package memory

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// Ledger is an in-memory ledger. The zero value is not usable: call New.
type Ledger struct {
	now func() time.Time

	mu    sync.Mutex
	byKey map[string]*entry // owner hash + key hash
	byID  map[string]*entry
}

type entry struct {
	job     *ledger.Job
	changed chan struct{} // closed and replaced on every change
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
		now:   time.Now,
		byKey: make(map[string]*entry),
		byID:  make(map[string]*entry),
	}
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

// notify wakes the job's waiters. l.mu must be held.
func (e *entry) notify() {
	close(e.changed)
	e.changed = make(chan struct{})
}

// Reserve implements ledger.Ledger.
func (l *Ledger) Reserve(_ context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	now := l.now()
	id := identity(p.OwnerHash, p.KeyHash)
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byKey[id]
	if e != nil && e.job.Expired(now) {
		l.remove(e)
		e = nil
	}
	if e == nil {
		j := fsm.NewJob(p, now)
		e = &entry{job: j, changed: make(chan struct{})}
		l.byKey[id] = e
		l.byID[j.ID] = e
		a := j.Attempts[0]
		return ledger.Reservation{Outcome: ledger.Created, Job: j.Clone(), Attempt: &a, Now: now}, nil
	}
	r, changed := fsm.Reserve(e.job, p, now)
	if changed {
		e.notify()
	}
	return r, nil
}

// remove deletes the entry and wakes its waiters. l.mu must be held.
func (l *Ledger) remove(e *entry) {
	delete(l.byKey, identity(e.job.OwnerHash, e.job.KeyHash))
	delete(l.byID, e.job.ID)
	e.notify()
}

// update runs fn on the job under the lock and wakes waiters.
func (l *Ledger) update(jobID string, fn func(j *ledger.Job, now time.Time) error) error {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID[jobID]
	if e == nil || e.job.Expired(now) {
		return ledger.ErrNotFound
	}
	err := fn(e.job, now)
	e.notify()
	return err
}

// Hedge implements ledger.Ledger.
func (l *Ledger) Hedge(_ context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (a ledger.Attempt, err error) {
	err = l.update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		a, err = fsm.Hedge(j, ref, next, now)
		return err
	})
	return a, err
}

// Resend implements ledger.Ledger.
func (l *Ledger) Resend(_ context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (a ledger.Attempt, err error) {
	err = l.update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		a, err = fsm.Resend(j, ref, next, now)
		return err
	})
	return a, err
}

// Complete implements ledger.Ledger.
func (l *Ledger) Complete(_ context.Context, ref ledger.AttemptRef, resp ledger.Response) (c ledger.Completion, err error) {
	err = l.update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		c, err = fsm.Complete(j, ref, resp, now)
		return err
	})
	return c, err
}

// SaveBody implements ledger.Ledger.
func (l *Ledger) SaveBody(_ context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	return l.update(ref.JobID, func(j *ledger.Job, _ time.Time) error {
		return fsm.SaveBody(j, ref, body, size, stored)
	})
}

// Fail implements ledger.Ledger.
func (l *Ledger) Fail(_ context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (a *ledger.Attempt, err error) {
	err = l.update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		a, err = fsm.Fail(j, ref, reason, next, now)
		return err
	})
	return a, err
}

// Unsent implements ledger.Ledger.
func (l *Ledger) Unsent(_ context.Context, ref ledger.AttemptRef) error {
	return l.update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		return fsm.Unsent(j, ref, now)
	})
}

// MarkUnknown implements ledger.Ledger.
func (l *Ledger) MarkUnknown(_ context.Context, ref ledger.AttemptRef, reason string) error {
	return l.update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		return fsm.MarkUnknown(j, ref, reason, now)
	})
}

// ClaimLookup implements ledger.Ledger.
func (l *Ledger) ClaimLookup(_ context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	return l.updated(ref.JobID, func(job *ledger.Job, now time.Time) error { return fsm.ClaimLookup(job, ref, holder, lease, now) })
}

// SettleLookup implements ledger.Ledger.
func (l *Ledger) SettleLookup(_ context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	return l.updated(ref.JobID, func(job *ledger.Job, now time.Time) error { return fsm.SettleLookup(job, ref, holder, r, now) })
}

// Resolve implements ledger.Ledger.
func (l *Ledger) Resolve(_ context.Context, jobID string, r ledger.Resolution) (*ledger.Job, error) {
	return l.updated(jobID, func(job *ledger.Job, now time.Time) error { return fsm.Resolve(job, r, now) })
}

// updated applies fn with update and returns a copy of the job as fn left
// it, or fn's error (and no job).
func (l *Ledger) updated(jobID string, fn func(j *ledger.Job, now time.Time) error) (j *ledger.Job, err error) {
	err = l.update(jobID, func(job *ledger.Job, now time.Time) error {
		j = nil
		if e := fn(job, now); e != nil {
			return e
		}
		j = job.Clone()
		return nil
	})
	return j, err
}

// get returns a snapshot of the job with leases applied, and the channel
// that is closed on its next change.
func (l *Ledger) get(jobID string) (*ledger.Job, <-chan struct{}, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID[jobID]
	if e == nil || e.job.Expired(now) {
		return nil, nil, ledger.ErrNotFound
	}
	if fsm.ApplyLeases(e.job, now) > 0 {
		e.notify()
	}
	return e.job.Clone(), e.changed, nil
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
	if e == nil || e.job.Expired(now) {
		return nil, ledger.ErrNotFound
	}
	if fsm.ApplyLeases(e.job, now) > 0 {
		e.notify()
	}
	j := e.job.Clone()
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
		if e.job.Expired(now) || (q.Before != "" && e.job.ID >= q.Before) {
			continue
		}
		fsm.ApplyLeases(e.job, now)
		if fsm.Matches(e.job, q) {
			jobs = append(jobs, e.job.Clone())
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
		if e.job.Expired(now) {
			if st.Removed < limit {
				l.remove(e)
				st.Removed++
			}
			continue
		}
		if n := fsm.ApplyLeases(e.job, now); n > 0 {
			st.Unknown += n
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
