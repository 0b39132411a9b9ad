package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// final is how a job's run ended, for the client request that started it
// (result is how one try ended; the run loop turns results into this).
type final struct {
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

// result is how one try ended, for the run loop.
type result struct {
	att       ledger.Attempt
	provider  int
	verdict   fallback.Verdict
	reason    string
	status    int              // problem status for unknown
	answer    *ledger.Response // the whole answer, buffered
	committed *final           // the answer was committed before it ended
	contract  bool             // the reason is a contract breach
	broken    bool             // the connection broke after the request went out (not a timeout)
	until     time.Time        // the try's until (see try)
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
	done   chan struct{} // closed once out is decided
	ended  chan struct{} // closed when an answer passing through ends

	mu         sync.Mutex
	state      clientState
	current    ledger.Attempt // the attempt attempt_timeout watches
	running    []*try         // the tries under way, in the order they started
	runningBuf [2]*try        // running's first items, in the runner's own allocation
	streamCut  bool           // the answer that went out ended early
	out        *final         // the run's outcome, once decided

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
func (rn *runner) decide(out final) {
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
		rn.m.markUnknown(a, "attempt_timeout: no answer headers in "+rn.m.cfg.AttemptTimeout.String())
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
	results := make(chan *result, len(pol.Providers)+1)
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
		m.cfg.Logger.Warn("attempt not sent: its lease ran out before the ledger answered",
			zap.String("job_id", att.JobID), zap.String("attempt_id", att.ID), zap.String("provider", att.Provider))
		m.unsent(unsentWork{ref: att.Ref()})
		return true
	}
	// launch starts a try of att on provider p until its lease ends.
	launch := func(att ledger.Attempt, p int, until time.Time) {
		t := &try{rn: rn, att: att, provider: p, until: until}
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
		launch(first, provider, until)
		armHedge(provider)
	}
	var (
		lastFailure *result
		lastUnknown *result
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
					launch(att, next, until)
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
					if _, err := m.fail(res.att, res.reason, nil); err != nil {
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
				if na, _ := m.fail(res.att, res.reason, next); na != nil {
					if until := leaseEnd(issued, *na); !expired(*na, until) {
						m.cfg.Logger.Info("failover", zap.String("job_id", na.JobID), zap.String("from_attempt_id", res.att.ID),
							zap.String("attempt_id", na.ID), zap.String("provider", na.Provider), zap.String("after", res.reason))
						rn.watch(*na)
						latest = nextIdx
						pending++
						launch(*na, nextIdx, until)
						armHedge(nextIdx)
					}
				}
			default:
				m.cfg.Observer.Attempt(p, "unknown")
				m.markUnknown(res.att, res.reason)
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
							launch(*na, res.provider, until)
						}
					}
				}
			}
		}
	}
	// Every attempt has ended without a result for the client.
	switch {
	case lastUnknown != nil:
		rn.decide(final{verdict: fallback.Unknown, reason: lastUnknown.reason, status: lastUnknown.status, contract: lastUnknown.contract})
	case lastFailure != nil && lastFailure.att.Resend:
		// The re-send was refused while the original may still run: the
		// job stays unknown, as the retry would have been told.
		rn.decide(final{verdict: fallback.Unknown, reason: lastFailure.reason, status: http.StatusConflict})
	case lastFailure != nil:
		out := final{verdict: fallback.Failed, reason: lastFailure.reason, contract: lastFailure.contract,
			expires: m.failedExpiry(lastFailure.att.JobID)}
		if lastFailure.answer != nil && lastFailure.answer.Status != 0 && !lastFailure.contract {
			out.answer = lastFailure.answer
		}
		rn.decide(out)
	default:
		rn.decide(final{verdict: fallback.Unknown, reason: "no attempt finished", status: http.StatusBadGateway})
	}
}

// attemptStack is about the stack an attempt's handlers need (Caddy's
// reverse_proxy calls run deep).
const attemptStack = 16 << 10

// growStack gives a new goroutine that will run an attempt its stack in
// one step, while the stack is still shallow and cheap to copy, instead of
// doubling it four or five times deep inside the handlers, each time
// copying every frame: that was 8% of a fresh request's CPU.
//
//go:noinline
func growStack(i int) byte {
	var frame [attemptStack]byte
	return frame[i]
}

// A Middleware's runners run its runs and tries on goroutines kept
// between them, so that each does not start a goroutine and grow its
// stack again: a stack of that size (32 KiB with growStack's frame) is
// past the ones Go keeps cached per processor, and each took a lock on
// the heap to allocate and a copy of its frames, 3.5% of a fresh
// request's CPU in the profile. A goroutine left idle for runnerIdle ends.
// The pool is the Middleware's, not the process's: its goroutines live
// with the Middleware's own (in a testing/synctest bubble, a channel made
// outside it would hold the bubble's clock still).

