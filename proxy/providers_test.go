package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// The multi-provider flow: failover, hedging and streamed answers, with
// in-process providers that the tests hold and release through channels.
// Durations are short and real; the tests wait for events, never for time.

const (
	primaryName  = "primary"
	fallbackName = "fallback"
	// hedgeAfter is short so that hedges start quickly; no test asserts
	// how long anything took.
	hedgeAfter = 50 * time.Millisecond
)

// gate holds a fake provider until the test opens it. It is opened on
// cleanup too, so that a test that stops early leaves no handler blocked.
type gate struct {
	ch   chan struct{}
	once sync.Once
}

func newGate(t *testing.T) *gate {
	g := &gate{ch: make(chan struct{})}
	t.Cleanup(g.open)
	return g
}

func (g *gate) open() { g.once.Do(func() { close(g.ch) }) }

// respond answers status with a text body naming the provider's call.
func respond(status int, body string) upstreamFunc {
	return func(w http.ResponseWriter, _ *http.Request, n int) error {
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(status)
		_, err := fmt.Fprintf(w, "%s %d", body, n)
		return err
	}
}

// held signals entered, waits for g without sending anything, then
// answers with fn.
func held(entered chan<- struct{}, g *gate, fn upstreamFunc) upstreamFunc {
	return func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-g.ch
		return fn(w, r, n)
	}
}

// newProviders returns a harness whose providers are a primary and a
// fallback fake; the middleware's own next handler is never used.
func newProviders(t *testing.T, cfg Config, primary, second upstreamFunc) (*harness, *fakeUpstream, *fakeUpstream) {
	t.Helper()
	p, f := &fakeUpstream{fn: primary}, &fakeUpstream{fn: second}
	cfg.Providers = []Provider{{Name: primaryName, Handler: p}, {Name: fallbackName, Handler: f}}
	h := newHarness(t, cfg, func(http.ResponseWriter, *http.Request, int) error {
		return errors.New("next called although providers are configured")
	})
	return h, p, f
}

// attemptsOf lists a job's attempts as provider/state, oldest first.
func attemptsOf(j *ledger.Job) string {
	s := make([]string, len(j.Attempts))
	for i, a := range j.Attempts {
		s[i] = a.Provider + "/" + string(a.State)
	}
	return strings.Join(s, " ")
}

// wantJob checks a job's state and its attempts (see attemptsOf).
func wantJob(t *testing.T, j *ledger.Job, state ledger.JobState, attempts string) {
	t.Helper()
	if j.State != state || attemptsOf(j) != attempts {
		t.Fatalf("job %s with attempts [%s], want %s with [%s]", j.State, attemptsOf(j), state, attempts)
	}
	for i, a := range j.Attempts {
		if a.Number != i+1 {
			t.Errorf("attempt %d is numbered %d", i+1, a.Number)
		}
	}
}

// wantAnswer checks a provider's answer as the first client got it.
func wantAnswer(t *testing.T, rec *httptest.ResponseRecorder, status int, body string) {
	t.Helper()
	if rec.Code != status || rec.Body.String() != body {
		t.Fatalf("%d %q, want %d %q", rec.Code, rec.Body, status, body)
	}
	if v := rec.Header().Get(HeaderReplayed); v != "" {
		t.Errorf("the first answer carries %s: %s", HeaderReplayed, v)
	}
}

// wantReplay checks that a retry replays the stored answer of job id.
func wantReplay(t *testing.T, rec *httptest.ResponseRecorder, id string, status int, body string) {
	t.Helper()
	if rec.Code != status || rec.Body.String() != body || rec.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %q replayed=%q, want a replay of %d %q",
			rec.Code, rec.Body, rec.Header().Get(HeaderReplayed), status, body)
	}
	if got := jobID(t, rec); got != id {
		t.Errorf("retry names job %s, want %s", got, id)
	}
}

// raceObserver counts lost races on top of countingObserver.
type raceObserver struct {
	*countingObserver
	lost atomic.Int32
}

func newRaceObserver() *raceObserver { return &raceObserver{countingObserver: newCountingObserver()} }

func (o *raceObserver) RaceLost() { o.lost.Add(1) }

func (o *raceObserver) attempt(provider, result string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.attempts[provider+"/"+result]
}

// ---- Failover.

