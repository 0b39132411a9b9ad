package proxy

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// runOutcome is how a job's run ended, for the client request that started it
// (tryResult is how one try ended; the run loop turns those into this).
type runOutcome struct {
	verdict  fallback.Verdict
	reason   string
	status   int              // the problem status for unknown (502, 504)
	answer   *ledger.Response // the provider's answer, when there is one
	won      bool             // the answer won the result slot
	expires  time.Time        // when the job's key stops being one intent, if known
	job      *ledger.Job      // the job after a lost CAS
	sent     bool             // the answer already went to the client
	contract bool             // the reason is a contract breach
	storeErr error            // the ledger could not record the outcome
}

// clientState is where the answer to the client that started a run
// stands. It moves only forward, out of clientOpen, once: every move of a
// run that concerns the client (answering 504 at attempt_timeout, starting
// a hedge, failing over, sending an answer's headers) is allowed only while
// the state is clientOpen. So once an answer's headers went out, nothing
// but that answer reaches the client: if it ends early, the client's
// connection is cut (docs/contract.md, rule 7).
type clientState int

const (
	// clientOpen: nothing went to the client yet.
	clientOpen clientState = iota
	// clientStreaming: an answer's headers went out; it is the client's
	// answer whatever the run decides.
	clientStreaming
	// clientTimedOut: the client was told 504 at attempt_timeout; the
	// attempts go on detached, with no failover and no hedge.
	clientTimedOut
	// clientSettled: the run decided the client's outcome before anything
	// went out; the client's goroutine writes it.
	clientSettled
)

// runner runs a job's attempts — one provider after another, and a hedge
// beside the running one — in goroutines detached from the client: they
// keep going when the client leaves, each bounded by its deadline.
type runner struct {
	m      *Middleware
	base   *http.Request // the detached upstream request
	next   Handler
	body   []byte
	client *client
	wake   chan struct{} // a value after each change the client watches
	log    *zap.Logger   // the gateway's, with the request's trace id (jobLog)
	done   chan struct{} // closed once out is decided
	ended  chan struct{} // closed when an answer passing through ends

	mu         sync.Mutex
	state      clientState
	current    ledger.Attempt // the attempt attempt_timeout watches
	running    []*try         // the tries under way, in the order they started
	runningBuf [2]*try        // running's first items, in the runner's own allocation
	streamCut  bool           // the answer that went out ended early
	out        *runOutcome    // the run's outcome, once decided

	// Results are offered to the job one at a time, and the first one the
	// ledger did not take (no reply came) is offered again before any
	// later one: it finished first, and its client may hold it. The turn
	// is a token in offering, not a mutex: an offer waits on ledger calls,
	// and a try that waits for its turn meanwhile waits on a channel, as
	// every wait on the ledger does (and as testing/synctest can see).
	offering chan struct{}
	unstored *offer
}

// offer is a result offered to the job by CAS.
type offer struct {
	att    ledger.Attempt
	answer *ledger.Response
}

func newRunner(m *Middleware, base *http.Request, next Handler, body []byte, w http.ResponseWriter, first ledger.Attempt) *runner {
	rn := &runner{
		m: m, base: base, next: next, body: body,
		client:   &client{w: w},
		log:      m.jobLog(base.Context()),
		wake:     make(chan struct{}, 1),
		offering: make(chan struct{}, 1),
		done:     make(chan struct{}),
		ended:    make(chan struct{}),
		current:  first, // known before the runner starts, for an early timeout
	}
	rn.running = rn.runningBuf[:0]
	return rn
}

func (rn *runner) notify() {
	select {
	case rn.wake <- struct{}{}:
	default:
	}
}

// watched returns the attempt attempt_timeout watches and whether any
// answer headers arrived.
func (rn *runner) watched() (ledger.Attempt, bool) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.current, rn.answering()
}

// watch makes a the attempt attempt_timeout watches: the one a failover
// or a re-send started.
func (rn *runner) watch(a ledger.Attempt) {
	rn.mu.Lock()
	rn.current = a
	rn.mu.Unlock()
	rn.notify()
}