const runnerIdle = 10 * time.Second

// pool hands functions to idle goroutines of its own, starting one when
// none is idle: a function never waits for another to end.
type pool struct {
	tasks chan func() // unbuffered: a send succeeds only to an idle goroutine
}

// run runs f on an idle goroutine, or on a new one.
func (p *pool) run(f func()) {
	select {
	case p.tasks <- f:
	default:
		go p.work(f)
	}
}

func (p *pool) work(f func()) {
	growStack(0)
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		f()
		f = nil // nothing of the last run is kept while idle
		idle.Reset(runnerIdle)
		select {
		case f = <-p.tasks:
		case <-idle.C:
			return
		}
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
			m.cfg.Logger.Error("hedge not started", zap.String("job_id", cur.JobID), zap.Error(err))
		}
		return 0, ledger.Attempt{}, false
	}
	m.cfg.Logger.Info("hedge started", zap.String("job_id", att.JobID), zap.String("attempt_id", att.ID),
		zap.String("provider", att.Provider), zap.String("hedged_attempt_id", cur.ID))
	return next, att, true
}

// errUncheckable is the breach of an answer too large to be checked.
var errUncheckable = errors.New("contract: the answer is larger than max_response_body and cannot be checked")

// try is one attempt against one provider, from sending the request to
// the answer's end. The run loop starts tries and reads their results; a
// try decides only about its own answer (as reverseproxy's
// proxyLoopIteration is one pass of its loop). Its capture calls headers
// and commit as the provider's answer arrives.
//
// Its phase only moves forward, each move made by one method:
//
//	trySending ──headers──▶ tryAnswering ──commit──▶ tryCommitted
//	     │                       └────────commit──▶ tryDropped
//	     └──────────commit (a failure that streams)──▶ tryCommitted
//
// While a try is trySending, attempt_timeout and the hedge timer run for
// it, and a timeout makes it unknown. Answering, its answer is buffered
// until it ends, unless it must go out before (a stream, or an answer past
// max_response_body): then commit decides, once, whether it is a result
// that takes the slot by CAS now, the last failure, or a contract breach
// to drop. What a committed answer may do to the client is clientState's
// rule: it goes out only while the client is open, and then nothing else
// reaches that client.
type try struct {
	rn       *runner
	att      ledger.Attempt
	provider int
	phase    tryPhase  // guarded by rn.mu: the run loop and timers read it
	until    time.Time // local end of the lease; a re-send's is its original's, where re-sends stop

	// Set by commit, read by run, both on the try's own goroutine.
	committed *final      // the answer was decided before it ended
	breach    error       // a contract breach seen before the answer ended
	live      *liveStream // the answer streaming to the client, which duplicates may join
}

// tryPhase is where a try stands (see try).
type tryPhase int

const (
	// trySending: the request went out; no answer worth waiting for yet
	// (a status that fails definitively is none).
	trySending tryPhase = iota
	// tryAnswering: the answer's headers arrived.
	tryAnswering
	// tryCommitted: the answer was decided before its end, and passes
	// through to the client if it was open.
	tryCommitted
	// tryDropped: the answer breaks the contract (or is too large to be
	// checked): it is no result.
	tryDropped
)

// advance moves t forward to phase; a try never moves back.
func (t *try) advance(phase tryPhase) {
	t.rn.mu.Lock()
	if t.phase < phase {
		t.phase = phase
	}
	t.rn.mu.Unlock()
}

// headers moves t to tryAnswering when its answer's headers arrive, which
// stops attempt_timeout and the hedge timer — unless the status already
// shows a definitive failure, which is no answer to wait for.
func (t *try) headers(c *capture) {
	if v, _ := t.rn.m.policy.FailoverOn.Classify(fallback.Answer{Status: c.status}); v == fallback.Failed {
		return
	}
	t.advance(tryAnswering)
	t.rn.notify()
}

