package proxy

import (
	"time"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
	"go.uber.org/zap"
)

// complete offers an answer to the job by CAS, after the earlier result
// the ledger did not take, if there is one: a later result never wins
// over it, and while the ledger does not take it, the later one is not
// offered at all (its attempt is unknown).
func (rn *runner) complete(att ledger.Attempt, provider string, answer *ledger.Response) (out runOutcome) {
	m := rn.m
	_, span := startSpan(rn.base.Context(), spanComplete)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(attrJobID.String(att.JobID), attrAttemptID.String(att.ID), attrProvider.String(provider))
		defer func() {
			span.SetAttributes(attrWon.Bool(out.won))
			if out.storeErr != nil {
				failSpan(span, out.storeErr)
			}
		}()
	}
	rn.offering <- struct{}{}
	defer func() { <-rn.offering }()
	if u := rn.unstored; u != nil {
		if _, err := m.complete(u.att, *u.answer); err != nil {
			rn.log.Error("result not offered: an earlier one the ledger did not take comes first", zap.String("job_id", att.JobID),
				zap.String("attempt_id", att.ID), zap.String("earlier_attempt_id", u.att.ID), zap.Error(err))
			rn.markUnknown(att, "result not offered: an earlier result the ledger did not take comes first")
			m.cfg.Observer.Attempt(provider, "unknown")
			return runOutcome{verdict: fallback.Result, answer: answer, storeErr: err}
		}
		rn.unstored = nil
	}
	c, err := m.complete(att, *answer)
	switch {
	case err != nil:
		// The client still gets the answer; the job stays unreconciled
		// (pending, then unknown) and is never re-executed.
		rn.log.Error("result not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
		m.cfg.Observer.Attempt(provider, "unknown")
		rn.unstored = &offer{att: att, answer: answer}
		return runOutcome{verdict: fallback.Result, answer: answer, storeErr: err}
	case c.Won:
		m.cfg.Observer.Attempt(provider, "succeeded")
		return runOutcome{verdict: fallback.Result, answer: answer, won: true, expires: c.Job.ExpiresAt}
	}
	rn.lost(att, c.Job, provider)
	return runOutcome{verdict: fallback.Result, answer: answer, job: c.Job}
}

func (rn *runner) lost(att ledger.Attempt, j *ledger.Job, provider string) {
	m := rn.m
	m.cfg.Observer.Attempt(provider, "lost")
	m.cfg.Observer.RaceLost()
	winner := ""
	if j != nil {
		winner = j.CompletedBy
	}
	rn.log.Warn("result discarded: the attempt lost the race", zap.String("job_id", att.JobID),
		zap.String("attempt_id", att.ID), zap.Int("attempt", att.Number), zap.String("provider", provider),
		zap.String("winner_attempt_id", winner))
}

// startStream sends the head of an answer (its status and its headers as
// storedHeader gives them) to the client, if it is still there, and marks
// the answer as passing through.
func (rn *runner) startStream(att ledger.Attempt, head *ledger.Response, expires time.Time) bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if !rn.open() || !rn.client.tryLock() {
		return false
	}
	defer rn.client.mu.Unlock()
	rn.state = clientStreaming
	h := rn.client.w.Header()
	rn.m.setAnswerHeader(h, head.Header, att.JobID, false)
	setExpires(h, expires)
	rn.client.w.WriteHeader(head.Status)
	return true
}