// open reports whether nothing went to the client yet: the one condition
// of every move that concerns the client. rn.mu must be held.
func (rn *runner) open() bool { return rn.state == clientOpen }

// answering reports whether a running try is past trySending, or an
// answer is passing through to the client, which stops attempt_timeout and
// the hedge timer. rn.mu must be held.
func (rn *runner) answering() bool {
	if rn.state == clientStreaming {
		return true
	}
	for _, t := range rn.running {
		if t.phase != trySending {
			return true
		}
	}
	return false
}

// decide sets the run's outcome, once. While the client is open, that
// outcome is its answer.
func (rn *runner) decide(out runOutcome) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.out != nil {
		return
	}
	rn.out = &out
	if rn.open() {
		rn.state = clientSettled
	}
	close(rn.done)
}

// timeout is called by the client's goroutine when attempt_timeout passed
// without answer headers: every running attempt without headers becomes
// unknown. It reports false when headers (or the outcome) won the race.
func (rn *runner) timeout(att ledger.Attempt) bool {
	rn.mu.Lock()
	if !rn.open() || rn.answering() || rn.current.ID != att.ID {
		rn.mu.Unlock()
		return false
	}
	rn.state = clientTimedOut
	var stale []ledger.Attempt
	for _, t := range rn.running {
		if t.phase == trySending {
			stale = append(stale, t.att)
		}
	}
	if len(rn.running) == 0 {
		stale = append(stale, att) // the runner has not started it yet
	}
	rn.mu.Unlock()
	for _, a := range stale {
		rn.markUnknown(a, "attempt_timeout: no answer headers in "+rn.m.cfg.AttemptTimeout.String())
	}
	return true
}

// started reports whether an answer's headers went out to the client:
// from then on that answer is the client's, whatever else happens.
func (rn *runner) started() bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.state == clientStreaming
}

// endStream records that the answer passing through to the client ended,
// whole or cut short.
func (rn *runner) endStream(cut bool) {
	rn.mu.Lock()
	rn.streamCut = cut
	rn.mu.Unlock()
	close(rn.ended)
}

// streamEnded waits for the end of the answer passing through to the
// client and reports whether it was cut short.
func (rn *runner) streamEnded() (cut bool) {
	<-rn.ended
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.streamCut
}

// leave detaches the client unless an answer is streaming to it; it
// reports whether the client's goroutine may return.
func (rn *runner) leave() bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.state == clientStreaming {
		return false
	}
	rn.client.detach()
	return true
}

// hedging reports whether more than one attempt is running.
func (rn *runner) hedging() bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return len(rn.running) > 1
}

