package proxy

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// Never-sent attempts (docs/contract.md, rule 7): an attempt the gateway
// reserved but never sent, because the ledger stopped answering before the
// request could be forwarded, is recorded failed as soon as the ledger
// answers again. Only this instance holds that proof.
const (
	// unsentMax bounds the attempts waiting to be recorded; beyond it the
	// lease makes them unknown, as if this instance had died.
	unsentMax = 10000
	// unsentGiveUp is how long one is retried at most.
	unsentGiveUp = time.Hour
	// unsentPauseMax caps the pause between rounds.
	unsentPauseMax = 5 * time.Second
)

// unsentWork is one never-sent attempt: a reservation whose answer did not
// come (its repeat tells the job and whether the attempt exists), or an
// attempt whose id is known; or, with failed set, an attempt that was sent
// and failed definitively (failed is the reason), whose failure the ledger
// did not take: it is recorded failed while the ledger still allows it
// (until its deadline), so that an outage does not turn a known failure
// into an unknown for an operator.
type unsentWork struct {
	reserve *ledger.ReserveParams
	ref     ledger.AttemptRef
	failed  string
	since   time.Time
}

// unsentQueue records never-sent attempts in the background, on one
// goroutine that runs while the queue holds work and keeps the ledger
// alive across a reload meanwhile.
type unsentQueue struct {
	mu      sync.Mutex
	work    []unsentWork
	running bool
}

// unsent queues a never-sent attempt to be recorded failed.
func (m *Middleware) unsent(w unsentWork) {
	q := &m.unsentQ
	w.since = time.Now()
	q.mu.Lock()
	if len(q.work) >= unsentMax {
		q.mu.Unlock()
		m.cfg.Logger.Error("never-sent attempt not recorded: too many waiting; its lease will make it unknown",
			zap.String("job_id", w.ref.JobID), zap.String("attempt_id", w.ref.AttemptID))
		return
	}
	q.work = append(q.work, w)
	start := !q.running
	q.running = true
	q.mu.Unlock()
	if start {
		go m.recordUnsent(m.cfg.Hold())
	}
}

// recordUnsent works through the queue until it is empty.
func (m *Middleware) recordUnsent(release func()) {
	defer release()
	q := &m.unsentQ
	pause := 100 * time.Millisecond
	for {
		q.mu.Lock()
		work := q.work
		q.work = nil
		q.mu.Unlock()
		var again []unsentWork
		for _, w := range work {
			if !m.recordOne(w) {
				if time.Since(w.since) < unsentGiveUp {
					again = append(again, w)
					continue
				}
				m.cfg.Logger.Error("never-sent attempt not recorded: the ledger did not answer for an hour",
					zap.String("job_id", w.ref.JobID), zap.String("attempt_id", w.ref.AttemptID))
			}
		}
		q.mu.Lock()
		q.work = append(again, q.work...)
		if len(q.work) == 0 {
			q.running = false
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		time.Sleep(pause)
		pause = min(pause*2, unsentPauseMax)
	}
}

// recordOne records one never-sent attempt; false means the ledger did not
// answer, and it is tried again later.
func (m *Middleware) recordOne(w unsentWork) bool {
	ctx := context.Background()
	ref := w.ref
	if p := w.reserve; p != nil {
		// Repeating the reservation answers where it stands: the job and
		// this attempt if it was made (or makes them now, never sent
		// either way), or another request's job that this one never touched.
		repeat := *p
		repeat.Repeat = true
		res, err := ledgerCall(m, ctx, "reserve", func(ctx context.Context) (ledger.Reservation, error) {
			return m.cfg.Ledger.Reserve(ctx, repeat)
		})
		if err != nil {
			return false
		}
		if res.Attempt == nil || res.Attempt.ID != p.Attempt.ID {
			return true
		}
		ref = res.Attempt.Ref()
	}
	var err error
	if w.failed != "" {
		_, err = ledgerCall(m, ctx, "fail", func(ctx context.Context) (*ledger.Attempt, error) {
			return m.cfg.Ledger.Fail(ctx, ref, w.failed, nil)
		})
	} else {
		_, err = ledgerCall(m, ctx, "unsent", func(ctx context.Context) (struct{}, error) {
			return struct{}{}, m.cfg.Ledger.Unsent(ctx, ref)
		})
	}
	switch {
	case err == nil:
		m.cfg.Logger.Info("attempt recorded failed after a first record did not land", zap.String("job_id", ref.JobID),
			zap.String("attempt_id", ref.AttemptID), zap.Bool("sent", w.failed != ""))
	case errors.Is(err, ledger.ErrStale):
		m.cfg.Logger.Warn("failed attempt left as it is: the job changed meanwhile, or its deadline passed",
			zap.String("job_id", ref.JobID), zap.String("attempt_id", ref.AttemptID))
	case !answered(err):
		return false
	}
	return true
}