func TestFailoverAfter503(t *testing.T) {
	h, p, f := newProviders(t, Config{}, respond(http.StatusServiceUnavailable, "primary busy"), respond(http.StatusCreated, "fallback"))
	rec := h.do(post("k", `{"amount":100}`))
	wantAnswer(t, rec, http.StatusCreated, "fallback 1")
	id := jobID(t, rec)
	if p.calls() != 1 || f.calls() != 1 {
		t.Fatalf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
	if got := p.request(0).header.Get(HeaderAttempt); got != "1" {
		t.Errorf("primary saw attempt %q", got)
	}
	got := f.request(0)
	if got.header.Get(HeaderAttempt) != "2" || got.header.Get(HeaderJobID) != id || got.header.Get(DefaultKeyHeader) != "k" {
		t.Errorf("fallback saw attempt %q of job %q with key %q", got.header.Get(HeaderAttempt), got.header.Get(HeaderJobID), got.header.Get(DefaultKeyHeader))
	}
	if string(got.body) != `{"amount":100}` {
		t.Errorf("fallback got body %q: each attempt needs the whole body", got.body)
	}
	h.waitRun()

	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/failed fallback/succeeded")
	// Each attempt tells its provider its own attempt_deadline, to the
	// second and never later than the ledger's.
	for i, seen := range []seenRequest{p.request(0), got} {
		d, err := http.ParseTime(seen.header.Get(HeaderDeadline))
		if want := j.Attempts[i].Deadline; err != nil || d.After(want) || want.Sub(d) >= time.Second {
			t.Errorf("attempt %d was sent %s %q (%v), want its deadline %v", i+1, HeaderDeadline, seen.header.Get(HeaderDeadline), err, want)
		}
	}
	if j.CompletedBy != j.Attempts[1].ID || j.Attempts[0].Error != "503" {
		t.Errorf("completed by %q, primary's error %q", j.CompletedBy, j.Attempts[0].Error)
	}
	if j.Response == nil || !j.Response.Stored || string(j.Response.Body) != "fallback 1" {
		t.Errorf("stored response %+v", j.Response)
	}
	for range 2 {
		wantReplay(t, h.do(post("k", `{"amount":100}`)), id, http.StatusCreated, "fallback 1")
	}
	if p.calls() != 1 || f.calls() != 1 {
		t.Errorf("retries called providers: primary %d, fallback %d", p.calls(), f.calls())
	}
}

func TestFailoverOnConnectError(t *testing.T) {
	errDown := errors.New("no upstreams available")
	isConnect := func(err error) bool { return errors.Is(err, errDown) }
	down := func(http.ResponseWriter, *http.Request, int) error { return fmt.Errorf("provider: %w", errDown) }

	t.Run("fails over", func(t *testing.T) {
		h, p, f := newProviders(t, Config{IsConnectError: isConnect}, down, respond(http.StatusCreated, "fallback"))
		rec := h.do(post("k", `{}`))
		wantAnswer(t, rec, http.StatusCreated, "fallback 1")
		h.waitRun()
		j := h.job(jobID(t, rec))
		wantJob(t, j, ledger.JobCompleted, "primary/failed fallback/succeeded")
		if j.Attempts[0].Error != fallback.ReasonConnect {
			t.Errorf("primary's error %q, want %q", j.Attempts[0].Error, fallback.ReasonConnect)
		}
		if p.calls() != 1 || f.calls() != 1 || f.request(0).header.Get(HeaderAttempt) != "2" {
			t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
		}
	})
	t.Run("connect_error not in failover_on", func(t *testing.T) {
		cfg := Config{IsConnectError: isConnect, FailoverOn: fallback.FailoverOn{Statuses: map[int]bool{429: true, 503: true}}}
		h, p, f := newProviders(t, cfg, down, respond(http.StatusCreated, "fallback"))
		rec := h.do(post("k", `{}`))
		prob := wantProblem(t, rec, http.StatusBadGateway, ProblemAllFailed)
		h.waitRun()
		j := h.job(prob.JobID)
		wantJob(t, j, ledger.JobFailed, "primary/failed")
		// The job is settled: the answer says when its key stops being one
		// intent, by the ledger's clock.
		if got, want := rec.Header().Get(HeaderExpires), j.ExpiresAt.UTC().Format(http.TimeFormat); j.ExpiresAt.IsZero() || got != want {
			t.Errorf("%s %q, want %q", HeaderExpires, got, want)
		}
		if f.calls() != 0 {
			t.Errorf("fallback called %d times", f.calls())
		}
		// A failed job may be retried: again on the primary only.
		wantProblem(t, h.do(post("k", `{}`)), http.StatusBadGateway, ProblemAllFailed)
		h.waitRun()
		wantJob(t, h.job(prob.JobID), ledger.JobFailed, "primary/failed primary/failed")
		if p.calls() != 2 || f.calls() != 0 {
			t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
		}
	})
	t.Run("an error that is not a connect error", func(t *testing.T) {
		reset := func(http.ResponseWriter, *http.Request, int) error { return errors.New("connection reset") }
		h, _, f := newProviders(t, Config{IsConnectError: isConnect}, reset, respond(http.StatusCreated, "fallback"))
		prob := wantProblem(t, h.do(post("k", `{}`)), http.StatusBadGateway, ProblemOutcomeUnknown)
		h.waitRun()
		wantJob(t, h.job(prob.JobID), ledger.JobUnknown, "primary/unknown")
		if f.calls() != 0 {
			t.Errorf("fallback called %d times after an unknown outcome", f.calls())
		}
	})
}

// An error of a kind that means "never left" (a TLS alert, say) that comes
// after the request was written to the provider's connection is no proof
// that it never left: the outcome is unknown, and nothing fails over. The
// provider sends the request as reverse_proxy does, over a real socket to
// a server that reads it and breaks the connection.
func TestConnectErrorAfterTheRequestWasWritten(t *testing.T) {
	read := make(chan struct{}, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		read <- struct{}{}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	upstream := func(w http.ResponseWriter, r *http.Request, _ int) error {
		out, err := http.NewRequestWithContext(r.Context(), r.Method, srv.URL, r.Body)
		if err != nil {
			return err
		}
		resp, err := client.Do(out)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return errors.New("the server answered")
	}
	// A classifier that takes every error for one before sending, as a
	// type-based one would take a TLS alert on a reused connection.
	everything := func(error) bool { return true }
	h, _, f := newProviders(t, Config{IsConnectError: everything}, upstream, respond(http.StatusCreated, "fallback"))
	prob := wantProblem(t, h.do(post("k", `{}`)), http.StatusBadGateway, ProblemOutcomeUnknown)
	recv(t, read, "the provider's server reading the request")
	h.waitRun()
	wantJob(t, h.job(prob.JobID), ledger.JobUnknown, "primary/unknown")
	if f.calls() != 0 {
		t.Errorf("fallback called %d times after a request that was written", f.calls())
	}
}

func TestEveryProviderFails(t *testing.T) {
	primary := func(w http.ResponseWriter, r *http.Request, n int) error {
		if n == 1 {
			return respond(http.StatusServiceUnavailable, "primary busy")(w, r, n)
		}
		return respond(http.StatusCreated, "primary")(w, r, n)
	}
	busy := func(w http.ResponseWriter, r *http.Request, n int) error {
		w.Header().Set("Retry-After", "9")
		return respond(http.StatusServiceUnavailable, "fallback busy")(w, r, n)
	}
	h, p, f := newProviders(t, Config{}, primary, busy)
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusServiceUnavailable, "fallback busy 1")
	if rec.Header().Get("Retry-After") != "9" {
		t.Errorf("Retry-After %q: want the last provider's headers", rec.Header().Get("Retry-After"))
	}
	id := jobID(t, rec)
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobFailed, "primary/failed fallback/failed")

	// The retry re-opens the job and starts at the primary again.
	retry := h.do(post("k", `{}`))
	wantAnswer(t, retry, http.StatusCreated, "primary 2")
	if jobID(t, retry) != id {
		t.Errorf("the retry has job %s, want %s", jobID(t, retry), id)
	}
	if p.calls() != 2 || f.calls() != 1 {
		t.Fatalf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
	if got := p.request(1).header.Get(HeaderAttempt); got != "3" {
		t.Errorf("the retry reached the primary as attempt %q, want 3", got)
	}
	h.waitRun()
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/failed fallback/failed primary/succeeded")
	if j.CompletedBy != j.Attempts[2].ID {
		t.Errorf("completed by %q", j.CompletedBy)
	}
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusCreated, "primary 2")
}