func (rn *runner) run(first ledger.Attempt, provider int, until time.Time, release func()) {
	defer release()
	m := rn.m
	pol := &m.policy
	// Pointers, not results: a result is a few hundred bytes, and a
	// channel's buffer is allocated whole for every run.
	results := make(chan *tryResult, len(pol.Providers)+1)
	// Without hedging, attempts run one at a time: each runs on this
	// goroutine, its result waiting in the channel for the loop below.
	inline := pol.HedgeAfter <= 0
	// expired reports whether att's lease, ending at until (leaseEnd), ran
	// out before it could be sent (a repeated ledger call answered late).
	// Such an attempt is never sent: its provider may drop it by then, or
	// a lookup judge it absent. It is recorded as never sent.
	expired := func(att ledger.Attempt, until time.Time) bool {
		if att.State == ledger.AttemptStarting && time.Now().Before(until) {
			return false
		}
		rn.log.Warn("attempt not sent: its lease ran out before the ledger answered",
			zap.String("job_id", att.JobID), zap.String("attempt_id", att.ID), zap.String("provider", att.Provider))
		m.unsent(unsentWork{ref: att.Ref()})
		return true
	}
	// launch starts a try of att on provider p until its lease ends;
	// cause says why, when it is not the job's first attempt or a re-send.
	launch := func(att ledger.Attempt, p int, until time.Time, cause string) {
		if att.Resend {
			cause = causeResend
		}
		t := &try{rn: rn, att: att, provider: p, until: until, cause: cause}
		rn.mu.Lock()
		rn.running = append(rn.running, t)
		rn.mu.Unlock()
		if inline {
			results <- t.run()
			return
		}
		rn.m.runners.run(func() { results <- t.run() })
	}
	var (
		hedge  *time.Timer
		hedgeC <-chan time.Time
	)
	armHedge := func(from int) {
		if _, ok := pol.Hedge(from); ok {
			hedge = time.NewTimer(pol.HedgeAfter)
			hedgeC = hedge.C
		}
	}
	defer func() {
		if hedge != nil {
			hedge.Stop()
		}
	}()

	latest := provider // the last provider tried: failover and hedges go past it
	pending := 0
	if !expired(first, until) {
		pending++
		launch(first, provider, until, causeFirst)
		armHedge(provider)
	}
	var (
		lastFailure *tryResult
		lastUnknown *tryResult
	)
	for pending > 0 {
		select {
		case <-hedgeC:
			hedgeC = nil
			issued := time.Now()
			if next, att, ok := rn.startHedge(latest); ok {
				if until := leaseEnd(issued, att); !expired(att, until) {
					latest = next
					pending++
					launch(att, next, until, causeHedge)
				}
			}
		case res := <-results:
			pending--
			rn.mu.Lock()
			rn.running = slices.DeleteFunc(rn.running, func(t *try) bool { return t.att.ID == res.att.ID })
			open := rn.open()
			rn.mu.Unlock()
			p := pol.Providers[res.provider]
			switch {
			case res.committed != nil:
				if res.verdict == fallback.Failed {
					m.cfg.Observer.Attempt(p, "failed")
					if _, err := rn.fail(res.att, res.reason, nil); err != nil {
						res.committed.storeErr = err
					}
				}
				rn.decide(*res.committed)
			case res.verdict == fallback.Result:
				rn.decide(rn.complete(res.att, p, res.answer))
			case res.verdict == fallback.Failed:
				m.cfg.Observer.Attempt(p, "failed")
				lastFailure = res
				var next *ledger.NextAttempt
				nextIdx := 0
				if pending == 0 && open && !res.att.Resend { // a re-send never fails over: its original may have acted
					if i, ok := pol.Failover(latest, res.reason); ok {
						na := m.newAttempt(pol.Providers[i])
						next = &na
						nextIdx = i
					}
				}
				issued := time.Now()
				if na, _ := rn.fail(res.att, res.reason, next); na != nil {
					if until := leaseEnd(issued, *na); !expired(*na, until) {
						rn.log.Info("failover", zap.String("job_id", na.JobID), zap.String("from_attempt_id", res.att.ID),
							zap.String("attempt_id", na.ID), zap.String("provider", na.Provider), zap.String("after", res.reason))
						rn.watch(*na)
						latest = nextIdx
						pending++
						launch(*na, nextIdx, until, causeFailover)
						armHedge(nextIdx)
					}
				}
			default:
				m.cfg.Observer.Attempt(p, "unknown")
				rn.markUnknown(res.att, res.reason)
				lastUnknown = res
				// A broken connection to a provider that deduplicates is
				// sent again, while the client waits and until the
				// original attempt's deadline (never after a timeout:
				// the original still runs there).
				if res.broken && open && pending == 0 && m.cfg.Providers[res.provider].Deduplicates != "" &&
					time.Now().Before(res.until) {
					issued := time.Now()
					if na, err := m.resend(res.att.Ref(), res.provider); err == nil {
						until := leaseEnd(issued, *na)
						if res.until.Before(until) {
							until = res.until // re-sends stop at the original's deadline
						}
						if !expired(*na, until) {
							rn.watch(*na)
							pending++
							launch(*na, res.provider, until, causeResend)
						}
					}
				}
			}
		}
	}
	// Every attempt has ended without a result for the client.
	switch {
	case lastUnknown != nil:
		rn.decide(runOutcome{verdict: fallback.Unknown, reason: lastUnknown.reason, status: lastUnknown.status, contract: lastUnknown.contract})
	case lastFailure != nil && lastFailure.att.Resend:
		// The re-send was refused while the original may still run: the
		// job stays unknown, as the retry would have been told.
		rn.decide(runOutcome{verdict: fallback.Unknown, reason: lastFailure.reason, status: http.StatusConflict})
	case lastFailure != nil:
		out := runOutcome{verdict: fallback.Failed, reason: lastFailure.reason, contract: lastFailure.contract,
			expires: m.failedExpiry(lastFailure.att.JobID)}
		if lastFailure.answer != nil && lastFailure.answer.Status != 0 && !lastFailure.contract {
			out.answer = lastFailure.answer
		}
		rn.decide(out)
	default:
		rn.decide(runOutcome{verdict: fallback.Unknown, reason: "no attempt finished", status: http.StatusBadGateway})
	}
}

