package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
)

// tryResult is how one try ended, for the run loop.
type tryResult struct {
	att       ledger.Attempt
	provider  int
	verdict   fallback.Verdict
	reason    string
	status    int              // problem status for unknown
	answer    *ledger.Response // the whole answer, buffered
	committed *runOutcome      // the answer was committed before it ended
	contract  bool             // the reason is a contract breach
	broken    bool             // the connection broke after the request went out (not a timeout)
	until     time.Time        // the try's until (see try)
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
	cause    string    // why it started: causeFirst, causeFailover, causeHedge, causeResend

	// Set by commit, read by run, both on the try's own goroutine.
	committed *runOutcome // the answer was decided before it ended
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
		out := runOutcome{verdict: fallback.Failed, reason: reason, answer: head}
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
func (t *try) decided(out *runOutcome) {
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
func (t *try) run() (res *tryResult) {
	rn, m, att, provider := t.rn, t.rn.m, t.att, t.provider
	m.cfg.Observer.InFlight(1)
	defer m.cfg.Observer.InFlight(-1)

	ctx, span := startSpan(rn.base.Context(), spanAttempt)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(attrJobID.String(att.JobID), attrAttemptID.String(att.ID), attrAttempt.Int(att.Number),
			attrProvider.String(m.policy.Providers[provider]), attrCause.String(t.cause))
		defer func() { endAttempt(span, res) }()
	}
	// The lease is judged by the ledger's clock; locally it ends at
	// t.until, never later (leaseEnd).
	ctx, cancel := context.WithDeadline(ctx, t.until)
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
	if span.IsRecording() {
		traceparent(ctx, req.Header)
	}

	c := newCapture(m.cfg.MaxResponseBody, t)
	h := m.cfg.Providers[provider].Handler
	if h == nil {
		h = rn.next
	}
	err, panicked := serve(h, c, req)
	if panicked != nil && !errors.Is(asError(panicked), http.ErrAbortHandler) {
		rn.log.Error("attempt panicked", zap.String("job_id", att.JobID),
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
	if span.IsRecording() && c.wrote {
		span.SetAttributes(attrStatus.Int(c.status))
	}
	res = &tryResult{att: att, provider: provider, verdict: v, reason: reason, until: t.until,
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
			rn.log.Warn("answer breaks the contract", zap.String("job_id", att.JobID),
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
				rn.log.Error("streamed answer not recorded", zap.String("job_id", att.JobID), zap.Error(err))
			}
			if !stored {
				rn.log.Warn("answer sent before it ended was not stored", zap.String("job_id", att.JobID),
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

// endAttempt records on an attempt's span how it ended.
func endAttempt(span trace.Span, res *tryResult) {
	if res == nil {
		return // it panicked
	}
	span.SetAttributes(attrVerdict.String(res.verdict.String()))
	if res.reason != "" {
		span.SetAttributes(attrReason.String(res.reason))
	}
	if res.verdict != fallback.Result {
		span.SetStatus(codes.Error, res.verdict.String())
	}
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