func TestStatusNotInFailoverOnIsTheResult(t *testing.T) {
	h, p, f := newProviders(t, Config{}, respond(http.StatusInternalServerError, "primary broke"), respond(http.StatusCreated, "fallback"))
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusInternalServerError, "primary broke 1")
	id := jobID(t, rec)
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobCompleted, "primary/succeeded")
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusInternalServerError, "primary broke 1")
	if p.calls() != 1 || f.calls() != 0 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
}

func TestTimeoutOnPrimaryDoesNotFailOver(t *testing.T) {
	entered := make(chan struct{}, 1)
	g := newGate(t)
	h, p, f := newProviders(t, Config{AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: patience},
		held(entered, g, respond(http.StatusServiceUnavailable, "primary busy")), respond(http.StatusCreated, "fallback"))
	rec := recv(t, h.goDo(post("k", `{}`)), "the 504")
	prob := wantProblem(t, rec, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	recv(t, entered, "the primary's call")
	wantJob(t, h.job(prob.JobID), ledger.JobUnknown, "primary/unknown")
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemOutcomeUnknown)

	// Even the primary's late 503 starts nothing on the fallback.
	g.open()
	h.waitRun()
	if p.calls() != 1 || f.calls() != 0 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
	if j := h.job(prob.JobID); len(j.Attempts) != 1 {
		t.Errorf("attempts [%s] after a timeout", attemptsOf(j))
	}
}

