package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// dedupProvider is a provider that honours Idempotency-Key as its own
// idempotency key, as payment APIs do: the first request for a key does the
// work once (a side effect); a request for a key whose work is still
// running is answered 409; one for a key done is answered the stored
// answer. break_ makes the answers to a call number fail after the work, as
// a connection that broke on the way back.
type dedupProvider struct {
	mu      sync.Mutex
	effects map[string]int    // side effects per key
	done    map[string]string // stored answers
	running map[string]bool
	hold    chan struct{}  // when set, the work waits for it
	breaks  map[int]bool   // call numbers whose answer is lost
	keys    map[int]string // the key each call carried
}

func newDedupProvider() *dedupProvider {
	return &dedupProvider{effects: map[string]int{}, done: map[string]string{}, running: map[string]bool{},
		breaks: map[int]bool{}, keys: map[int]string{}}
}

func (d *dedupProvider) serve(w http.ResponseWriter, r *http.Request, n int) error {
	key := r.Header.Get(DefaultKeyHeader)
	d.mu.Lock()
	d.keys[n] = key
	if answer, ok := d.done[key]; ok {
		d.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(answer))
		return err
	}
	if d.running[key] {
		d.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return nil
	}
	d.running[key] = true
	hold := d.hold
	d.mu.Unlock()
	if hold != nil {
		<-hold
	}
	d.mu.Lock()
	d.effects[key]++
	answer := fmt.Sprintf("charged once for %s", key)
	d.done[key] = answer
	delete(d.running, key)
	lost := d.breaks[n]
	d.mu.Unlock()
	if lost {
		return errors.New("connection reset by peer")
	}
	w.WriteHeader(http.StatusCreated)
	_, err := w.Write([]byte(answer))
	return err
}

func (d *dedupProvider) sideEffects() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, e := range d.effects {
		n += e
	}
	return n
}

func dedupHarness(t *testing.T, cfg Config, d *dedupProvider) (*harness, *fakeUpstream) {
	t.Helper()
	up := &fakeUpstream{fn: d.serve}
	cfg.Providers = []Provider{{Name: primaryName, Handler: up, Deduplicates: DefaultKeyHeader}}
	h := newHarness(t, cfg, func(http.ResponseWriter, *http.Request, int) error {
		return errors.New("next called although providers are configured")
	})
	return h, up
}

// TestResendAfterBrokenConnection: the answer of a deduplicating provider
// is lost after it did the work; the gateway sends the request again, with
// the same job id, within the client's request, and the client gets the
// provider's one answer: one side effect, the job completed.
func TestResendAfterBrokenConnection(t *testing.T) {
	d := newDedupProvider()
	d.breaks[1] = true
	h, up := dedupHarness(t, Config{}, d)
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusCreated, "charged once for "+jobID(t, rec))
	h.waitRun()
	j := h.job(jobID(t, rec))
	wantJob(t, j, ledger.JobCompleted, "primary/unknown primary/succeeded")
	if !j.Attempts[1].Resend || j.Attempts[0].Resend || j.CompletedBy != j.Attempts[1].ID {
		t.Errorf("attempts %+v", j.Attempts)
	}
	if up.calls() != 2 || d.keys[1] != j.ID || d.keys[2] != j.ID || d.sideEffects() != 1 {
		t.Errorf("%d calls with keys %v, %d side effects", up.calls(), d.keys, d.sideEffects())
	}
	// The retry replays.
	if rec := h.do(post("k", `{}`)); rec.Header().Get(HeaderReplayed) != "true" || up.calls() != 2 {
		t.Errorf("retry: %d %s after %d calls", rec.Code, rec.Body, up.calls())
	}
}

// TestResendOnRetry: an attempt to a deduplicating provider timed out (its
// outcome unknown, the work still running there). The client's retry sends
// it again: while the original runs, the provider says 409, the re-send
// failed and the job stays unknown; once the work is done, the next retry's
// re-send gets the provider's answer and settles the job. One side effect.
func TestResendOnRetry(t *testing.T) {
	d := newDedupProvider()
	hold := make(chan struct{})
	d.hold = hold
	h, up := dedupHarness(t, Config{AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: 20 * time.Second}, d)
	first := h.do(post("k", `{}`))
	wantProblem(t, first, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	job := jobID(t, first)

	busy := h.do(post("k", `{}`))
	wantProblem(t, busy, http.StatusConflict, ProblemOutcomeUnknown)
	if up.calls() != 2 || d.keys[2] != job {
		t.Fatalf("the retry was not sent again with the job id: %d calls, keys %v", up.calls(), d.keys)
	}
	if j := h.job(job); j.State != ledger.JobUnknown || attemptsOf(j) != "primary/unknown primary/failed" {
		t.Fatalf("after a refused re-send: %s [%s]", j.State, attemptsOf(j))
	}

	d.mu.Lock()
	d.hold = nil
	d.mu.Unlock()
	close(hold)
	h.waitRun() // the refused re-send's run
	h.waitRun() // the original's: its late result settles the job
	rec := h.do(post("k", `{}`))
	if rec.Code != http.StatusCreated || rec.Body.String() != "charged once for "+job {
		t.Errorf("after the work: %d %s", rec.Code, rec.Body)
	}
	if d.sideEffects() != 1 {
		t.Errorf("%d side effects", d.sideEffects())
	}
}

// TestNoResendAcrossProviders: an unknown attempt on a provider that does
// not deduplicate is never reconciled by sending to one that does.
func TestNoResendAcrossProviders(t *testing.T) {
	h, p, f := newProviders(t, Config{AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: 20 * time.Second},
		func(w http.ResponseWriter, r *http.Request, n int) error {
			time.Sleep(200 * time.Millisecond)
			return errors.New("connection reset by peer")
		}, respond(http.StatusCreated, "fallback"))
	h.m.cfg.Providers[1].Deduplicates = DefaultKeyHeader
	h.m.deduplicating = true
	first := h.do(post("k", `{}`))
	wantProblem(t, first, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	h.waitRun()
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemOutcomeUnknown)
	if p.calls() != 1 || f.calls() != 0 {
		t.Errorf("primary %d calls, fallback %d", p.calls(), f.calls())
	}
}

// TestNoResendAcrossScopes: two handlers share a ledger, each with a
// deduplicating provider named primary, which are different upstreams.
// Handler a's attempt ends unknown; the same request through handler b
// (same owner, key and body) is never re-sent to b's primary, which never
// saw the job: it gets 409 and the job stays unknown.
func TestNoResendAcrossScopes(t *testing.T) {
	da, db := newDedupProvider(), newDedupProvider()
	hold := make(chan struct{})
	da.hold = hold
	cfg := Config{AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: 20 * time.Second, Scope: "a"}
	ha, _ := dedupHarness(t, cfg, da)
	cfg.Scope, cfg.Ledger = "b", ha.l
	hb, upB := dedupHarness(t, cfg, db)

	first := ha.do(post("k", `{}`))
	wantProblem(t, first, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	job := jobID(t, first)
	wantProblem(t, hb.do(post("k", `{}`)), http.StatusConflict, ProblemOutcomeUnknown)
	if upB.calls() != 0 {
		t.Errorf("handler b's primary got %d calls for handler a's job", upB.calls())
	}
	if j := ha.job(job); j.State != ledger.JobUnknown || attemptsOf(j) != "primary/unknown" {
		t.Errorf("after the retry through b: %s [%s]", j.State, attemptsOf(j))
	}
	close(hold)
	ha.waitRun()
}
