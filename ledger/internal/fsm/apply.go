package fsm

import (
	"context"
	"time"

	"github.com/onejob/onejob/ledger"
)

// Applier is every transition of ledger.Ledger but Reserve, for a backend
// that applies the rules of this package in Go (memory, file): embedded in
// the backend's Ledger, it gives each transition over the backend's one
// Update.
//
// Update runs fn on the unexpired job jobID under the backend's isolation,
// stores what fn left and wakes the job's waiters; it returns ErrNotFound
// when there is no such job, else fn's error, an outcome (ErrStale, ...)
// with the job stored all the same. fn may run more than once (a backend
// that retries a group commit), so each closure here sets its results
// afresh.
type Applier struct {
	Update func(jobID string, fn func(j *ledger.Job, now time.Time) error) error
}

// Hedge implements ledger.Ledger.
func (x Applier) Hedge(_ context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return apply(x, ref.JobID, func(j *ledger.Job, now time.Time) (ledger.Attempt, error) { return Hedge(j, ref, next, now) })
}

// Resend implements ledger.Ledger.
func (x Applier) Resend(_ context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return apply(x, ref.JobID, func(j *ledger.Job, now time.Time) (ledger.Attempt, error) { return Resend(j, ref, next, now) })
}

// Complete implements ledger.Ledger.
func (x Applier) Complete(_ context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	return apply(x, ref.JobID, func(j *ledger.Job, now time.Time) (ledger.Completion, error) { return Complete(j, ref, resp, now) })
}

// SaveBody implements ledger.Ledger.
func (x Applier) SaveBody(_ context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	return x.Update(ref.JobID, func(j *ledger.Job, _ time.Time) error {
		return SaveBody(j, ref, body, size, stored)
	})
}

// Fail implements ledger.Ledger.
func (x Applier) Fail(_ context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	return apply(x, ref.JobID, func(j *ledger.Job, now time.Time) (*ledger.Attempt, error) { return Fail(j, ref, reason, next, now) })
}

// Unsent implements ledger.Ledger.
func (x Applier) Unsent(_ context.Context, ref ledger.AttemptRef) error {
	return x.Update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		return Unsent(j, ref, now)
	})
}

// MarkUnknown implements ledger.Ledger.
func (x Applier) MarkUnknown(_ context.Context, ref ledger.AttemptRef, reason string) error {
	return x.Update(ref.JobID, func(j *ledger.Job, now time.Time) error {
		return MarkUnknown(j, ref, reason, now)
	})
}

// ClaimLookup implements ledger.Ledger.
func (x Applier) ClaimLookup(_ context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	return x.updated(ref.JobID, func(j *ledger.Job, now time.Time) error { return ClaimLookup(j, ref, holder, lease, now) })
}

// SettleLookup implements ledger.Ledger.
func (x Applier) SettleLookup(_ context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	return x.updated(ref.JobID, func(j *ledger.Job, now time.Time) error { return SettleLookup(j, ref, holder, r, now) })
}

// Resolve implements ledger.Ledger.
func (x Applier) Resolve(_ context.Context, jobID string, r ledger.Resolution) (*ledger.Job, error) {
	return x.updated(jobID, func(j *ledger.Job, now time.Time) error { return Resolve(j, r, now) })
}

// updated applies fn with Update and returns a copy of the job as fn left
// it, or fn's error (and no job).
func (x Applier) updated(jobID string, fn func(j *ledger.Job, now time.Time) error) (*ledger.Job, error) {
	return apply(x, jobID, func(j *ledger.Job, now time.Time) (*ledger.Job, error) {
		if err := fn(j, now); err != nil {
			return nil, err
		}
		return j.Clone(), nil
	})
}

// apply runs a transition that has a result with x.Update, and returns
// the result of its last run (zero when there is no such job).
func apply[T any](x Applier, jobID string, fn func(j *ledger.Job, now time.Time) (T, error)) (v T, err error) {
	err = x.Update(jobID, func(j *ledger.Job, now time.Time) error {
		var e error
		v, e = fn(j, now)
		return e
	})
	return v, err
}