// commit decides about an answer that must go out before it ends. A result
// takes the slot by CAS now and goes to the client; so does a definitive
// failure no other provider will follow. While a hedge runs, a stream is
// buffered until it has won; an answer past max_response_body is committed
// regardless.
func (t *try) commit(c *capture, overflow bool) (io.Writer, bool, bool) {
	rn, m := t.rn, t.rn.m
	if t.breach != nil {
		return nil, false, overflow // dropped: it is no result
	}
	if ct := m.cfg.Contract; ct != nil && ct.Applies(c.status) {
		if err := ct.CheckHead(c.status, c.header); err != nil {
			t.drop(err)
			return nil, false, overflow
		}
		if ct.ChecksBody() {
			if overflow {
				t.drop(errUncheckable)
				return nil, false, true
			}
			return nil, false, false // buffered until checked
		}
	}
	if !overflow && rn.hedging() {
		return nil, false, false
	}
	v, reason := m.policy.FailoverOn.Classify(fallback.Answer{Status: c.status})
	head := &ledger.Response{Status: c.status, Header: storedHeader(c.header), Size: -1}
	switch v {
	case fallback.Result:
		out := rn.complete(t.att, m.policy.Providers[t.provider], head)
		if out.won || out.storeErr != nil {
			out.sent = rn.startStream(t.att, head, out.expires)
		}
		t.decided(&out)
		if out.sent {
			if out.won && !overflow { // recorded as it goes: duplicates may join
				t.live = m.lives.open(t.att.JobID, c)
				c.live = t.live
			}
			return rn.client, out.won, true
		}
		return nil, out.won, true
	case fallback.Failed:
		if _, more := m.policy.Failover(t.provider, reason); more || rn.hedging() {
			return nil, false, overflow
		}
		out := final{verdict: fallback.Failed, reason: reason, answer: head}
		out.sent = rn.startStream(t.att, head, time.Time{})
		t.decided(&out)
		if out.sent {
			return rn.client, false, true
		}
		return nil, false, true
	}
	return nil, false, overflow
}

// decided moves t to tryCommitted with out, its answer's outcome.
func (t *try) decided(out *final) {
	t.committed = out
	t.advance(tryCommitted)
}

// drop moves t to tryDropped: its answer breaks the contract.
func (t *try) drop(breach error) {
	t.breach = breach
	t.advance(tryDropped)
}

// run sends the try's request and reports how it ended. Results that
// were committed early are recorded here; the rest by the run loop.
func (t *try) run() *result {
	rn, m, att, provider := t.rn, t.rn.m, t.att, t.provider
	m.cfg.Observer.InFlight(1)
	defer m.cfg.Observer.InFlight(-1)

	// The lease is judged by the ledger's clock; locally it ends at
	// t.until, never later (leaseEnd).
	ctx, cancel := context.WithDeadline(rn.base.Context(), t.until)
	defer cancel()
	// Whether the request left is decided by what was written, not by
	// the kind of error that came back: the HTTP transports below (a
	// reverse_proxy's) report writing the headers.
	var written atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{WroteHeaders: func() { written.Store(true) }})
	req := m.cfg.PrepareAttempt(rn.base.Clone(ctx))
	setCanonical(req.Header, HeaderJobID, att.JobID)
	setCanonical(req.Header, HeaderAttempt, strconv.Itoa(att.Number))
	setCanonical(req.Header, HeaderDeadline, att.Deadline.UTC().Format(http.TimeFormat))
	if name := m.cfg.Providers[provider].Deduplicates; name != "" {
		// A provider account shared by many owners must never see two
		// owners' requests under one key: the job id, not the client's.
		req.Header.Set(name, att.JobID)
	}
	if len(rn.body) == 0 {
		req.Body, req.ContentLength = emptyBody{}, -1
	} else {
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(rn.body)), int64(len(rn.body))
	}
	req.GetBody = nil

	c := newCapture(m.cfg.MaxResponseBody, t)
	h := m.cfg.Providers[provider].Handler
	if h == nil {
		h = rn.next
	}
	err, panicked := serve(h, c, req)
	if panicked != nil && !errors.Is(asError(panicked), http.ErrAbortHandler) {
		m.cfg.Logger.Error("attempt panicked", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Any("panic", panicked))
	}
	cut := panicked != nil || (err != nil && c.wrote)
	if ctx.Err() != nil && err == nil && !c.wrote {
		err = ctx.Err()
	}
	if err == nil && panicked == nil && !c.wrote {
		// A handler that returns without writing answers 200 with no
		// body, as net/http sends it; status 0 cannot be written or replayed.
		c.WriteHeader(http.StatusOK)
	}
	ans := fallback.Answer{Status: c.status, Err: err, Cut: cut}
	if err != nil && !c.wrote && !written.Load() {
		ans.Connect = m.cfg.IsConnectError(err)
	}
	v, reason := m.policy.FailoverOn.Classify(ans)
	if att.Resend && c.wrote && resendPending(c.status) {
		v, reason = fallback.Failed, "re-send answered "+strconv.Itoa(c.status)+": the original is in progress or was not taken"
	}
	timedOut := errors.Is(err, context.DeadlineExceeded) || isTimeout(err)
	res := &result{att: att, provider: provider, verdict: v, reason: reason, until: t.until,
		broken: v == fallback.Unknown && (cut || (err != nil && !timedOut))}
	if v == fallback.Result && m.cfg.Contract != nil && m.cfg.Contract.Applies(c.status) {
		breach := t.breach
		if breach == nil && t.committed == nil {
			if breach = m.cfg.Contract.Check(c.status, c.header, c.buf.Bytes(), rn.body); breach != nil {
				t.drop(breach)
			}
		}
		if breach != nil {
			// A breach is never a result. With contract in failover_on it
			// is a definitive failure; otherwise the provider may have acted.
			res.reason, res.contract = breach.Error(), true
			res.verdict = fallback.Unknown
			if m.policy.FailoverOn.Contract {
				res.verdict = fallback.Failed
			}
			m.cfg.Logger.Warn("answer breaks the contract", zap.String("job_id", att.JobID),
				zap.String("attempt_id", att.ID), zap.String("provider", m.policy.Providers[provider]), zap.Error(breach))
			res.status = http.StatusBadGateway
			return res
		}
	}

	if hc := t.committed; hc != nil {
		if t.live != nil {
			t.live.end(cut)
			defer m.lives.close(att.JobID) // once the ledger holds the body
		}
		if hc.won {
			stored := c.recording && !c.truncated && !cut
			var body []byte
			if stored {
				body = c.buf.Bytes()
			}
			if err := m.saveBody(att, body, c.size, stored); err != nil {
				m.cfg.Logger.Error("streamed answer not recorded", zap.String("job_id", att.JobID), zap.Error(err))
			}
			if !stored {
				m.cfg.Logger.Warn("answer sent before it ended was not stored", zap.String("job_id", att.JobID),
					zap.String("attempt_id", att.ID), zap.Int64("size", c.size), zap.Bool("cut_short", cut))
			}
		}
		if hc.sent {
			rn.endStream(cut)
		}
		if hc.verdict == fallback.Failed {
			res.verdict, res.reason = fallback.Failed, hc.reason
		} else {
			res.verdict = fallback.Result
		}
		res.committed = hc
		return res
	}
	res.answer = &ledger.Response{Status: c.status, Header: storedHeader(c.header), Body: c.buf.Bytes(), Size: c.size, Stored: true}
	if v == fallback.Unknown {
		res.status = http.StatusBadGateway
		if timedOut {
			res.status = http.StatusGatewayTimeout
		}
	}
	return res
}