// After a failover, attempt_timeout watches the fallback's attempt: the
// primary's failed answer had headers, the fallback's has none yet.
func TestTimeoutOnFallbackAfterFailover(t *testing.T) {
	entered := make(chan struct{}, 1)
	g := newGate(t)
	h, _, f := newProviders(t, Config{AttemptTimeout: 100 * time.Millisecond, AttemptDeadline: patience},
		respond(http.StatusServiceUnavailable, "primary busy"), held(entered, g, respond(http.StatusCreated, "fallback")))
	rec := recv(t, h.goDo(post("k", `{}`)), "the 504")
	prob := wantProblem(t, rec, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	recv(t, entered, "the fallback's call")
	wantJob(t, h.job(prob.JobID), ledger.JobUnknown, "primary/failed fallback/unknown")

	// The fallback's late result still completes the job.
	g.open()
	h.waitRun()
	wantJob(t, h.job(prob.JobID), ledger.JobCompleted, "primary/failed fallback/succeeded")
	wantReplay(t, h.do(post("k", `{}`)), prob.JobID, http.StatusCreated, "fallback 1")
	if f.calls() != 1 {
		t.Errorf("fallback called %d times", f.calls())
	}
}

func TestIneligibleProviderGetsNoFailover(t *testing.T) {
	cfg := Config{Eligible: func(i int) bool { return i != 1 }}
	h, _, f := newProviders(t, cfg, respond(http.StatusServiceUnavailable, "primary busy"), respond(http.StatusCreated, "fallback"))
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusServiceUnavailable, "primary busy 1")
	h.waitRun()
	wantJob(t, h.job(jobID(t, rec)), ledger.JobFailed, "primary/failed")
	if f.calls() != 0 {
		t.Errorf("an ineligible fallback was called %d times", f.calls())
	}
}

func TestOversizedAnswerAfterFailover(t *testing.T) {
	const max, chunk, chunks = 64, 50, 10
	var want bytes.Buffer
	for i := range chunks {
		fmt.Fprintf(&want, "%0*d", chunk, i)
	}
	big := func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Big", "yes")
		for i := range chunks {
			if _, err := w.Write(want.Bytes()[i*chunk : (i+1)*chunk]); err != nil {
				return err
			}
		}
		return nil
	}
	h, p, f := newProviders(t, Config{MaxResponseBody: max}, respond(http.StatusServiceUnavailable, "primary busy"), big)
	rec := h.do(post("k", `{}`))
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), want.Bytes()) || rec.Header().Get("X-Big") != "yes" {
		t.Fatalf("status %d, %d bytes, X-Big %q; want all %d bytes of the fallback's answer",
			rec.Code, rec.Body.Len(), rec.Header().Get("X-Big"), want.Len())
	}
	id := jobID(t, rec)
	h.waitRun()
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/failed fallback/succeeded")
	if r := j.Response; r == nil || r.Stored || r.Size != int64(want.Len()) || len(r.Body) != 0 || r.Status != http.StatusOK {
		t.Fatalf("response %+v; want status 200, not stored, size %d", r, want.Len())
	}
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemNotStored)
	if p.calls() != 1 || f.calls() != 1 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
}

// ---- Hedging.

func TestHedgeFallbackWins(t *testing.T) {
	obs := newRaceObserver()
	entered := make(chan struct{}, 1)
	g := newGate(t)
	h, p, f := newProviders(t, Config{HedgeAfter: hedgeAfter, AttemptTimeout: patience, Observer: obs},
		held(entered, g, respond(http.StatusCreated, "primary")), respond(http.StatusCreated, "fallback"))
	rec := recv(t, h.goDo(post("k", `{}`)), "the hedge's answer")
	wantAnswer(t, rec, http.StatusCreated, "fallback 1")
	id := jobID(t, rec)
	recv(t, entered, "the primary's call")
	if got := f.request(0).header; got.Get(HeaderAttempt) != "2" || got.Get(HeaderJobID) != id {
		t.Errorf("the hedge is attempt %q of job %q", got.Get(HeaderAttempt), got.Get(HeaderJobID))
	}
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/starting fallback/succeeded")
	if j.CompletedBy != j.Attempts[1].ID {
		t.Errorf("completed by %q", j.CompletedBy)
	}
	// A retry while the primary still runs replays the winner.
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusCreated, "fallback 1")

	g.open()
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobCompleted, "primary/lost fallback/succeeded")
	if n := obs.lost.Load(); n != 1 {
		t.Errorf("%d races lost counted, want 1", n)
	}
	if obs.attempt(primaryName, "lost") != 1 || obs.attempt(fallbackName, "succeeded") != 1 {
		t.Errorf("attempts counted %v", obs.attempts)
	}
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusCreated, "fallback 1")
	if p.calls() != 1 || f.calls() != 1 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
}

func TestHedgePrimaryWins(t *testing.T) {
	obs := newRaceObserver()
	pEntered, fEntered := make(chan struct{}, 1), make(chan struct{}, 1)
	pg, fg := newGate(t), newGate(t)
	h, _, _ := newProviders(t, Config{HedgeAfter: hedgeAfter, AttemptTimeout: patience, Observer: obs},
		held(pEntered, pg, respond(http.StatusCreated, "primary")), held(fEntered, fg, respond(http.StatusCreated, "fallback")))
	recCh := h.goDo(post("k", `{}`))
	recv(t, pEntered, "the primary's call")
	recv(t, fEntered, "the hedge's call")
	pg.open()
	rec := recv(t, recCh, "the primary's answer")
	wantAnswer(t, rec, http.StatusCreated, "primary 1")
	id := jobID(t, rec)
	wantJob(t, h.job(id), ledger.JobCompleted, "primary/succeeded fallback/starting")

	fg.open()
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobCompleted, "primary/succeeded fallback/lost")
	if n := obs.lost.Load(); n != 1 {
		t.Errorf("%d races lost counted, want 1", n)
	}
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusCreated, "primary 1")
}

