package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// implicitHarness is a middleware with implicit_key window on a ledger
// whose clock the test moves.
func implicitHarness(t *testing.T, window time.Duration, fn upstreamFunc) (*harness, *testClock) {
	t.Helper()
	clock := &testClock{t: time.Now().Truncate(time.Second)}
	h := newHarness(t, Config{
		ImplicitKey: window,
		StatusPath:  statusPath,
		Ledger:      memory.New(memory.WithClock(clock.now)),
	}, fn)
	return h, clock
}

func TestImplicitKeyRetriesAreOneJob(t *testing.T) {
	h, clock := implicitHarness(t, 10*time.Minute, nil)
	first := h.do(post("", `{"amount":100,"currency":"eur"}`))
	if first.Code != http.StatusCreated || first.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	id := jobID(t, first)
	h.waitRun()

	// The same request again, its members in another order: the same
	// fingerprint (canonical JSON), so the same implicit key.
	retry := h.do(post("", `{"currency":"eur", "amount":100}`))
	if retry.Code != http.StatusCreated || retry.Header().Get(HeaderReplayed) != "true" ||
		retry.Body.String() != first.Body.String() || jobID(t, retry) != id {
		t.Fatalf("retry: %d replayed=%q %s, want the first answer replayed", retry.Code, retry.Header().Get(HeaderReplayed), retry.Body)
	}
	if h.up.calls() != 1 {
		t.Fatalf("upstream called %d times, want 1", h.up.calls())
	}

	// Upstream: no key (the client sent none), but the job's identity.
	seen := h.up.request(0)
	if v := seen.header.Values(DefaultKeyHeader); len(v) != 0 {
		t.Errorf("the upstream got %s %q from a client that sent none", DefaultKeyHeader, v)
	}
	if seen.header.Get(HeaderJobID) != id || seen.header.Get(HeaderAttempt) != "1" {
		t.Errorf("upstream identity headers: job %q attempt %q", seen.header.Get(HeaderJobID), seen.header.Get(HeaderAttempt))
	}

	// The job expires the window after it completed, not retention.
	j := h.job(id)
	if j.State != ledger.JobCompleted {
		t.Fatalf("job %s", j.State)
	}
	if j.Retention != 10*time.Minute || !j.ExpiresAt.Equal(j.CompletedAt.Add(10*time.Minute)) {
		t.Errorf("job retention %v, expires %v after completing; want the window", j.Retention, j.ExpiresAt.Sub(j.CompletedAt))
	}
	if got := retry.Header().Get(HeaderExpires); got != j.ExpiresAt.UTC().Format(http.TimeFormat) {
		t.Errorf("%s %q, want %v", HeaderExpires, got, j.ExpiresAt)
	}

	// Its key is "implicit:" and the fingerprint: the status path finds it.
	key := ImplicitKey(j.Fingerprint)
	if !strings.HasPrefix(key, "implicit:") || len(key) != len("implicit:")+64 {
		t.Fatalf("implicit key %q", key)
	}
	if _, err := ParseKey(key); err != nil {
		t.Errorf("the implicit key is not a valid key: %v", err)
	}
	if s := statusOf(t, h.status(statusGet(key, testOwner))); s.JobID != id {
		t.Errorf("status of %s: %+v, want job %s", key, s, id)
	}

	// Past the window, the same request is a new job.
	clock.advance(10*time.Minute + time.Second)
	later := h.do(post("", `{"amount":100,"currency":"eur"}`))
	if later.Code != http.StatusCreated || later.Header().Get(HeaderReplayed) != "" || jobID(t, later) == id {
		t.Fatalf("after the window: %d replayed=%q job %s, want a new job", later.Code, later.Header().Get(HeaderReplayed), jobID(t, later))
	}
	h.waitRun()
	if h.up.calls() != 2 {
		t.Errorf("upstream called %d times, want 2", h.up.calls())
	}
}

