package proxy

import (
	"context"
	"errors"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// Ledger calls and their repeats (docs/contract.md, rule 3). Every transition
// is idempotent by the ids the gateway chose, so a call whose reply did not
// come — it may or may not have run — is sent again, a bounded number of
// times within a bounded time. Nothing below the gateway repeats a call:
// only the gateway knows the ids that make a repeat safe.
const (
	// ledgerTimeout bounds one ledger call with its repeats: a
	// reservation, and each call made on behalf of an attempt, which is
	// detached from the client's request.
	ledgerTimeout = 15 * time.Second
	// ledgerTries is how many times a call is sent at most.
	ledgerTries = 4
	// LedgerTryTimeout bounds one try: a reply that does not come within
	// it counts as lost. The reconciler bounds its calls by it too.
	LedgerTryTimeout = 5 * time.Second
	// ledgerPause is the pause before the first repeat; it doubles.
	ledgerPause = 50 * time.Millisecond
)

// answered reports whether err is the ledger's answer rather than a reply
// that did not come.
func answered(err error) bool {
	return err == nil || errors.Is(err, ledger.ErrNotFound) || errors.Is(err, ledger.ErrStale) ||
		errors.Is(err, ledger.ErrBlocked) || errors.Is(err, ledger.ErrCompleted)
}

// ledgerCall runs one ledger transition, repeating it while no answer
// comes, within ledgerTimeout of its start (ctx carries no deadline of its
// own: each try gets one, the only timer a call needs), and records its
// duration and its repeats. A local ledger's call runs once, as it is.
func ledgerCall[T any](m *Middleware, ctx context.Context, op string, call func(context.Context) (T, error)) (T, error) {
	start := time.Now()
	defer func() { m.cfg.Observer.LedgerOp(op, time.Since(start)) }()
	if m.localLedger {
		// In the gateway's process: the reply always comes, and the
		// context bounds nothing (ledger.Local).
		return call(ctx)
	}
	end := start.Add(ledgerTimeout)
	for try := 1; ; try++ {
		deadline := time.Now().Add(LedgerTryTimeout)
		if deadline.After(end) {
			deadline = end
		}
		tctx, cancel := context.WithDeadline(ctx, deadline)
		v, err := call(tctx)
		cancel()
		if answered(err) || ctx.Err() != nil || try == ledgerTries || !time.Now().Before(end) {
			return v, err
		}
		m.cfg.Observer.LedgerRepeat(op)
		m.cfg.Logger.Warn("ledger call repeated: no reply", zap.String("operation", op),
			zap.Int("try", try+1), zap.Error(err))
		pause := time.NewTimer(ledgerPause << (try - 1))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return v, err
		}
	}
}

func (m *Middleware) complete(att ledger.Attempt, resp ledger.Response) (ledger.Completion, error) {
	stored := resp // the first client gets resp; the ledger never the private headers
	stored.Header = m.storable(resp.Header)
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	return ledgerCall(m, ctx, "complete", func(ctx context.Context) (ledger.Completion, error) {
		return m.cfg.Ledger.Complete(ctx, att.Ref(), stored)
	})
}

// fail records a definitive failure of att and starts next, if set. When
// the ledger does not answer, next may exist there but is never sent, and
// att failed all the same (never sent, when its request never left: a
// connect error): each is recorded so once the ledger answers, att first.
// A connect error that comes to the ledger after att's lease ran out finds
// att unknown (ErrStale): never sent is still proof, and it is recorded so.
func (rn *runner) fail(att ledger.Attempt, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	m := rn.m
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	a, err := ledgerCall(m, ctx, "fail", func(ctx context.Context) (*ledger.Attempt, error) {
		return m.cfg.Ledger.Fail(ctx, att.Ref(), reason, next)
	})
	if err != nil && !errors.Is(err, ledger.ErrBlocked) {
		rn.log.Error("failure not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
		connect := reason == fallback.ReasonConnect
		switch {
		case !answered(err):
			if connect {
				m.unsent(unsentWork{ref: att.Ref()})
			} else {
				m.unsent(unsentWork{ref: att.Ref(), failed: reason})
			}
			if next != nil {
				m.unsent(unsentWork{ref: ledger.AttemptRef{JobID: att.JobID, AttemptID: next.ID}})
			}
		case connect && errors.Is(err, ledger.ErrStale):
			m.unsent(unsentWork{ref: att.Ref()})
		}
		return nil, err
	}
	return a, nil
}

// failedExpiry returns when a job whose every attempt failed expires, so
// that the client's answer can say it (Idempotency-Expires): one read,
// made only on this path, and bounded, since the header only informs.
// It is zero when the job is not failed by now or cannot be read.
func (m *Middleware) failedExpiry(jobID string) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	j, err := m.cfg.Ledger.Job(ctx, jobID)
	if err != nil || j.State != ledger.JobFailed {
		return time.Time{}
	}
	return j.ExpiresAt
}

// hedge starts next beside the attempt ref; like fail, a next attempt
// whose start the ledger did not confirm is recorded never sent.
func (m *Middleware) hedge(ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	a, err := ledgerCall(m, ctx, "hedge", func(ctx context.Context) (ledger.Attempt, error) {
		return m.cfg.Ledger.Hedge(ctx, ref, next)
	})
	if !answered(err) {
		m.unsent(unsentWork{ref: ledger.AttemptRef{JobID: ref.JobID, AttemptID: next.ID}})
	}
	return a, err
}

func (rn *runner) markUnknown(att ledger.Attempt, reason string) {
	m := rn.m
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	_, err := ledgerCall(m, ctx, "mark_unknown", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.cfg.Ledger.MarkUnknown(ctx, att.Ref(), reason)
	})
	switch {
	case err == nil:
		rn.log.Warn("attempt outcome unknown", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Int("attempt", att.Number), zap.String("reason", reason))
	case errors.Is(err, ledger.ErrStale):
	default:
		rn.log.Error("unknown outcome not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
	}
}

func (m *Middleware) saveBody(att ledger.Attempt, body []byte, size int64, stored bool) error {
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	_, err := ledgerCall(m, ctx, "save_body", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.cfg.Ledger.SaveBody(ctx, att.Ref(), body, size, stored)
	})
	return err
}