// startHedge starts a concurrent attempt on the provider after latest, when
// the watched attempt still has no answer headers.
func (rn *runner) startHedge(latest int) (int, ledger.Attempt, bool) {
	m := rn.m
	rn.mu.Lock()
	skip := !rn.open() || rn.answering() || len(rn.running) == 0
	cur := rn.current
	rn.mu.Unlock()
	next, ok := m.policy.Hedge(latest)
	if skip || !ok {
		return 0, ledger.Attempt{}, false
	}
	att, err := m.hedge(cur.Ref(), m.newAttempt(m.policy.Providers[next]))
	if err != nil {
		if !errors.Is(err, ledger.ErrStale) {
			rn.log.Error("hedge not started", zap.String("job_id", cur.JobID), zap.Error(err))
		}
		return 0, ledger.Attempt{}, false
	}
	rn.log.Info("hedge started", zap.String("job_id", att.JobID), zap.String("attempt_id", att.ID),
		zap.String("provider", att.Provider), zap.String("hedged_attempt_id", cur.ID))
	return next, att, true
}

// execute runs the job's attempts in a detached goroutine and answers the
// client with the outcome, a 504 when the first answer's headers do not
// come within attempt_timeout. The first attempt's lease ends at until
// (leaseEnd).
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next Handler, res ledger.Reservation, until time.Time, body []byte) error {
	base := r.WithContext(context.WithValue(context.WithoutCancel(r.Context()), guardedKey{}, true))
	rn := newRunner(m, base, next, body, w, *res.Attempt)
	first, provider, release := *res.Attempt, m.policy.Index(res.Attempt.Provider), m.cfg.Hold()
	m.runners.run(func() { rn.run(first, provider, until, release) })

	timer := time.NewTimer(m.cfg.AttemptTimeout)
	defer timer.Stop()
	watched := ""
	for {
		att, headers := rn.watched()
		if att.ID != watched && att.ID != "" {
			watched = att.ID
			timer.Reset(m.cfg.AttemptTimeout)
			m.cfg.SetVar(r, "attempt", strconv.Itoa(att.Number))
		}
		if headers {
			timer.Stop()
		}
		select {
		case <-rn.done:
			if rn.started() {
				// An answer's headers went out: it is the client's answer,
				// whatever the run decided. Once it ends early, abort the
				// connection, so that the client sees it cut short; never
				// write a gateway answer into it.
				if rn.streamEnded() {
					panic(http.ErrAbortHandler)
				}
				return nil
			}
			m.answer(w, r, *rn.out, res.Job.ID)
			return nil
		case <-rn.wake:
		case <-timer.C:
			if rn.timeout(att) {
				rn.client.detach()
				rn.log.Warn("attempt outcome unknown: timed out", zap.String("job_id", att.JobID),
					zap.String("attempt_id", att.ID), zap.Int("attempt", att.Number))
				problem(http.StatusGatewayTimeout, ProblemOutcomeUnknown, "Attempt timed out").
					withDetail("The provider did not answer within attempt_timeout. The job's outcome is unknown; it will not be re-run.").
					withJob(res.Job.ID).Write(w)
				return nil
			}
		case <-r.Context().Done():
			if rn.leave() {
				return nil
			}
			rn.streamEnded() // an answer is streaming: wait for its end
			return nil
		}
	}
}