// A primary that sent its headers before hedge_after is not hedged. A
// canary job on the same middleware, started after those headers, shows
// that hedge_after has passed: its own hedge starts.
func TestNoHedgeOnceHeadersArrived(t *testing.T) {
	const slowHedge = 150 * time.Millisecond // leaves the primary ample time to send its headers
	headers, canaryHedged := make(chan struct{}, 1), make(chan struct{}, 1)
	g, canary := newGate(t), newGate(t)
	primary := func(w http.ResponseWriter, r *http.Request, _ int) error {
		if r.Header.Get(DefaultKeyHeader) == "canary" {
			<-canary.ch
			return respond(http.StatusCreated, "primary")(w, r, 0)
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		headers <- struct{}{}
		<-g.ch
		_, err := io.WriteString(w, "primary")
		return err
	}
	second := func(w http.ResponseWriter, r *http.Request, _ int) error {
		if r.Header.Get(DefaultKeyHeader) == "canary" {
			canaryHedged <- struct{}{}
		}
		return respond(http.StatusCreated, "fallback")(w, r, 0)
	}
	h, _, f := newProviders(t, Config{HedgeAfter: slowHedge, AttemptTimeout: patience}, primary, second)
	recCh := h.goDo(post("k", `{}`))
	recv(t, headers, "the primary's headers")
	canaryCh := h.goDo(post("canary", `{}`))
	recv(t, canaryHedged, "the canary's hedge")
	recv(t, canaryCh, "the canary's answer")

	g.open()
	rec := recv(t, recCh, "the primary's answer")
	wantAnswer(t, rec, http.StatusCreated, "primary")
	canary.open()
	h.waitRun()
	h.waitRun()
	for i := range f.calls() {
		if key := f.request(i).header.Get(DefaultKeyHeader); key != "canary" {
			t.Errorf("the fallback got a hedge for key %q after the primary's headers", key)
		}
	}
	wantJob(t, h.job(jobID(t, rec)), ledger.JobCompleted, "primary/succeeded")
}

func TestHedgeBothFail(t *testing.T) {
	pEntered, fEntered := make(chan struct{}, 1), make(chan struct{}, 1)
	pg := newGate(t)
	second := func(w http.ResponseWriter, r *http.Request, n int) error {
		fEntered <- struct{}{}
		return respond(http.StatusServiceUnavailable, "fallback busy")(w, r, n)
	}
	h, _, _ := newProviders(t, Config{HedgeAfter: hedgeAfter, AttemptTimeout: patience},
		held(pEntered, pg, respond(http.StatusServiceUnavailable, "primary busy")), second)
	recCh := h.goDo(post("k", `{}`))
	recv(t, pEntered, "the primary's call")
	recv(t, fEntered, "the hedge's call")
	pg.open()
	rec := recv(t, recCh, "the answer")
	if rec.Code != http.StatusServiceUnavailable || (rec.Body.String() != "primary busy 1" && rec.Body.String() != "fallback busy 1") {
		t.Fatalf("%d %q, want a provider's 503", rec.Code, rec.Body)
	}
	id := jobID(t, rec)
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobFailed, "primary/failed fallback/failed")
}

// A hedge's provider that panics (with anything but http.ErrAbortHandler)
// is an unknown attempt: the process survives and the other answer wins.
func TestHedgedAttemptPanics(t *testing.T) {
	type provider func(entered chan<- struct{}, g *gate) upstreamFunc
	bug := func(entered chan<- struct{}, g *gate) upstreamFunc {
		return func(http.ResponseWriter, *http.Request, int) error {
			entered <- struct{}{}
			<-g.ch
			panic("provider bug")
		}
	}
	answers := func(body string) provider {
		return func(entered chan<- struct{}, g *gate) upstreamFunc {
			return held(entered, g, respond(http.StatusCreated, body))
		}
	}
	tests := []struct {
		name            string
		primary, second provider
		body, attempts  string
	}{
		{"the hedge panics", answers("primary"), bug, "primary 1", "primary/succeeded fallback/unknown"},
		{"the primary panics", bug, answers("fallback"), "fallback 1", "primary/unknown fallback/succeeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pEntered, fEntered := make(chan struct{}, 1), make(chan struct{}, 1)
			pg, fg := newGate(t), newGate(t)
			h, _, _ := newProviders(t, Config{HedgeAfter: hedgeAfter, AttemptTimeout: patience},
				tt.primary(pEntered, pg), tt.second(fEntered, fg))
			recCh := h.goDo(post("k", `{}`))
			recv(t, pEntered, "the primary's call")
			recv(t, fEntered, "the hedge's call")
			pg.open()
			fg.open()
			rec := recv(t, recCh, "the answer")
			wantAnswer(t, rec, http.StatusCreated, tt.body)
			id := jobID(t, rec)
			h.waitRun()
			wantJob(t, h.job(id), ledger.JobCompleted, tt.attempts)
			wantReplay(t, h.do(post("k", `{}`)), id, http.StatusCreated, tt.body)
		})
	}
}

