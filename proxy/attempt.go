package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// verdict is what an attempt's answer says about the job.
type verdict int

const (
	verdictResult  verdict = iota // the job's result
	verdictFailed                 // definitive: the provider did not act
	verdictUnknown                // the provider may have acted
)

// classify judges an attempt's answer (status, or 0 when none was written)
// and its handler error. connect is whether err means nothing was sent.
func (m *Middleware) classify(status int, err error, cut bool) (verdict, string) {
	switch {
	case err != nil && status == 0 && m.cfg.IsConnectError(err):
		return verdictFailed, "connect_error"
	case cut:
		return verdictUnknown, "answer cut short"
	case err != nil && status == 0:
		return verdictUnknown, "upstream error: " + err.Error()
	case status == 499:
		return verdictUnknown, "request cancelled below the gateway (499)"
	case m.cfg.FailoverOn.Statuses[status]:
		return verdictFailed, strconv.Itoa(status)
	}
	return verdictResult, ""
}

// final is how a job's run ended, for the client request that started it.
type final struct {
	verdict  verdict
	reason   string
	status   int              // the problem status for unknown (502, 504)
	answer   *ledger.Response // the provider's answer, when there is one
	won      bool             // the answer won the result slot
	job      *ledger.Job      // the job after a lost CAS
	sent     bool             // the answer already went to the client
	storeErr error            // the ledger could not record the outcome
}

// runner runs a job's attempts, one provider after another, in its own
// goroutine detached from the client: it keeps going when the client
// leaves, bounded by each attempt's deadline.
type runner struct {
	m      *Middleware
	base   *http.Request // the detached upstream request
	next   Handler
	body   []byte
	client *client
	wake   chan struct{} // a value after each change of state below
	done   chan struct{} // closed with out set

	mu        sync.Mutex
	att       ledger.Attempt
	provider  int
	headers   bool // the current attempt's answer has headers
	timedOut  bool // the client was told 504: no failover, job unknown
	streaming bool // the answer is passing through to the client
	out       final
}

func (rn *runner) notify() {
	select {
	case rn.wake <- struct{}{}:
	default:
	}
}

// current returns the running attempt and whether its headers arrived.
func (rn *runner) current() (ledger.Attempt, bool) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.att, rn.headers
}

// timeout is called by the client's goroutine when attempt_timeout passed
// without headers. It reports false when headers won the race.
func (rn *runner) timeout(att ledger.Attempt) bool {
	rn.mu.Lock()
	if rn.headers || rn.att.ID != att.ID {
		rn.mu.Unlock()
		return false
	}
	rn.timedOut = true
	rn.mu.Unlock()
	rn.m.markUnknown(att, "attempt_timeout: no answer headers in "+rn.m.cfg.AttemptTimeout.String())
	return true
}

// leave detaches the client unless an answer is streaming to it; it
// reports whether the client's goroutine may return.
func (rn *runner) leave() bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.streaming {
		return false
	}
	rn.client.detach()
	return true
}

func (rn *runner) run(att ledger.Attempt, provider int, release func()) {
	defer release()
	defer close(rn.done)
	m := rn.m
	for {
		rn.mu.Lock()
		rn.att, rn.provider, rn.headers = att, provider, false
		rn.mu.Unlock()
		rn.notify()
		out, next := rn.attempt(att, provider)
		if next == nil {
			rn.mu.Lock()
			rn.out = out
			rn.mu.Unlock()
			return
		}
		att, provider = *next, provider+1
		m.cfg.Logger.Info("failover", zap.String("job_id", att.JobID),
			zap.Int("attempt", att.Number), zap.String("provider", att.Provider), zap.String("after", out.reason))
	}
}

// attempt sends one attempt and records its outcome. It returns the next
// attempt when the job fails over.
func (rn *runner) attempt(att ledger.Attempt, provider int) (final, *ledger.Attempt) {
	m := rn.m
	p := m.cfg.Providers[provider]
	m.cfg.Observer.InFlight(1)
	defer m.cfg.Observer.InFlight(-1)

	// The lease is judged by the ledger's clock; locally it is measured
	// from now, as the attempt has just started.
	ctx, cancel := context.WithTimeout(rn.base.Context(), att.Deadline.Sub(att.StartedAt))
	defer cancel()
	req := m.cfg.PrepareAttempt(rn.base.Clone(ctx))
	req.Header.Set(HeaderJobID, att.JobID)
	req.Header.Set(HeaderAttempt, strconv.Itoa(att.Number))
	if len(rn.body) == 0 {
		req.Body, req.ContentLength = emptyBody{}, -1
	} else {
		req.Body, req.ContentLength = io.NopCloser(bytes.NewReader(rn.body)), int64(len(rn.body))
	}
	req.GetBody = nil

	var committed *final // set when an overflowing answer took the slot early
	c := newCapture(m.cfg.MaxResponseBody, func() {
		rn.mu.Lock()
		rn.headers = true
		rn.mu.Unlock()
		rn.notify()
	}, func(c *capture) io.Writer {
		committed = rn.overflow(att, provider, c)
		if committed != nil && committed.sent {
			return rn.client
		}
		return nil
	})

	h := p.Handler
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
	status := c.status
	v, reason := m.classify(status, err, cut)

	if committed != nil {
		return rn.finishOverflow(att, c, *committed, v, reason), nil
	}

	answer := &ledger.Response{Status: status, Header: storedHeader(c.header), Body: c.buf.Bytes(), Size: c.size, Stored: true}
	switch v {
	case verdictResult:
		return rn.complete(att, p.Name, answer), nil
	case verdictFailed:
		rn.mu.Lock()
		timedOut := rn.timedOut
		rn.mu.Unlock()
		var next *ledger.NextAttempt
		if provider+1 < len(m.cfg.Providers) && !timedOut && m.failsOver(reason) {
			next = &ledger.NextAttempt{Provider: m.cfg.Providers[provider+1].Name, Lease: m.cfg.AttemptDeadline}
		}
		m.cfg.Observer.Attempt(p.Name, "failed")
		na, ferr := m.fail(att, reason, next)
		if ferr == nil && na != nil {
			return final{}, na
		}
		out := final{verdict: verdictFailed, reason: reason, storeErr: ferr}
		if status != 0 {
			out.answer = answer
		}
		return out, nil
	default:
		m.cfg.Observer.Attempt(p.Name, "unknown")
		m.markUnknown(att, reason)
		ps := http.StatusBadGateway
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			ps = http.StatusGatewayTimeout
		}
		return final{verdict: verdictUnknown, reason: reason, status: ps}, nil
	}
}