func TestImplicitKeyDifferentRequestsAreDifferentJobs(t *testing.T) {
	h, _ := implicitHarness(t, time.Hour, nil)
	a := h.do(post("", `{"amount":100}`))
	h.waitRun()
	b := h.do(post("", `{"amount":200}`))
	h.waitRun()
	if jobID(t, a) == jobID(t, b) || b.Header().Get(HeaderReplayed) != "" || h.up.calls() != 2 {
		t.Fatalf("two different requests: jobs %s %s, %d calls", jobID(t, a), jobID(t, b), h.up.calls())
	}
	// Another owner's identical request is another owner's job.
	other := post("", `{"amount":100}`)
	other.Header.Set("Authorization", "Bearer bob")
	c := h.do(other)
	h.waitRun()
	if jobID(t, c) == jobID(t, a) || c.Header().Get(HeaderReplayed) != "" || h.up.calls() != 3 {
		t.Fatalf("another owner: job %s (alice's %s), replayed %q", jobID(t, c), jobID(t, a), c.Header().Get(HeaderReplayed))
	}
	// A keyless request without an owner is still refused.
	anon := post("", `{"amount":100}`)
	anon.Header.Del("Authorization")
	wantProblem(t, h.do(anon), http.StatusUnauthorized, ProblemOwnerMissing)
}

func TestImplicitKeyLeavesExplicitKeysAlone(t *testing.T) {
	h, _ := implicitHarness(t, time.Minute, nil)
	rec := h.do(post("order-1", `{"amount":100}`))
	h.waitRun()
	j := h.job(jobID(t, rec))
	if j.Retention != DefaultRetention {
		t.Errorf("a keyed job's retention %v, want retention's %v", j.Retention, DefaultRetention)
	}
	if got := h.up.request(0).header.Get(DefaultKeyHeader); got != "order-1" {
		t.Errorf("upstream key %q", got)
	}
	// The keyless request with the same body is its own job.
	bare := h.do(post("", `{"amount":100}`))
	h.waitRun()
	if jobID(t, bare) == j.ID || h.up.calls() != 2 {
		t.Errorf("keyless request joined the keyed job %s", j.ID)
	}
	// Methods that are not ledgered pass through without a job.
	get := httptest.NewRequest(http.MethodGet, "/x", nil)
	get.Header.Set("Authorization", testOwner)
	if rec := h.do(get); rec.Header().Get(HeaderJobID) != "" || h.up.calls() != 3 {
		t.Errorf("GET: job %q, %d calls", rec.Header().Get(HeaderJobID), h.up.calls())
	}
}

// A keyless duplicate of a job still running waits for it and replays its
// answer: the SDK that retried after its own timeout gets one execution.
func TestImplicitKeyDuplicateWaits(t *testing.T) {
	hl := &hookLedger{Ledger: memory.New(), waits: make(chan string, 4)}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	h := newHarness(t, Config{ImplicitKey: time.Hour, Ledger: hl}, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		return created(w, r, n)
	})
	first := h.goDo(post("", `{"prompt":"hi"}`))
	recv(t, entered, "the upstream call")
	dup := h.goDo(post("", `{"prompt":"hi"}`))
	recv(t, hl.waits, "the duplicate to wait")
	close(release)
	a, b := recv(t, first, "the first answer"), recv(t, dup, "the duplicate's answer")
	if a.Code != http.StatusCreated || b.Code != http.StatusCreated || a.Body.String() != b.Body.String() ||
		b.Header().Get(HeaderReplayed) != "true" || jobID(t, a) != jobID(t, b) {
		t.Fatalf("first %d %s, duplicate %d %s replayed=%q", a.Code, a.Body, b.Code, b.Body, b.Header().Get(HeaderReplayed))
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

func TestImplicitKeyConfig(t *testing.T) {
	tests := []struct {
		cfg  Config
		want string // "" when New succeeds
	}{
		{Config{ImplicitKey: time.Minute}, ""},
		{Config{ImplicitKey: time.Minute, RequireKey: true}, "implicit_key and require_key"},
		{Config{ImplicitKey: -time.Second}, "positive window"},
	}
	for _, tt := range tests {
		tt.cfg.Ledger = memory.New()
		_, err := New(tt.cfg)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%+v: %v", tt.cfg, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("ImplicitKey %v RequireKey %v: error %v, want %q", tt.cfg.ImplicitKey, tt.cfg.RequireKey, err, tt.want)
		}
	}
}