// After a failover, the fallback's attempt is hedged like the first: the
// primary's failed answer had headers, the fallback's has none.
func TestHedgeAfterFailover(t *testing.T) {
	entered := make(chan struct{}, 1)
	g := newGate(t)
	a := &fakeUpstream{fn: respond(http.StatusServiceUnavailable, "a busy")}
	b := &fakeUpstream{fn: held(entered, g, respond(http.StatusCreated, "b"))}
	c := &fakeUpstream{fn: respond(http.StatusCreated, "c")}
	h := newHarness(t, Config{
		Providers:  []Provider{{Name: "a", Handler: a}, {Name: "b", Handler: b}, {Name: "c", Handler: c}},
		HedgeAfter: hedgeAfter, AttemptTimeout: patience,
	}, nil)
	rec := recv(t, h.goDo(post("k", `{}`)), "the hedge's answer")
	wantAnswer(t, rec, http.StatusCreated, "c 1")
	recv(t, entered, "b's call")
	g.open()
	h.waitRun()
	wantJob(t, h.job(jobID(t, rec)), ledger.JobCompleted, "a/failed b/lost c/succeeded")
	if got := c.request(0).header.Get(HeaderAttempt); got != "3" {
		t.Errorf("c saw attempt %q, want 3", got)
	}
}

// ---- Streamed answers.

// serveHarness puts h's middleware behind a real server, so that a client
// sees a streamed answer as it is flushed. Closing the server waits for
// its handlers, so the cleanup first opens the gates that may hold them.
func serveHarness(t *testing.T, h *harness, gates ...*gate) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h.m.Wrap(http.NotFoundHandler()))
	t.Cleanup(func() {
		for _, g := range gates {
			g.open()
		}
		srv.Close()
	})
	return srv
}

// postTo sends srv the request post builds, so that either can retry the
// other; the caller closes the body.
func postTo(t *testing.T, srv *httptest.Server, key string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges?currency=eur", strings.NewReader(`{}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", testOwner)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(DefaultKeyHeader, key)
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// readN reads exactly n bytes of body.
func readN(t *testing.T, r io.Reader, n int) string {
	t.Helper()
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		t.Fatalf("read %d bytes: %v (got %q)", n, err, buf)
	}
	return string(buf)
}

// eventStream writes one event, flushes it, signals flushed, waits for g
// and then ends with last: an event, or a panic when last is nil.
func eventStream(flushed chan<- struct{}, g *gate, last []byte) upstreamFunc {
	return func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		if _, err := io.WriteString(w, "data: 1\n\n"); err != nil {
			return err
		}
		fl, ok := w.(http.Flusher)
		if !ok {
			return errors.New("the attempt's writer cannot flush")
		}
		fl.Flush()
		flushed <- struct{}{}
		<-g.ch
		if last == nil {
			panic(http.ErrAbortHandler) // the provider's connection broke mid-stream
		}
		_, err := w.Write(last)
		return err
	}
}

func TestStreamPassesThroughThenReplays(t *testing.T) {
	const whole = "data: 1\n\ndata: 2\n\n"
	flushed := make(chan struct{}, 1)
	g := newGate(t)
	h, p, f := newProviders(t, Config{AttemptTimeout: patience}, eventStream(flushed, g, []byte("data: 2\n\n")), respond(http.StatusCreated, "fallback"))
	srv := serveHarness(t, h, g)

	resp := postTo(t, srv, "k")
	defer resp.Body.Close()
	id := resp.Header.Get(HeaderJobID)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" || id == "" || resp.Header.Get(HeaderReplayed) != "" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	body := bufio.NewReader(resp.Body)
	// The first event arrives while the provider is still held.
	if got := readN(t, body, len("data: 1\n\n")); got != "data: 1\n\n" {
		t.Fatalf("first event %q", got)
	}
	recv(t, flushed, "the provider's flush")
	// The stream took the result slot at its headers.
	if j := h.job(id); j.State != ledger.JobCompleted || j.CompletedBy != j.Attempts[0].ID {
		t.Errorf("job %s completed by %q while streaming", j.State, j.CompletedBy)
	}

	g.open()
	rest, err := io.ReadAll(body)
	if err != nil || string(rest) != "data: 2\n\n" {
		t.Fatalf("rest of the stream %q, %v", rest, err)
	}
	h.waitRun()
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/succeeded")
	if r := j.Response; r == nil || !r.Stored || string(r.Body) != whole || r.Size != int64(len(whole)) {
		t.Fatalf("stored response %+v", j.Response)
	}

	retry := postTo(t, srv, "k")
	defer retry.Body.Close()
	replayed, err := io.ReadAll(retry.Body)
	if err != nil || retry.StatusCode != http.StatusOK || string(replayed) != whole ||
		retry.Header.Get(HeaderReplayed) != "true" || retry.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("retry: %d %q %v, headers %v", retry.StatusCode, replayed, err, retry.Header)
	}
	if p.calls() != 1 || f.calls() != 0 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
}

