// Package fsm holds the job and attempt transitions of docs/contract.md (sections 1
// and 2) as pure
// functions over an in-memory job. Backends that keep whole jobs in one
// place (memory, file) apply them under their own lock or transaction; the
// SQL and Lua backends implement the same rules in their own language, and
// ledgertest holds them all to one behaviour.
package fsm

import (
	"bytes"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/near"
)

// NewJob returns the new pending job p.JobID with attempt p.Attempt starting.
func NewJob(p ledger.ReserveParams, now time.Time) *ledger.Job {
	j := &ledger.Job{
		ID:                 p.JobID,
		OwnerHash:          bytes.Clone(p.OwnerHash),
		KeyHash:            bytes.Clone(p.KeyHash),
		Fingerprint:        bytes.Clone(p.Fingerprint),
		FingerprintVersion: p.FingerprintVersion,
		FingerprintScheme:  p.FingerprintScheme,
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
		ID:         next.ID,
		JobID:      j.ID,
		Number:     len(j.Attempts) + 1,
		Provider:   next.Provider,
		Scope:      next.Scope,
		State:      ledger.AttemptStarting,
		JobVersion: j.Version,
		StartedAt:  now,
		Deadline:   now.Add(next.Lease),
	})
	return &j.Attempts[len(j.Attempts)-1]
}

// ApplyLeases records every starting attempt whose deadline passed as
// unknown, and the job as unknown when nothing else can settle it: a
// pending job with nothing starting, or a failed one that a late result
// showed a provider acted for (a lookup answered absent, then the
// attempt's answer arrived), which no longer expires. It reports how many
// attempts changed.
func ApplyLeases(j *ledger.Job, now time.Time) int {
	n := 0
	for i := range j.Attempts {
		a := &j.Attempts[i]
		if a.State == ledger.AttemptStarting && !now.Before(a.Deadline) {
			a.State = ledger.AttemptUnknown
			a.FinishedAt = a.Deadline
			a.Error = ledger.ReasonLeaseExpired
			n++
		}
	}
	open := j.State == ledger.JobPending || j.State == ledger.JobFailed
	if open && j.CompletedBy == "" && !hasLive(j, "") && Blocks(j, "") {
		j.State = ledger.JobUnknown
		j.CompletedAt, j.ExpiresAt = time.Time{}, time.Time{}
	}
	return n
}

// Blocks reports whether an attempt other than except blocks new attempts
// (ledger.Job.BlockedBy).
func Blocks(j *ledger.Job, except string) bool {
	for _, a := range j.Attempts {
		if a.ID != except && blocks(j, &a) {
			return true
		}
	}
	return false
}

func blocks(j *ledger.Job, a *ledger.Attempt) bool { return j.BlockedBy(a) }

// hasLive reports whether an attempt other than except is starting.
func hasLive(j *ledger.Job, except string) bool {
	for _, a := range j.Attempts {
		if a.ID != except && a.State == ledger.AttemptStarting {
			return true
		}
	}
	return false
}

// Blocking returns the attempt that blocks new attempts: the starting one
// with the latest deadline, else the blocking one (unknown, or lost with no
// winner) with the latest deadline; nil when none blocks.
func Blocking(j *ledger.Job) *ledger.Attempt {
	var live, other *ledger.Attempt
	for i := range j.Attempts {
		a := &j.Attempts[i]
		switch {
		case a.State == ledger.AttemptStarting:
			if live == nil || a.Deadline.After(live.Deadline) {
				live = a
			}
		case blocks(j, a):
			if other == nil || a.Deadline.After(other.Deadline) {
				other = a
			}
		}
	}
	if live == nil {
		live = other
	}
	if live == nil {
		return nil
	}
	c := *live
	return &c
}

