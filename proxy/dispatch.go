package proxy

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/onejob/onejob/ledger"
	"go.uber.org/zap"
)

// dispatch acts on the ledger's answer to a reservation made at issued: a
// new job (or a re-opened one) runs its attempts; a done job replays its
// answer; a job in flight is waited for (Prefer: wait) or answered 409; a
// job whose outcome is unknown gets its attempt re-sent when that is safe
// (resendOnRetry), else a 409 that says so; a key used for another request
// gets a 422.
func (m *Middleware) dispatch(w http.ResponseWriter, r *http.Request, next Handler, res ledger.Reservation, issued time.Time, body []byte) error {
	jobID := res.Job.ID
	m.cfg.SetVar(r, "job_id", jobID)
	switch res.Outcome {
	case ledger.Created, ledger.Reopened:
		m.cfg.Observer.Request("new")
		m.cfg.SetVar(r, "attempt", strconv.Itoa(res.Attempt.Number))
		return m.execute(w, r, next, res, leaseEnd(issued, *res.Attempt), body)
	case ledger.Mismatch:
		m.cfg.Observer.Request("mismatch")
		problem(http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency key reused").
			withDetail("This key was used for a different request.").withJob(jobID).Write(w)
	case ledger.Done:
		m.cfg.Observer.Request("replayed")
		m.replay(w, r, res.Job, res.Now, true, res.Tier)
	case ledger.InFlight:
		wait := m.waitFor(w, r)
		if wait <= 0 {
			m.cfg.Observer.Request("rejected")
			m.inFlight(w, jobID, res.Attempt, res.Now)
			return nil
		}
		m.wait(w, r, jobID, wait)
	case ledger.Unknown:
		if a, until, ok := m.resendOnRetry(r.Context(), res); ok {
			m.cfg.Observer.Request("new")
			m.cfg.SetVar(r, "attempt", strconv.Itoa(a.Number))
			res.Attempt = a
			return m.execute(w, r, next, res, until, body)
		}
		m.cfg.Observer.Request("unknown")
		m.unknown(w, jobID, res.Attempt, res.Now)
	}
	return nil
}

// waitFor returns how long a duplicate r of an in-flight job waits for its
// result, 0 for a 409 at once: the client's Prefer: wait, capped by
// max_wait (and then said in Preference-Applied), else in_flight's.
func (m *Middleware) waitFor(w http.ResponseWriter, r *http.Request) time.Duration {
	if wait, ok := preferredWait(r.Header); ok {
		wait = min(wait, m.cfg.MaxWait)
		setCanonical(w.Header(), HeaderPreferenceApplied, appliedWait(wait))
		return wait
	}
	if m.cfg.InFlightReject {
		return 0
	}
	return m.cfg.InFlightWait
}

// wait holds a duplicate until the job settles or the wait ends (in_flight's,
// or the one the client preferred).
func (m *Middleware) wait(w http.ResponseWriter, r *http.Request, jobID string, wait time.Duration) {
	ctx, span := startSpan(r.Context(), spanWait)
	defer span.End()
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	j, err := m.cfg.Ledger.Wait(ctx, jobID)
	if span.IsRecording() {
		span.SetAttributes(attrJobID.String(jobID))
		switch {
		case err != nil:
			failSpan(span, err)
		default:
			span.SetAttributes(attrJobState.String(string(j.State)))
		}
	}
	if r.Context().Err() != nil {
		return // the client left
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		m.cfg.Observer.Request("conflict")
		var a *ledger.Attempt
		now := time.Time{}
		if j != nil {
			a, now = latest(j), j.ReadAt
		}
		m.inFlight(w, jobID, a, now)
	case errors.Is(err, ledger.ErrNotFound):
		m.cfg.Observer.Request("conflict")
		problem(http.StatusConflict, ProblemInFlight, "Request in flight").
			withDetail("The job changed while waiting; retry.").withJob(jobID).retry(time.Second).Write(w)
	case err != nil:
		m.jobLog(r.Context()).Error("ledger unavailable while waiting", zap.String("job_id", jobID), zap.Error(err))
		m.cfg.Observer.Request("rejected")
		problem(http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Ledger unavailable").
			withJob(jobID).retry(time.Second).Write(w)
	case j.State == ledger.JobCompleted:
		m.cfg.Observer.Request("waited")
		m.replay(w, r, j, j.ReadAt, true, ledger.TierLedger)
	case j.State == ledger.JobFailed:
		m.cfg.Observer.Request("waited")
		setExpires(w.Header(), j.ExpiresAt)
		problem(http.StatusServiceUnavailable, ProblemAttemptFailed, "Attempt failed").
			withDetail("The attempt this request waited for failed definitively; a retry may start a new attempt.").
			withJob(jobID).retry(time.Second).Write(w)
	default:
		m.cfg.Observer.Request("unknown")
		m.unknown(w, jobID, latest(j), j.ReadAt)
	}
}

// latest returns the job's attempt with the latest deadline.
func latest(j *ledger.Job) *ledger.Attempt {
	var a *ledger.Attempt
	for i := range j.Attempts {
		if a == nil || j.Attempts[i].Deadline.After(a.Deadline) {
			a = &j.Attempts[i]
		}
	}
	return a
}

// inFlight answers 409 for a job whose attempt is still running. now is
// the ledger's clock: Retry-After is computed from ledger times only.
func (m *Middleware) inFlight(w http.ResponseWriter, jobID string, a *ledger.Attempt, now time.Time) {
	retry := time.Second
	if a != nil && !now.IsZero() {
		retry = max(min(a.StartedAt.Add(m.cfg.AttemptTimeout).Sub(now), a.Deadline.Sub(now)), time.Second)
	}
	problem(http.StatusConflict, ProblemInFlight, "Request in flight").
		withDetail("A request with this key is still being processed.").withJob(jobID).retry(retry).Write(w)
}

// unknown answers 409 for a job whose outcome is unknown: Retry-After until
// the attempt's deadline by the ledger's clock (now), when a late result
// may still come; none after.
func (m *Middleware) unknown(w http.ResponseWriter, jobID string, a *ledger.Attempt, now time.Time) {
	p := problem(http.StatusConflict, ProblemOutcomeUnknown, "Outcome unknown").
		withDetail("An attempt's outcome is unknown; no new attempt starts until it is resolved.").withJob(jobID)
	switch {
	case a == nil:
	case now.IsZero():
		p.retry(time.Second) // the ledger did not say its time
	case a.Deadline.After(now):
		p.retry(a.Deadline.Sub(now))
	}
	p.Write(w)
}

// Ledger calls made for an attempt, detached from the client.
