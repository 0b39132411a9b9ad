// Package fsm holds the job and attempt transitions of SPEC section 1 as pure
// functions over an in-memory job. Backends that keep whole jobs in one
// place (memory, file) apply them under their own lock or transaction; the
// SQL and Lua backends implement the same rules in their own language, and
// ledgertest holds them all to one behaviour.
package fsm

import (
	"bytes"
	"time"

	"github.com/onejob/onejob/ledger"
)

// NewJob returns a new pending job for p with attempt 1 starting.
func NewJob(p ledger.ReserveParams, now time.Time) *ledger.Job {
	j := &ledger.Job{
		ID:                 ledger.NewID(),
		OwnerHash:          bytes.Clone(p.OwnerHash),
		KeyHash:            bytes.Clone(p.KeyHash),
		Fingerprint:        bytes.Clone(p.Fingerprint),
		FingerprintVersion: p.FingerprintVersion,
		State:              ledger.JobPending,
		Version:            1,
		Retention:          p.Retention,
		CreatedAt:          now,
	}
	addAttempt(j, p.Attempt, now)
	return j
}

func addAttempt(j *ledger.Job, next ledger.NextAttempt, now time.Time) *ledger.Attempt {
	j.Attempts = append(j.Attempts, ledger.Attempt{
		ID:         ledger.NewID(),
		JobID:      j.ID,
		Number:     len(j.Attempts) + 1,
		Provider:   next.Provider,
		State:      ledger.AttemptStarting,
		JobVersion: j.Version,
		StartedAt:  now,
		Deadline:   now.Add(next.Lease),
	})
	return &j.Attempts[len(j.Attempts)-1]
}

// ApplyLeases records every starting attempt whose deadline passed as
// unknown, and the job as unknown when nothing else can settle it. It
// reports how many attempts changed.
func ApplyLeases(j *ledger.Job, now time.Time) int {
	n := 0
	for i := range j.Attempts {
		a := &j.Attempts[i]
		if a.State == ledger.AttemptStarting && !now.Before(a.Deadline) {
			a.State = ledger.AttemptUnknown
			a.FinishedAt = a.Deadline
			a.Error = "lease expired"
			n++
		}
	}
	if j.State == ledger.JobPending && j.CompletedBy == "" && !hasLive(j, "") && acted(j) {
		j.State = ledger.JobUnknown
	}
	return n
}

// acted reports whether an attempt may have acted without a result kept:
// it is unknown, or its result came too late (lost). A pending job with
// nothing starting and such an attempt is unknown.
func acted(j *ledger.Job) bool {
	for _, a := range j.Attempts {
		if a.State == ledger.AttemptUnknown || a.State == ledger.AttemptLost {
			return true
		}
	}
	return false
}

// hasLive reports whether an attempt other than except is starting.
func hasLive(j *ledger.Job, except string) bool {
	for _, a := range j.Attempts {
		if a.ID != except && a.State == ledger.AttemptStarting {
			return true
		}
	}
	return false
}

// hasActive reports whether an attempt other than except is starting or
// unknown: such an attempt blocks new ones.
func hasActive(j *ledger.Job, except string) bool {
	for _, a := range j.Attempts {
		if a.ID != except && (a.State == ledger.AttemptStarting || a.State == ledger.AttemptUnknown) {
			return true
		}
	}
	return false
}

// blocking returns the attempt that blocks new attempts: the live one with
// the latest deadline, else the unknown one with the latest deadline.
func blocking(j *ledger.Job) *ledger.Attempt {
	var best *ledger.Attempt
	for _, want := range []ledger.AttemptState{ledger.AttemptStarting, ledger.AttemptUnknown} {
		for i := range j.Attempts {
			a := &j.Attempts[i]
			if a.State == want && (best == nil || a.Deadline.After(best.Deadline)) {
				best = a
			}
		}
		if best != nil {
			c := *best
			return &c
		}
	}
	return nil
}

// Reserve applies a reservation to an existing, unexpired job j. It reports
// whether j changed.
func Reserve(j *ledger.Job, p ledger.ReserveParams, now time.Time) (ledger.Reservation, bool) {
	if j.FingerprintVersion != p.FingerprintVersion || !bytes.Equal(j.Fingerprint, p.Fingerprint) {
		return ledger.Reservation{
			Outcome: ledger.Mismatch,
			Job:     &ledger.Job{ID: j.ID, State: j.State, CreatedAt: j.CreatedAt},
			Now:     now,
		}, false
	}
	changed := ApplyLeases(j, now) > 0
	r := ledger.Reservation{Now: now}
	switch {
	case j.State == ledger.JobCompleted || j.CompletedBy != "":
		r.Outcome = ledger.Done
	case j.State == ledger.JobFailed:
		j.State = ledger.JobPending
		j.Version++
		j.CompletedAt, j.ExpiresAt = time.Time{}, time.Time{}
		a := *addAttempt(j, p.Attempt, now)
		r.Outcome, r.Attempt, changed = ledger.Reopened, &a, true
	case j.State == ledger.JobPending && hasLive(j, ""):
		r.Outcome, r.Attempt = ledger.InFlight, blocking(j)
	default:
		r.Outcome, r.Attempt = ledger.Unknown, blocking(j)
	}
	r.Job = j.Clone()
	return r, changed
}

func find(j *ledger.Job, id string) *ledger.Attempt {
	for i := range j.Attempts {
		if j.Attempts[i].ID == id {
			return &j.Attempts[i]
		}
	}
	return nil
}

func finish(a *ledger.Attempt, s ledger.AttemptState, reason string, now time.Time) {
	a.State, a.Error, a.FinishedAt = s, reason, now
}