// Reserve applies a reservation to an existing, unexpired job j. It reports
// whether j changed.
func Reserve(j *ledger.Job, p ledger.ReserveParams, now time.Time) (ledger.Reservation, bool) {
	if !p.Matches(j) {
		return ledger.Mismatched(j, now), false
	}
	changed := ApplyLeases(j, now) > 0
	r := ledger.Reservation{Now: now}
	if a := find(j, p.Attempt.ID); a != nil {
		// A repeat: this call's attempt exists, as the first call left it
		// or as it went on since.
		r.Outcome = ledger.Created
		if a.Number > 1 {
			r.Outcome = ledger.Reopened
		}
		c := *a
		r.Attempt, r.Job = &c, j.Clone()
		return r, changed
	}
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
		r.Outcome, r.Attempt = ledger.InFlight, Blocking(j)
	default:
		r.Outcome, r.Attempt = ledger.Unknown, Blocking(j)
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

// settled reports whether the job has a result or was failed: no attempt
// can start or win any more.
func settled(j *ledger.Job) bool {
	return j.CompletedBy != "" || j.State == ledger.JobCompleted || j.State == ledger.JobFailed
}

// AtRest reports whether j changes only by a transition: it is completed
// with its whole answer stored (near.Replayable) and no attempt is
// starting, so no lease can run out. Nearly every job spends its retention
// so; the embedded ledgers keep such a job as its record alone.
func AtRest(j *ledger.Job) bool {
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

// Complete offers resp as the result of attempt ref: compare-and-swap on the
// job's version and empty result slot, within the attempt's deadline. A
// repeat by the winner reports that it won; a cancelled attempt's result is
// dropped and the attempt stays cancelled (it never blocks again).
func Complete(j *ledger.Job, ref ledger.AttemptRef, resp ledger.Response, now time.Time) (ledger.Completion, error) {
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.Completion{}, ledger.ErrNotFound
	}
	// The job as this call left it, read at now: a repeat's reader counts
	// the time the job has left from the repeat, not from its completion.
	answer := func(won bool) (ledger.Completion, error) {
		c := j.Clone()
		c.ReadAt = now
		return ledger.Completion{Won: won, Job: c}, nil
	}
	if j.CompletedBy == a.ID {
		return answer(true)
	}
	live := a.State == ledger.AttemptStarting || a.State == ledger.AttemptUnknown
	if j.Version == ref.Version && j.CompletedBy == "" && live && now.Before(a.Deadline) {
		j.Version++
		j.CompletedBy = a.ID
		j.Response = resp.Clone()
		settle(j, ledger.JobCompleted, now)
		finish(a, ledger.AttemptSucceeded, "", now)
		return answer(true)
	}
	switch a.State {
	case ledger.AttemptCancelled, ledger.AttemptLost:
	default:
		reason := ledger.ReasonLateSettled
		if !now.Before(a.Deadline) {
			reason = ledger.ReasonLateDeadline
		}
		finish(a, ledger.AttemptLost, reason, now)
	}
	ApplyLeases(j, now) // an unbeaten lost result leaves the job unknown
	return answer(false)
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
// or, when nothing else blocks, fails the job. An attempt already marked
// unknown may still report a definitive failure until its deadline (a late
// 503 proves the provider did not act), but never fail over. A repeat
// returns the attempt the first call started, or ErrBlocked if it started
// none.
func Fail(j *ledger.Job, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt, now time.Time) (*ledger.Attempt, error) {
	ApplyLeases(j, now)
	a := find(j, ref.AttemptID)
	if a == nil {
		return nil, ledger.ErrNotFound
	}
	if a.State == ledger.AttemptFailed {
		return repeatedFailure(j, next)
	}
	late := a.State == ledger.AttemptUnknown && now.Before(a.Deadline) && next == nil
	if a.State != ledger.AttemptStarting && !late {
		return nil, ledger.ErrStale
	}
	finish(a, ledger.AttemptFailed, reason, now)
	return afterFailure(j, a, next, now)
}

// repeatedFailure answers a repeat of a failure already recorded.
func repeatedFailure(j *ledger.Job, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	if next == nil {
		return nil, nil
	}
	if n := find(j, next.ID); n != nil {
		c := *n
		return &c, nil
	}
	return nil, ledger.ErrBlocked
}

// afterFailure starts next, or fails the job, once attempt a failed; when
// something blocks, the job is left unknown if nothing else runs.
func afterFailure(j *ledger.Job, a *ledger.Attempt, next *ledger.NextAttempt, now time.Time) (*ledger.Attempt, error) {
	if settled(j) || Blocks(j, a.ID) {
		ApplyLeases(j, now)
		if next != nil {
			return nil, ledger.ErrBlocked
		}
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

// Unsent records that attempt ref was never sent: it becomes failed, even
// after it became unknown (its lease ran out, or its attempt_timeout ended
// before its dial failed), whatever happened to the job since.
func Unsent(j *ledger.Job, ref ledger.AttemptRef, now time.Time) error {
	ApplyLeases(j, now)
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.ErrNotFound
	}
	switch a.State {
	case ledger.AttemptFailed:
		return nil // a repeat, or a failure recorded otherwise: either way not sent
	case ledger.AttemptStarting, ledger.AttemptUnknown:
		// Unknown says only that no answer came in time. Whatever
		// happened to the job since (a re-send that completed it), the
		// attempt itself never left; the job's state follows the usual
		// rules (afterFailure).
	default:
		return ledger.ErrStale
	}
	finish(a, ledger.AttemptFailed, ledger.ReasonUnsent, now)
	_, err := afterFailure(j, a, nil, now)
	return err
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

// Hedge starts the concurrent attempt next for the pending job, keeping its
// version. A repeat returns the attempt the first call started.
func Hedge(j *ledger.Job, ref ledger.AttemptRef, next ledger.NextAttempt, now time.Time) (ledger.Attempt, error) {
	ApplyLeases(j, now)
	if a := find(j, next.ID); a != nil {
		return *a, nil
	}
	if j.State != ledger.JobPending || j.CompletedBy != "" || j.Version != ref.Version {
		return ledger.Attempt{}, ledger.ErrStale
	}
	return *addAttempt(j, next, now), nil
}

// Resend starts next, a re-send reconciling the blocking attempt ref (see
// ledger.Ledger.Resend). A repeat returns the attempt the first call
// started.
func Resend(j *ledger.Job, ref ledger.AttemptRef, next ledger.NextAttempt, now time.Time) (ledger.Attempt, error) {
	ApplyLeases(j, now)
	if a := find(j, next.ID); a != nil {
		return *a, nil
	}
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.Attempt{}, ledger.ErrNotFound
	}
	if settled(j) || j.Version != ref.Version || !blocks(j, a) || hasLive(j, "") {
		return ledger.Attempt{}, ledger.ErrStale
	}
	j.State = ledger.JobPending
	n := addAttempt(j, next, now)
	n.Resend = true
	return *n, nil
}

// Resolve settles the job out of band. A repeat of a completion (the same
// r.AttemptID) changes nothing; so does a cancel of a job already failed
// with nothing starting or unknown.
func Resolve(j *ledger.Job, r ledger.Resolution, now time.Time) error {
	ApplyLeases(j, now)
	cancel := r.Cancel || r.Response == nil
	if !cancel && j.CompletedBy != "" && j.CompletedBy == r.AttemptID {
		return nil
	}
	if j.CompletedBy != "" || j.State == ledger.JobCompleted {
		return ledger.ErrCompleted
	}
	if cancel && j.State == ledger.JobFailed && !hasRunning(j) {
		return nil
	}
	for i := range j.Attempts {
		a := &j.Attempts[i]
		if a.State == ledger.AttemptStarting || a.State == ledger.AttemptUnknown {
			finish(a, ledger.AttemptCancelled, ledger.ReasonResolved, now)
		}
	}
	j.Version++
	if cancel {
		settle(j, ledger.JobFailed, now)
		return nil
	}
	a := addAttempt(j, ledger.NextAttempt{ID: r.AttemptID, Provider: ledger.AdminProvider}, now)
	finish(a, ledger.AttemptSucceeded, "", now)
	j.CompletedBy = a.ID
	j.Response = r.Response.Clone()
	j.Response.Stored = true
	j.Response.Size = int64(len(r.Response.Body))
	settle(j, ledger.JobCompleted, now)
	return nil
}

// hasRunning reports whether an attempt is starting or unknown.
func hasRunning(j *ledger.Job) bool {
	for _, a := range j.Attempts {
		if a.State == ledger.AttemptStarting || a.State == ledger.AttemptUnknown {
			return true
		}
	}
	return false
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

// ClaimLookup leases the unknown attempt ref to holder until now+lease
// (ledger.Ledger.ClaimLookup).
func ClaimLookup(j *ledger.Job, ref ledger.AttemptRef, holder string, lease time.Duration, now time.Time) error {
	ApplyLeases(j, now)
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.ErrNotFound
	}
	l := a.Lookups()
	if l.Holder == holder && now.Before(l.Until) && a.State == ledger.AttemptUnknown {
		return nil // a repeat
	}
	if a.State != ledger.AttemptUnknown || now.Before(a.Deadline) || now.Before(l.NextAt) || now.Before(l.Until) {
		return ledger.ErrStale
	}
	l.Holder, l.Until = holder, now.Add(lease)
	a.Lookup = &l
	return nil
}

// SettleLookup records what holder's lookup of attempt ref found
// (ledger.Ledger.SettleLookup).
func SettleLookup(j *ledger.Job, ref ledger.AttemptRef, holder string, r ledger.LookupResult, now time.Time) error {
	ApplyLeases(j, now)
	a := find(j, ref.AttemptID)
	if a == nil {
		return ledger.ErrNotFound
	}
	l := a.Lookups()
	if l.Holder != holder || (l.Until.IsZero() && l.LastAt.IsZero()) {
		return ledger.ErrStale // not this holder's, or never claimed
	}
	if l.Until.IsZero() {
		return nil // a repeat: this holder's lookup was recorded
	}
	if a.State != ledger.AttemptUnknown || !now.Before(l.Until) {
		return ledger.ErrStale
	}
	l.Tries++
	l.LastStatus, l.LastAt, l.Until = r.Status, now, time.Time{}
	defer func() { a.Lookup = &l }() // a new record: copies of the job share the old one
	switch {
	case r.Found != nil && j.CompletedBy == "":
		l.Settled = true
		j.Version++
		j.CompletedBy = a.ID
		j.Response = r.Found.Clone()
		j.Response.Stored, j.Response.Size = true, int64(len(r.Found.Body))
		settle(j, ledger.JobCompleted, now)
		finish(a, ledger.AttemptSucceeded, "", now)
	case r.Found != nil:
		l.Settled = true
		finish(a, ledger.AttemptLost, ledger.ReasonLookupLost, now)
	case r.Absent:
		l.Settled = true
		finish(a, ledger.AttemptFailed, ledger.ReasonAbsent, now)
		_, err := afterFailure(j, a, nil, now)
		return err
	default:
		l.NextAt = now.Add(r.Retry)
	}
	return nil
}