// complete offers an answer to the job by CAS, after the earlier result
// the ledger did not take, if there is one: a later result never wins
// over it, and while the ledger does not take it, the later one is not
// offered at all (its attempt is unknown).
func (rn *runner) complete(att ledger.Attempt, provider string, answer *ledger.Response) final {
	m := rn.m
	rn.offering <- struct{}{}
	defer func() { <-rn.offering }()
	if u := rn.unstored; u != nil {
		if _, err := m.complete(u.att, *u.answer); err != nil {
			m.cfg.Logger.Error("result not offered: an earlier one the ledger did not take comes first", zap.String("job_id", att.JobID),
				zap.String("attempt_id", att.ID), zap.String("earlier_attempt_id", u.att.ID), zap.Error(err))
			m.markUnknown(att, "result not offered: an earlier result the ledger did not take comes first")
			m.cfg.Observer.Attempt(provider, "unknown")
			return final{verdict: fallback.Result, answer: answer, storeErr: err}
		}
		rn.unstored = nil
	}
	c, err := m.complete(att, *answer)
	switch {
	case err != nil:
		// The client still gets the answer; the job stays unreconciled
		// (pending, then unknown) and is never re-executed.
		m.cfg.Logger.Error("result not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
		m.cfg.Observer.Attempt(provider, "unknown")
		rn.unstored = &offer{att: att, answer: answer}
		return final{verdict: fallback.Result, answer: answer, storeErr: err}
	case c.Won:
		m.cfg.Observer.Attempt(provider, "succeeded")
		return final{verdict: fallback.Result, answer: answer, won: true, expires: c.Job.ExpiresAt}
	}
	m.lost(att, c.Job, provider)
	return final{verdict: fallback.Result, answer: answer, job: c.Job}
}

func (m *Middleware) lost(att ledger.Attempt, j *ledger.Job, provider string) {
	m.cfg.Observer.Attempt(provider, "lost")
	m.cfg.Observer.RaceLost()
	winner := ""
	if j != nil {
		winner = j.CompletedBy
	}
	m.cfg.Logger.Warn("result discarded: the attempt lost the race", zap.String("job_id", att.JobID),
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

// serve calls h, turning a panic into a value.
func serve(h Handler, w http.ResponseWriter, r *http.Request) (err error, panicked any) {
	defer func() {
		if p := recover(); p != nil {
			panicked = p
		}
	}()
	return h.ServeHTTP(w, r), nil
}

func asError(p any) error {
	if err, ok := p.(error); ok {
		return err
	}
	return fmt.Errorf("%v", p)
}

func isTimeout(err error) bool {
	if err == nil {
		return false // before t, which errors.As makes escape: an allocation
	}
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