func TestStreamCutShortIsNotStored(t *testing.T) {
	flushed := make(chan struct{}, 1)
	g := newGate(t)
	h, p, f := newProviders(t, Config{AttemptTimeout: patience}, eventStream(flushed, g, nil), respond(http.StatusCreated, "fallback"))
	srv := serveHarness(t, h, g)

	resp := postTo(t, srv, "k")
	defer resp.Body.Close()
	id := resp.Header.Get(HeaderJobID)
	if resp.StatusCode != http.StatusOK || id == "" {
		t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
	}
	if got := readN(t, resp.Body, len("data: 1\n\n")); got != "data: 1\n\n" {
		t.Fatalf("first event %q", got)
	}
	recv(t, flushed, "the provider's flush")
	g.open()
	rest, err := io.ReadAll(resp.Body)
	if len(rest) != 0 {
		t.Errorf("more after the cut: %q", rest)
	}
	if err == nil {
		t.Error("the client read a clean end: a stream cut short must abort the connection")
	}
	h.waitRun()

	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/succeeded")
	if r := j.Response; r == nil || r.Stored || len(r.Body) != 0 || r.Status != http.StatusOK || r.Size != int64(len("data: 1\n\n")) {
		t.Fatalf("response %+v; want status 200, not stored, size %d", j.Response, len("data: 1\n\n"))
	}
	prob := wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemNotStored)
	if prob.JobID != id {
		t.Errorf("job_id %q, want %q", prob.JobID, id)
	}
	if p.calls() != 1 || f.calls() != 0 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
}

// While a hedge runs, a stream is buffered until it has won: it does not
// take the result slot at its headers, and reaches the client whole.
func TestStreamBufferedWhileHedging(t *testing.T) {
	const whole = "data: 1\n\ndata: 2\n\n"
	pEntered, flushed := make(chan struct{}, 1), make(chan struct{}, 1)
	pg, fg := newGate(t), newGate(t)
	obs := newRaceObserver()
	h, _, f := newProviders(t, Config{HedgeAfter: hedgeAfter, AttemptTimeout: patience, Observer: obs},
		held(pEntered, pg, respond(http.StatusCreated, "primary")), eventStream(flushed, fg, []byte("data: 2\n\n")))
	recCh := h.goDo(post("k", `{}`))
	recv(t, pEntered, "the primary's call")
	recv(t, flushed, "the hedge's flush")
	id := f.request(0).header.Get(HeaderJobID)
	if j := h.job(id); j.State != ledger.JobPending || j.CompletedBy != "" {
		t.Fatalf("job %s completed by %q: the hedged stream took the slot before it ended", j.State, j.CompletedBy)
	}

	fg.open()
	rec := recv(t, recCh, "the stream's answer")
	wantAnswer(t, rec, http.StatusOK, whole)
	if rec.Header().Get("Content-Type") != "text/event-stream" || jobID(t, rec) != id {
		t.Errorf("headers %v", rec.Header())
	}
	if rec.Flushed {
		t.Error("the hedged stream was flushed to the client before it had won")
	}
	j := h.job(id)
	if r := j.Response; j.CompletedBy != j.Attempts[1].ID || r == nil || !r.Stored || string(r.Body) != whole {
		t.Fatalf("completed by %q, response %+v", j.CompletedBy, j.Response)
	}

	pg.open()
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobCompleted, "primary/lost fallback/succeeded")
	if n := obs.lost.Load(); n != 1 {
		t.Errorf("%d races lost counted, want 1", n)
	}
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusOK, whole)
}

// A chunked answer that the provider flushes is streamed too, though it
// is not an event stream, and replayed whole.
func TestFlushedChunkedAnswerStreams(t *testing.T) {
	const whole = "part 1\npart 2\n"
	flushed := make(chan struct{}, 1)
	g := newGate(t)
	chunked := func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/plain")
		if _, err := io.WriteString(w, "part 1\n"); err != nil {
			return err
		}
		if err := http.NewResponseController(w).Flush(); err != nil {
			return err
		}
		flushed <- struct{}{}
		<-g.ch
		_, err := io.WriteString(w, "part 2\n")
		return err
	}
	h, _, _ := newProviders(t, Config{AttemptTimeout: patience}, chunked, respond(http.StatusCreated, "fallback"))
	srv := serveHarness(t, h, g)

	resp := postTo(t, srv, "k")
	defer resp.Body.Close()
	id := resp.Header.Get(HeaderJobID)
	if resp.StatusCode != http.StatusOK || id == "" || resp.ContentLength != -1 {
		t.Fatalf("status %d, length %d, headers %v", resp.StatusCode, resp.ContentLength, resp.Header)
	}
	if got := readN(t, resp.Body, len("part 1\n")); got != "part 1\n" {
		t.Fatalf("first chunk %q", got)
	}
	recv(t, flushed, "the provider's flush")
	g.open()
	if rest, err := io.ReadAll(resp.Body); err != nil || string(rest) != "part 2\n" {
		t.Fatalf("rest %q, %v", rest, err)
	}
	h.waitRun()
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/succeeded")
	if r := j.Response; r == nil || !r.Stored || string(r.Body) != whole {
		t.Fatalf("stored response %+v", j.Response)
	}
	wantReplay(t, h.do(post("k", `{}`)), id, http.StatusOK, whole)
}