// failsOver reports whether a definitive failure lets the next provider try.
func (m *Middleware) failsOver(reason string) bool {
	if reason == "connect_error" {
		return m.cfg.FailoverOn.ConnectError
	}
	return true // a status in failover_on
}

// complete offers an answer to the job by CAS.
func (rn *runner) complete(att ledger.Attempt, provider string, answer *ledger.Response) final {
	m := rn.m
	c, err := m.complete(att, *answer)
	switch {
	case err != nil:
		// The client still gets the answer; the job stays unreconciled
		// (pending, then unknown) and is never re-executed.
		m.cfg.Logger.Error("result not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
		m.cfg.Observer.Attempt(provider, "unknown")
		return final{verdict: verdictResult, answer: answer, storeErr: err}
	case c.Won:
		m.cfg.Observer.Attempt(provider, "succeeded")
		return final{verdict: verdictResult, answer: answer, won: true}
	}
	m.lost(att, c.Job, provider)
	return final{verdict: verdictResult, answer: answer, job: c.Job}
}

func (m *Middleware) lost(att ledger.Attempt, j *ledger.Job, provider string) {
	m.cfg.Observer.Attempt(provider, "lost")
	m.cfg.Observer.RaceLost()
	winner := ""
	if j != nil {
		winner = j.CompletedBy
	}
	m.cfg.Logger.Warn("result discarded: the attempt lost the race", zap.String("job_id", att.JobID),
		zap.String("attempt_id", att.ID), zap.Int("attempt", att.Number), zap.String("winner_attempt_id", winner))
}

// overflow handles an answer larger than max_response_body, before any of
// it goes out: a result takes the slot by CAS now, unstored, and streams to
// the client; a final definitive failure streams as is; anything else is
// dropped.
func (rn *runner) overflow(att ledger.Attempt, provider int, c *capture) *final {
	m := rn.m
	v, reason := m.classify(c.status, nil, false)
	last := provider+1 >= len(m.cfg.Providers)
	switch {
	case v == verdictResult:
		head := ledger.Response{Status: c.status, Header: storedHeader(c.header), Size: -1}
		out := rn.complete(att, m.cfg.Providers[provider].Name, &head)
		out.answer = &head
		if out.won || out.storeErr != nil {
			out.sent = rn.startStream(att, c)
		}
		return &out
	case v == verdictFailed && last:
		out := final{verdict: verdictFailed, reason: reason}
		out.sent = rn.startStream(att, c)
		return &out
	}
	return nil
}

// startStream sends the answer's headers to the client, if it is still
// there, and marks the answer as passing through.
func (rn *runner) startStream(att ledger.Attempt, c *capture) bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.timedOut || !rn.client.tryLock() {
		return false
	}
	defer rn.client.mu.Unlock()
	rn.streaming = true
	h := rn.client.w.Header()
	for k, v := range c.header {
		h[k] = v
	}
	h.Set(HeaderJobID, att.JobID)
	rn.client.w.WriteHeader(c.status)
	return true
}

// finishOverflow records the end of an answer that took the slot early.
func (rn *runner) finishOverflow(att ledger.Attempt, c *capture, out final, v verdict, reason string) final {
	m := rn.m
	if out.won {
		if err := m.saveBody(att, c.size); err != nil {
			m.cfg.Logger.Error("answer size not recorded", zap.String("job_id", att.JobID), zap.Error(err))
		}
		if v == verdictUnknown {
			m.cfg.Logger.Warn("answer cut short after it won: not stored", zap.String("job_id", att.JobID),
				zap.String("attempt_id", att.ID), zap.String("reason", reason))
		}
	}
	if out.verdict == verdictFailed {
		m.cfg.Observer.Attempt(m.cfg.Providers[len(m.cfg.Providers)-1].Name, "failed")
		if _, err := m.fail(att, out.reason, nil); err != nil {
			out.storeErr = err
		}
	}
	return out
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
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}