func settle(j *ledger.Job, s ledger.JobState, now time.Time) {
	j.State, j.CompletedAt, j.ExpiresAt = s, now, now.Add(j.Retention)
}

// Complete offers resp as the result of attempt ref: compare-and-swap on the
// job's version and empty result slot, within the attempt's deadline.
func Complete(j *ledger.Job, ref ledger.AttemptRef, resp ledger.Response, now time.Time) (ledger.Completion, error) {
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.Completion{}, ledger.ErrNotFound
	}
	live := a.State == ledger.AttemptStarting || a.State == ledger.AttemptUnknown
	if j.Version == ref.Version && j.CompletedBy == "" && live && now.Before(a.Deadline) {
		j.Version++
		j.CompletedBy = a.ID
		j.Response = resp.Clone()
		settle(j, ledger.JobCompleted, now)
		finish(a, ledger.AttemptSucceeded, "", now)
		return ledger.Completion{Won: true, Job: j.Clone()}, nil
	}
	if a.State != ledger.AttemptSucceeded {
		reason := "result arrived after the job was settled"
		if !now.Before(a.Deadline) {
			reason = "result arrived after attempt_deadline"
		}
		finish(a, ledger.AttemptLost, reason, now)
	}
	ApplyLeases(j, now) // a result after the deadline leaves the job unknown
	return ledger.Completion{Won: false, Job: j.Clone()}, nil
}

// SaveBody stores the body of the answer attempt ref already won with.
func SaveBody(j *ledger.Job, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	if j.CompletedBy != ref.AttemptID || j.Response == nil {
		return ledger.ErrStale
	}
	// A new response, not a change to the old one: readers share it.
	r := *j.Response
	r.Size, r.Stored, r.Body = size, stored, nil
	if stored {
		r.Body = bytes.Clone(body)
	}
	j.Response = &r
	return nil
}

// Fail records a definitive failure of attempt ref, then either starts next
// or, when nothing else is running, fails the job. An attempt already
// marked unknown may still report a definitive failure until its deadline
// (a late 503 proves the provider did not act), but never fail over.
func Fail(j *ledger.Job, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt, now time.Time) (*ledger.Attempt, error) {
	ApplyLeases(j, now)
	a := find(j, ref.AttemptID)
	if a == nil {
		return nil, ledger.ErrNotFound
	}
	late := a.State == ledger.AttemptUnknown && now.Before(a.Deadline) && next == nil
	if a.State != ledger.AttemptStarting && !late {
		return nil, ledger.ErrStale
	}
	finish(a, ledger.AttemptFailed, reason, now)
	blocked := j.CompletedBy != "" || j.State == ledger.JobCompleted || j.State == ledger.JobFailed || hasActive(j, a.ID)
	if next != nil && blocked {
		return nil, ledger.ErrBlocked
	}
	if blocked {
		return nil, nil
	}
	if next != nil {
		j.State = ledger.JobPending
		n := *addAttempt(j, *next, now)
		return &n, nil
	}
	settle(j, ledger.JobFailed, now)
	return nil, nil
}

// MarkUnknown records that attempt ref's outcome is unknown, and the job's
// unless a result already won. The job's version is kept.
func MarkUnknown(j *ledger.Job, ref ledger.AttemptRef, reason string, now time.Time) error {
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.ErrNotFound
	}
	switch a.State {
	case ledger.AttemptStarting:
		finish(a, ledger.AttemptUnknown, reason, now)
	case ledger.AttemptUnknown:
	default:
		return ledger.ErrStale
	}
	if j.State == ledger.JobPending && j.CompletedBy == "" {
		j.State = ledger.JobUnknown
	}
	return nil
}

// Hedge starts a concurrent attempt for the pending job, keeping its version.
func Hedge(j *ledger.Job, ref ledger.AttemptRef, next ledger.NextAttempt, now time.Time) (ledger.Attempt, error) {
	ApplyLeases(j, now)
	if j.State != ledger.JobPending || j.CompletedBy != "" || j.Version != ref.Version {
		return ledger.Attempt{}, ledger.ErrStale
	}
	return *addAttempt(j, next, now), nil
}

// Resolve settles the job out of band.
func Resolve(j *ledger.Job, r ledger.Resolution, now time.Time) error {
	ApplyLeases(j, now)
	if j.CompletedBy != "" || j.State == ledger.JobCompleted {
		return ledger.ErrCompleted
	}
	for i := range j.Attempts {
		a := &j.Attempts[i]
		if a.State == ledger.AttemptStarting || a.State == ledger.AttemptUnknown {
			finish(a, ledger.AttemptCancelled, "resolved by an operator", now)
		}
	}
	j.Version++
	if r.Cancel || r.Response == nil {
		settle(j, ledger.JobFailed, now)
		return nil
	}
	a := addAttempt(j, ledger.NextAttempt{Provider: ledger.AdminProvider}, now)
	finish(a, ledger.AttemptSucceeded, "", now)
	j.CompletedBy = a.ID
	j.Response = r.Response.Clone()
	j.Response.Stored = true
	j.Response.Size = int64(len(r.Response.Body))
	settle(j, ledger.JobCompleted, now)
	return nil
}

// Matches reports whether the job passes the listing filter q.
func Matches(j *ledger.Job, q ledger.JobQuery) bool {
	if q.State != "" && j.State != q.State {
		return false
	}
	if q.Provider == "" {
		return true
	}
	for _, a := range j.Attempts {
		if a.Provider == q.Provider {
			return true
		}
	}
	return false
}