// TestFailedHedgeKeepsTheTimeout: a hedge that answers 503 gives no answer
// headers to wait for: the silent primary still times out into a 504.
func TestFailedHedgeKeepsTheTimeout(t *testing.T) {
	pEntered, fEntered := make(chan struct{}, 1), make(chan struct{}, 1)
	pg := newGate(t)
	second := func(w http.ResponseWriter, r *http.Request, n int) error {
		fEntered <- struct{}{}
		return respond(http.StatusServiceUnavailable, "fallback busy")(w, r, n)
	}
	h, _, _ := newProviders(t, Config{HedgeAfter: 30 * time.Millisecond, AttemptTimeout: 150 * time.Millisecond, AttemptDeadline: patience},
		held(pEntered, pg, respond(http.StatusCreated, "primary")), second)
	recCh := h.goDo(post("k", `{}`))
	recv(t, pEntered, "the primary's call")
	recv(t, fEntered, "the hedge's call")
	prob := wantProblem(t, recv(t, recCh, "the 504"), http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	pg.open()
	h.waitRun()
	wantJob(t, h.job(prob.JobID), ledger.JobCompleted, "primary/succeeded fallback/failed")
}

// A definitive failure streamed to the client (no provider left to fail
// over to) is the client's answer once its headers went out: a timer that
// fires later must not write a gateway problem into it.
func TestNoGatewayErrorInsideAStartedAnswer(t *testing.T) {
	flushed := make(chan struct{}, 1)
	g := newGate(t)
	failing := func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusServiceUnavailable)
		io.WriteString(w, "data: busy\n\n")
		w.(http.Flusher).Flush()
		flushed <- struct{}{}
		<-g.ch
		_, err := io.WriteString(w, "data: bye\n\n")
		return err
	}
	only := &fakeUpstream{fn: failing}
	h := newHarness(t, Config{
		AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: patience,
		Providers: []Provider{{Name: primaryName, Handler: only}},
	}, nil)
	srv := serveHarness(t, h, g)
	resp := postTo(t, srv, "k")
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want the provider's 503", resp.StatusCode)
	}
	body := bufio.NewReader(resp.Body)
	readN(t, body, len("data: busy\n\n"))
	recv(t, flushed, "the provider's flush")
	time.Sleep(200 * time.Millisecond) // attempt_timeout passes while the answer streams
	g.open()
	rest, err := io.ReadAll(body)
	if err != nil || string(rest) != "data: bye\n\n" {
		t.Fatalf("rest of the answer %q, %v; want the provider's own bytes only", rest, err)
	}
	h.waitRun()
	if j := onlyJob(t, h.l); j.State != ledger.JobFailed {
		t.Errorf("job %s, want failed", j.State)
	}
}

// TestDeduplicatingProviderGetsTheJobID: a provider that deduplicates gets
// the job id in its header, the same for every attempt of the job and never
// the client's key; another provider still gets the client's key.
func TestDeduplicatingProviderGetsTheJobID(t *testing.T) {
	cfg := Config{FailoverOn: fallback.FailoverOn{Statuses: map[int]bool{503: true}}}
	h, p, f := newProviders(t, cfg, respond(http.StatusServiceUnavailable, "busy"), respond(http.StatusCreated, "fallback"))
	h.m.cfg.Providers[0].Deduplicates = DefaultKeyHeader
	h.m.cfg.Providers[1].Deduplicates = "X-Request-Key"
	rec := h.do(post("client-key", `{}`))
	wantAnswer(t, rec, http.StatusCreated, "fallback 1")
	job := jobID(t, rec)
	if got := p.request(0).header.Get(DefaultKeyHeader); got != job {
		t.Errorf("the deduplicating primary got %s %q, want the job id %q", DefaultKeyHeader, got, job)
	}
	fh := f.request(0).header
	if fh.Get("X-Request-Key") != job || fh.Get(DefaultKeyHeader) != "client-key" {
		t.Errorf("the fallback got X-Request-Key %q and %s %q", fh.Get("X-Request-Key"), DefaultKeyHeader, fh.Get(DefaultKeyHeader))
	}

	// Another owner's request under the same client key is another job:
	// the provider sees another value.
	r := post("client-key", `{}`)
	r.Header.Set("Authorization", "Bearer another-owner")
	other := h.do(r)
	if jobID(t, other) == job || p.request(1).header.Get(DefaultKeyHeader) != jobID(t, other) {
		t.Errorf("two owners' requests reached the provider under %q and %q", job, p.request(1).header.Get(DefaultKeyHeader))
	}
}
