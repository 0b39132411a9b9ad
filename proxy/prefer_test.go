package proxy

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

func TestPreferredWait(t *testing.T) {
	for _, tc := range []struct {
		fields []string
		want   time.Duration
		ok     bool
	}{
		{nil, 0, false},
		{[]string{"wait=10"}, 10 * time.Second, true},
		{[]string{"respond-async, wait=0"}, 0, true},
		{[]string{"WAIT = 7"}, 7 * time.Second, true},
		{[]string{`wait="3"`}, 3 * time.Second, true},
		{[]string{"handling=lenient; x=\"a,b\", wait=4"}, 4 * time.Second, true},
		{[]string{"return=minimal", "wait=2"}, 2 * time.Second, true},
		{[]string{"wait=2, wait=9"}, 2 * time.Second, true}, // the first counts
		{[]string{"wait=abc"}, 0, false},
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=+1"}, 0, false},
		{[]string{"wait"}, 0, false},
		{[]string{"wait=99999999999"}, 0, false},
		{[]string{"waiting=5"}, 0, false},
		{[]string{`x="wait=5"`}, 0, false},
	} {
		h := http.Header{}
		for _, f := range tc.fields {
			h.Add(HeaderPrefer, f)
		}
		got, ok := preferredWait(h)
		if got != tc.want || ok != tc.ok {
			t.Errorf("Prefer %q = %v, %v; want %v, %v", tc.fields, got, ok, tc.want, tc.ok)
		}
	}
}

func withPrefer(r *http.Request, v string) *http.Request {
	r.Header.Set(HeaderPrefer, v)
	return r
}

// Prefer: wait=0 answers a duplicate 409 at once, whatever in_flight says.
func TestPreferWaitZeroRejects(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	h := newHarness(t, Config{AttemptTimeout: patience}, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		return created(w, r, n)
	})
	first := h.goDo(withPrefer(post("k", `{}`), "wait=0")) // the creating request: nothing changes
	recv(t, entered, "the upstream call")
	dup := h.do(withPrefer(post("k", `{}`), "wait=0"))
	wantProblem(t, dup, http.StatusConflict, ProblemInFlight)
	if v := dup.Header().Get(HeaderPreferenceApplied); v != "wait=0" {
		t.Errorf("Preference-Applied %q", v)
	}
	close(release)
	rec := recv(t, first, "the first answer")
	wantAnswer(t, rec, http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	if v := rec.Header().Get(HeaderPreferenceApplied); v != "" {
		t.Errorf("the creating request carries Preference-Applied %q", v)
	}
}

// Prefer: wait=N makes a duplicate wait even with in_flight reject, and a
// malformed preference is ignored.
func TestPreferWaitOverridesReject(t *testing.T) {
	h, release, first, dupCh := waitScenarioWith(t, Config{AttemptTimeout: patience, InFlightReject: true}, "wait=30")
	close(release)
	rec := recv(t, first, "the first answer")
	dup := recv(t, dupCh, "the duplicate's answer")
	wantReplay(t, dup, jobID(t, rec), http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	if v := dup.Header().Get(HeaderPreferenceApplied); v != "wait=30" {
		t.Errorf("Preference-Applied %q", v)
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
	bad := h.do(withPrefer(post("k", `{}`), "wait=soon"))
	if bad.Header().Get(HeaderPreferenceApplied) != "" || bad.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("malformed preference: %d %v", bad.Code, bad.Header())
	}
}

// The wait a client prefers is capped by max_wait, and the answer says so.
func TestPreferWaitCapped(t *testing.T) {
	_, release, first, dupCh := waitScenarioWith(t, Config{AttemptTimeout: patience, MaxWait: 100 * time.Millisecond}, "wait=3600")
	dup := recv(t, dupCh, "the duplicate's answer")
	wantProblem(t, dup, http.StatusConflict, ProblemInFlight)
	if v := dup.Header().Get(HeaderPreferenceApplied); v != "wait=1" {
		t.Errorf("Preference-Applied %q, want the cap", v)
	}
	close(release)
	recv(t, first, "the first answer")
}

// waitScenarioWith is waitScenario whose duplicate states prefer.
func waitScenarioWith(t *testing.T, cfg Config, prefer string) (*harness, chan struct{}, <-chan *httptest.ResponseRecorder, <-chan *httptest.ResponseRecorder) {
	return waitScenarioDup(t, cfg, created, withPrefer(post("k", `{}`), prefer))
}

// Every answer whose job is settled says when its key stops being one
// intent: the first answer and its replays alike, by the ledger's clock.
func TestIdempotencyExpires(t *testing.T) {
	h := newHarness(t, Config{Ledger: skewed(-time.Hour), Retention: time.Hour}, nil)
	first := h.do(post("k", `{}`))
	h.waitRun()
	j := h.job(jobID(t, first))
	want := j.ExpiresAt.UTC().Format(http.TimeFormat)
	if got := first.Header().Get(HeaderExpires); got != want {
		t.Errorf("first answer: %s %q, want %q", HeaderExpires, got, want)
	}
	replay := h.do(post("k", `{}`))
	if got := replay.Header().Get(HeaderExpires); got != want || replay.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("replay: %s %q, want %q", HeaderExpires, got, want)
	}
	// A job in flight is not settled: no expiry.
	_, release, firstCh, dupCh := waitScenarioWith(t, Config{AttemptTimeout: patience, MaxWait: 50 * time.Millisecond}, "wait=1")
	if got := recv(t, dupCh, "the duplicate's answer").Header().Get(HeaderExpires); got != "" {
		t.Errorf("in flight: %s %q", HeaderExpires, got)
	}
	close(release)
	recv(t, firstCh, "the first answer")
}

// A waiter's answer says the wait it got even when the stored answer says
// what the provider applied to the first request: both, as two fields of
// the one list (it said the provider's alone).
func TestPreferenceAppliedKeepsBoth(t *testing.T) {
	minimal := func(w http.ResponseWriter, r *http.Request, n int) error {
		w.Header().Set(HeaderPreferenceApplied, "return=minimal")
		return created(w, r, n)
	}
	h, release, first, dupCh := waitScenarioDup(t, Config{AttemptTimeout: patience}, minimal, withPrefer(post("k", `{}`), "wait=30"))
	close(release)
	if got := recv(t, first, "the first answer").Header().Values(HeaderPreferenceApplied); !slices.Equal(got, []string{"return=minimal"}) {
		t.Errorf("first answer: %s %q", HeaderPreferenceApplied, got)
	}
	dup := recv(t, dupCh, "the duplicate's answer")
	if got := dup.Header().Values(HeaderPreferenceApplied); !slices.Equal(got, []string{"return=minimal", "wait=30"}) || dup.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("waiter: %s %q, want the provider's and the wait", HeaderPreferenceApplied, got)
	}
	if got := h.do(post("k", `{}`)).Header().Values(HeaderPreferenceApplied); !slices.Equal(got, []string{"return=minimal"}) {
		t.Errorf("replay without Prefer: %s %q", HeaderPreferenceApplied, got)
	}
}
