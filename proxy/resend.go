package proxy

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// Re-sends reconcile an unknown attempt to a provider that deduplicates
// (Provider.Deduplicates): the provider answers the same job id at most
// once, so sending the request to it again, with the same value in its
// header, cannot make a second side effect, and its answer settles the job
// (docs/contract.md, reconciliation). A re-send happens in two places: in
// the run, after an attempt's connection broke (never after a timeout: the
// original still runs there); and on a client's retry of an unknown job.
// The ledger's Resend admits one at a time, only while no result won.

// resendPending reports whether a re-send's status says the original is
// still in progress or was not taken (409, 425, 429, 503): the re-send
// failed, and the job stays unknown.
func resendPending(status int) bool {
	switch status {
	case http.StatusConflict, http.StatusTooEarly, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return true
	}
	return false
}

// resendTarget returns the index of the provider j's request may be sent
// again to, and the attempt the re-send reconciles: when every attempt
// that blocks j went to that one provider of this handler, and it
// deduplicates. Two providers that may both have acted are never
// reconciled by sending to one of them, nor another handler's provider by
// sending to its namesake here.
func (m *Middleware) resendTarget(j *ledger.Job) (int, *ledger.Attempt, bool) {
	var (
		target = -1
		ref    *ledger.Attempt
	)
	for i := range j.Attempts {
		a := &j.Attempts[i]
		if !j.BlockedBy(a) {
			continue
		}
		// -1 for another handler's provider, or one no longer configured
		p := slices.IndexFunc(m.policy.Providers, func(name string) bool { return a.SentTo(m.cfg.Scope, name) })
		if p < 0 || m.cfg.Providers[p].Deduplicates == "" || (target >= 0 && p != target) {
			return 0, nil, false
		}
		target, ref = p, a
	}
	return target, ref, ref != nil
}

// resendOnRetry starts a re-send for a client's retry of the unknown job
// of res, when its blocking attempts allow one (resendTarget). It returns
// the new attempt and the end of its lease (leaseEnd), or false: then the
// retry is answered as unknown.
func (m *Middleware) resendOnRetry(ctx context.Context, res ledger.Reservation) (*ledger.Attempt, time.Time, bool) {
	if !m.deduplicating {
		return nil, time.Time{}, false
	}
	j, err := ledgerCall(m, ctx, "job", func(ctx context.Context) (*ledger.Job, error) {
		return m.cfg.Ledger.Job(ctx, res.Job.ID)
	})
	if err != nil {
		return nil, time.Time{}, false
	}
	p, ref, ok := m.resendTarget(j)
	if !ok {
		return nil, time.Time{}, false
	}
	issued := time.Now()
	a, err := m.resend(ledger.AttemptRef{JobID: j.ID, AttemptID: ref.ID, Version: j.Version}, p)
	if err != nil {
		return nil, time.Time{}, false
	}
	return a, leaseEnd(issued, *a), true
}

// resend starts a re-send to provider p reconciling ref. Like a hedge, a
// re-send whose start was not confirmed is recorded as never sent once the
// ledger answers.
func (m *Middleware) resend(ref ledger.AttemptRef, p int) (*ledger.Attempt, error) {
	next := m.newAttempt(m.policy.Providers[p])
	a, err := ledgerCall(m, context.Background(), "resend", func(ctx context.Context) (ledger.Attempt, error) {
		return m.cfg.Ledger.Resend(ctx, ref, next)
	})
	if !answered(err) {
		m.unsent(unsentWork{ref: ledger.AttemptRef{JobID: ref.JobID, AttemptID: next.ID}})
	}
	if err != nil {
		if !errors.Is(err, ledger.ErrStale) {
			m.cfg.Logger.Error("re-send not started", zap.String("job_id", ref.JobID), zap.Error(err))
		}
		return nil, err
	}
	m.cfg.Logger.Info("re-send started", zap.String("job_id", a.JobID), zap.String("attempt_id", a.ID),
		zap.String("provider", a.Provider), zap.String("reconciles_attempt_id", ref.AttemptID),
		zap.String("attempt", strconv.Itoa(a.Number)))
	return &a, nil
}
