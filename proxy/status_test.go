package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

const statusPath = "/idempotency/jobs"

// statusGet is a status request by owner ("" for none) for the escaped
// key path segment.
func statusGet(escaped, owner string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, statusPath+"/"+escaped, nil)
	if owner != "" {
		r.Header.Set("Authorization", owner)
	}
	return r
}

// status serves r with the status handler, which must take it.
func (h *harness) status(r *http.Request) *httptest.ResponseRecorder {
	h.t.Helper()
	rec := httptest.NewRecorder()
	if !h.m.serveStatus(rec, r) {
		h.t.Fatalf("%s %s: not taken as a status request", r.Method, r.URL)
	}
	return rec
}

// statusOf reads a 200 status answer.
func statusOf(t *testing.T, rec *httptest.ResponseRecorder) JobStatus {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d, want 200; body %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	var names []string
	for k := range raw {
		names = append(names, k)
	}
	slices.Sort(names)
	want := []string{"attempts", "completed_at", "created_at", "expires_at", "job_id", "retry_after", "state"}
	if !slices.Equal(names, want) {
		t.Errorf("members %v, want exactly %v", names, want)
	}
	var s JobStatus
	if err := json.Unmarshal(rec.Body.Bytes(), &s); err != nil {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	if got := rec.Header().Get(HeaderJobID); got == "" || got != s.JobID {
		t.Errorf("%s %q, job_id %q", HeaderJobID, got, s.JobID)
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" {
		t.Errorf("Cache-Control %q", cc)
	}
	return s
}

func wantRetry(t *testing.T, s JobStatus, want int64) {
	t.Helper()
	switch {
	case want < 0 && s.RetryAfter != nil:
		t.Errorf("retry_after %d, want null", *s.RetryAfter)
	case want >= 0 && s.RetryAfter == nil:
		t.Errorf("retry_after null, want %d", want)
	case want >= 0 && *s.RetryAfter != want:
		t.Errorf("retry_after %d, want %d", *s.RetryAfter, want)
	}
}

// skewedHarness is a status-enabled harness whose ledger clock runs a
// minute behind the local clock, frozen until the test moves it.
func skewedHarness(t *testing.T) (*harness, *testClock) {
	clock := &testClock{t: time.Now().Add(-time.Minute).Truncate(time.Second)}
	h := newHarness(t, Config{StatusPath: statusPath, Ledger: memory.New(memory.WithClock(clock.now))}, nil)
	return h, clock
}

// reserveAs starts a job for (owner, key) in the harness's ledger, as the
// middleware would, with an attempt of the given lease.
func (h *harness) reserveAs(owner, key string, lease time.Duration) ledger.Reservation {
	h.t.Helper()
	r, err := h.l.Reserve(context.Background(), ledger.ReserveParams{
		JobID:              ledger.NewID(),
		OwnerHash:          h.m.hasher.Owner(owner),
		KeyHash:            h.m.hasher.Key(key),
		Fingerprint:        []byte("fp"),
		FingerprintVersion: fingerprint.VersionWhole,
		Retention:          time.Hour,
		Attempt:            ledger.NewAttempt(DefaultProvider, lease),
	})
	if err != nil || r.Outcome != ledger.Created {
		h.t.Fatalf("reserve: %v %v", r.Outcome, err)
	}
	return r
}

func TestStatusCompleted(t *testing.T) {
	h, clock := skewedHarness(t)
	rec := h.do(post("order-1", `{"amount":100}`))
	if rec.Code != http.StatusCreated {
		t.Fatalf("first request: %d %s", rec.Code, rec.Body)
	}
	id := jobID(t, rec)
	h.waitRun()
	st := h.status(statusGet("order-1", testOwner))
	s := statusOf(t, st)
	if s.JobID != id || s.State != "completed" || s.Attempts != 1 {
		t.Errorf("status %+v, want job %s completed with 1 attempt", s, id)
	}
	j := h.job(id)
	if s.CreatedAt == nil || !s.CreatedAt.Equal(j.CreatedAt) || s.CompletedAt == nil || !s.CompletedAt.Equal(j.CompletedAt) ||
		s.ExpiresAt == nil || !s.ExpiresAt.Equal(j.ExpiresAt) {
		t.Errorf("times %v %v %v, want the ledger's %v %v %v", s.CreatedAt, s.CompletedAt, s.ExpiresAt, j.CreatedAt, j.CompletedAt, j.ExpiresAt)
	}
	if !s.ExpiresAt.Equal(clock.now().Add(DefaultRetention)) {
		t.Errorf("expires_at %v, want the ledger's clock plus retention", s.ExpiresAt)
	}
	wantRetry(t, s, -1)
	if strings.Contains(st.Body.String(), "ch_1") || strings.Contains(st.Body.String(), "amount") {
		t.Errorf("the status carries the stored answer: %s", st.Body)
	}
	if v := st.Header().Get(HeaderReplayed); v != "" {
		t.Errorf("%s: %s", HeaderReplayed, v)
	}
	if v := st.Header().Get(HeaderExpires); v != j.ExpiresAt.UTC().Format(http.TimeFormat) {
		t.Errorf("%s %q, want %s", HeaderExpires, v, j.ExpiresAt)
	}
	// RFC 3339 in UTC, as sent.
	var raw map[string]any
	json.Unmarshal(st.Body.Bytes(), &raw)
	if v, _ := raw["created_at"].(string); !strings.HasSuffix(v, "Z") {
		t.Errorf("created_at %q, want RFC 3339 UTC", v)
	}
	if h.up.calls() != 1 {
		t.Errorf("the status request reached the upstream: %d calls", h.up.calls())
	}
}

func TestStatusPending(t *testing.T) {
	h, clock := skewedHarness(t)
	r := h.reserveAs(testOwner, "k", 5*time.Minute)
	s := statusOf(t, h.status(statusGet("k", testOwner)))
	if s.JobID != r.Job.ID || s.State != "pending" || s.Attempts != 1 || s.CompletedAt != nil || s.ExpiresAt != nil {
		t.Errorf("status %+v, want pending with 1 attempt, no completion or expiry", s)
	}
	// Until the running attempt's deadline by the ledger's clock, which
	// is a minute behind the local one.
	wantRetry(t, s, 300)
	clock.advance(100*time.Second + time.Millisecond)
	wantRetry(t, statusOf(t, h.status(statusGet("k", testOwner))), 200) // rounded up
	// A hedge: two attempts, the later deadline counts.
	if _, err := h.l.Hedge(context.Background(), r.Attempt.Ref(), ledger.NewAttempt("b", 10*time.Minute)); err != nil {
		t.Fatal(err)
	}
	s = statusOf(t, h.status(statusGet("k", testOwner)))
	if s.Attempts != 2 || s.State != "pending" {
		t.Errorf("after a hedge: %+v", s)
	}
	wantRetry(t, s, 600)
	// No Idempotency-Expires while the job is not settled.
	if v := h.status(statusGet("k", testOwner)).Header().Get(HeaderExpires); v != "" {
		t.Errorf("%s %q on a pending job", HeaderExpires, v)
	}
}

func TestStatusUnknown(t *testing.T) {
	h, clock := skewedHarness(t)
	// Marked unknown before its deadline: a late result may still come.
	r := h.reserveAs(testOwner, "timed-out", 5*time.Minute)
	if err := h.l.MarkUnknown(context.Background(), r.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	clock.advance(30 * time.Second)
	s := statusOf(t, h.status(statusGet("timed-out", testOwner)))
	if s.State != "unknown" || s.Attempts != 1 || s.CompletedAt != nil || s.ExpiresAt != nil {
		t.Errorf("status %+v, want unknown", s)
	}
	wantRetry(t, s, 270)
	// Past the deadline only an operator can settle it.
	clock.advance(270 * time.Second)
	wantRetry(t, statusOf(t, h.status(statusGet("timed-out", testOwner))), -1)
	// A lease that ran out reads unknown, with nothing left to wait for.
	h.reserveAs(testOwner, "lease", time.Minute)
	clock.advance(time.Minute)
	s = statusOf(t, h.status(statusGet("lease", testOwner)))
	if s.State != "unknown" {
		t.Errorf("after the lease ran out: %+v", s)
	}
	wantRetry(t, s, -1)
}

// TestStatusUnknownLookedUp: past its deadline, an unknown attempt whose
// provider has a lookup may still be settled by the next lookup: the
// reconciler's next round, or the attempt's backoff.
func TestStatusUnknownLookedUp(t *testing.T) {
	clock := &testClock{t: time.Now().Truncate(time.Second)}
	l := memory.New(memory.WithClock(clock.now))
	h := newHarness(t, Config{StatusPath: statusPath, Ledger: l, ReconcileEvery: 10 * time.Second,
		Providers: []Provider{{Name: DefaultProvider, Lookup: true}}}, nil)
	r := h.reserveAs(testOwner, "looked-up", time.Minute)
	if err := l.MarkUnknown(context.Background(), r.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	clock.advance(time.Minute)
	wantRetry(t, statusOf(t, h.status(statusGet("looked-up", testOwner))), 10)
	if _, err := l.ClaimLookup(context.Background(), r.Attempt.Ref(), "r", time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettleLookup(context.Background(), r.Attempt.Ref(), "r", ledger.LookupResult{Status: 503, Retry: 40 * time.Second}); err != nil {
		t.Fatal(err)
	}
	wantRetry(t, statusOf(t, h.status(statusGet("looked-up", testOwner))), 40)
}

func TestStatusFailed(t *testing.T) {
	h, clock := skewedHarness(t)
	r := h.reserveAs(testOwner, "k", 5*time.Minute)
	clock.advance(2 * time.Second)
	if _, err := h.l.Fail(context.Background(), r.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	rec := h.status(statusGet("k", testOwner))
	s := statusOf(t, rec)
	if s.State != "failed" || s.Attempts != 1 || s.CompletedAt == nil || !s.CompletedAt.Equal(clock.now()) ||
		s.ExpiresAt == nil || !s.ExpiresAt.Equal(clock.now().Add(time.Hour)) {
		t.Errorf("status %+v, want failed at the ledger's time, expiring after its retention", s)
	}
	wantRetry(t, s, -1)
	if rec.Header().Get(HeaderExpires) == "" {
		t.Errorf("no %s on a failed job", HeaderExpires)
	}
}

// TestStatusOtherOwner: owner B probing owner A's keys learns nothing: the
// answer is byte for byte the one for a key nobody used.
func TestStatusOtherOwner(t *testing.T) {
	const other = "Bearer bob"
	h, _ := skewedHarness(t)
	if rec := h.do(post("a-done", `{}`)); rec.Code != http.StatusCreated {
		t.Fatalf("A's request: %d", rec.Code)
	}
	h.waitRun()
	h.reserveAs(testOwner, "a-pending", 5*time.Minute)
	absent := h.status(statusGet("never-used", other))
	p := wantProblem(t, absent, http.StatusNotFound, ProblemJobNotFound)
	if p.JobID != "" {
		t.Errorf("job_id %q on a 404", p.JobID)
	}
	for _, key := range []string{"a-done", "a-pending"} {
		probe := h.status(statusGet(key, other))
		if probe.Code != absent.Code || !bytes.Equal(probe.Body.Bytes(), absent.Body.Bytes()) {
			t.Errorf("B probing %s: %d %s; absent: %d %s", key, probe.Code, probe.Body, absent.Code, absent.Body)
		}
		if got, want := headerBytes(probe.Header()), headerBytes(absent.Header()); !bytes.Equal(got, want) {
			t.Errorf("B probing %s: headers\n%s\nabsent:\n%s", key, got, want)
		}
		// A still sees its own.
		statusOf(t, h.status(statusGet(key, testOwner)))
	}
	// B's own job under A's key is B's.
	rb := h.reserveAs(other, "a-done", 5*time.Minute)
	if s := statusOf(t, h.status(statusGet("a-done", other))); s.JobID != rb.Job.ID || s.State != "pending" {
		t.Errorf("B's own job: %+v, want %s pending", s, rb.Job.ID)
	}
}

func headerBytes(h http.Header) []byte {
	var b bytes.Buffer
	h.Write(&b)
	return b.Bytes()
}

func TestStatusEscapedKey(t *testing.T) {
	h, _ := skewedHarness(t)
	const key = "orders/2024/42%?#"
	r := post("", `{}`)
	r.Header.Set(DefaultKeyHeader, key)
	id := jobID(t, h.do(r))
	h.waitRun()
	for _, seg := range []string{
		url.PathEscape(key),           // orders%2F2024%2F42%25%3F%23
		"orders%2f2024%2F42%25%3f%23", // either case of hex digits
		url.PathEscape(`"` + key + `"`),
	} {
		if s := statusOf(t, h.status(statusGet(seg, testOwner))); s.JobID != id {
			t.Errorf("%s: job %s, want %s", seg, s.JobID, id)
		}
	}
	for _, tt := range []struct{ name, seg string }{
		{"unescaped /", "orders/2024/42"},
		{"empty", ""},
		{"space", "a%20b"},
		{"non-ASCII", "caf%C3%A9"},
		{"unterminated string", "%22abc"},
		{"256 bytes", strings.Repeat("k", 256)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantProblem(t, h.status(statusGet(tt.seg, testOwner)), http.StatusBadRequest, ProblemKeyInvalid)
		})
	}
	// 255 bytes is a key; unused, so not found.
	wantProblem(t, h.status(statusGet(strings.Repeat("k", 255), testOwner)), http.StatusNotFound, ProblemJobNotFound)
}

func TestStatusMethodsAndOwner(t *testing.T) {
	h, _ := skewedHarness(t)
	id := jobID(t, h.do(post("k", `{}`)))
	h.waitRun()
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		r := statusGet("k", testOwner)
		r.Method = method
		rec := h.status(r)
		wantProblem(t, rec, http.StatusMethodNotAllowed, ProblemMethodNotAllowed)
		if a := rec.Header().Get("Allow"); a != "GET, HEAD" {
			t.Errorf("%s: Allow %q", method, a)
		}
	}
	get := h.status(statusGet("k", testOwner))
	head := statusGet("k", testOwner)
	head.Method = http.MethodHead
	hr := h.status(head)
	if hr.Code != http.StatusOK || hr.Body.Len() != 0 || hr.Header().Get(HeaderJobID) != id ||
		hr.Header().Get("Content-Length") != get.Header().Get("Content-Length") {
		t.Errorf("HEAD: %d, %d body bytes, headers %v; GET headers %v", hr.Code, hr.Body.Len(), hr.Header(), get.Header())
	}
	wantProblem(t, h.status(statusGet("k", "")), http.StatusUnauthorized, ProblemOwnerMissing)
	if h.up.calls() != 1 || h.l.Len() != 1 {
		t.Errorf("status requests reached the upstream (%d calls) or made jobs (%d)", h.up.calls(), h.l.Len())
	}
}

func TestStatusNotAddressed(t *testing.T) {
	h, _ := skewedHarness(t)
	for _, target := range []string{"/v1/charges", statusPath, "/idempotency/jobsx/k", "/idempotency", "/other" + statusPath + "/k"} {
		rec := httptest.NewRecorder()
		if h.m.serveStatus(rec, httptest.NewRequest(http.MethodGet, target, nil)) {
			t.Errorf("%s taken as a status request", target)
		}
		if rec.Code != http.StatusOK || rec.Body.Len() != 0 || len(rec.Header()) != 0 {
			t.Errorf("%s: something was written: %d %v", target, rec.Code, rec.Header())
		}
	}
	// Off without a status path; a trailing slash in it changes nothing.
	off := newHarness(t, Config{}, nil)
	if off.m.serveStatus(httptest.NewRecorder(), statusGet("k", testOwner)) {
		t.Error("status answered with no status path")
	}
	slash := newHarness(t, Config{StatusPath: statusPath + "/"}, nil)
	wantProblem(t, slash.status(statusGet("k", testOwner)), http.StatusNotFound, ProblemJobNotFound)
}

// failingFind is a ledger whose Find gets no answer.
type failingFind struct{ *memory.Ledger }

func (failingFind) Find(context.Context, []byte, []byte) (*ledger.Job, error) {
	return nil, errors.New("connection refused")
}

func TestStatusLedgerUnavailable(t *testing.T) {
	m, err := New(Config{StatusPath: statusPath, Ledger: failingFind{memory.New()}})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	if !m.serveStatus(rec, statusGet("k", testOwner)) {
		t.Fatal("not taken")
	}
	wantProblem(t, rec, http.StatusServiceUnavailable, ProblemLedgerUnavailable)
	wantRetryAfter(t, rec)
}
