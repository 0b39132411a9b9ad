package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

const testOwner = "Bearer alice"

// patience bounds every wait for a condition; the tests never assert on
// how long anything took.
const patience = 10 * time.Second

// seenRequest is what a fake upstream was sent.
type seenRequest struct {
	method, uri   string
	header        http.Header
	body          []byte
	contentLength int64
	bodyNil       bool
	bodyNoBody    bool
	getBody       bool
}

type upstreamFunc func(w http.ResponseWriter, r *http.Request, n int) error

// fakeUpstream is an in-process provider: it records every request and
// answers with fn (n counts its calls from 1).
type fakeUpstream struct {
	fn upstreamFunc

	mu   sync.Mutex
	seen []seenRequest
}

func (u *fakeUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	s := seenRequest{
		method: r.Method, uri: r.RequestURI, header: r.Header.Clone(), contentLength: r.ContentLength,
		bodyNil: r.Body == nil, bodyNoBody: r.Body == http.NoBody, getBody: r.GetBody != nil,
	}
	if r.Body != nil {
		s.body, _ = io.ReadAll(r.Body)
	}
	u.mu.Lock()
	u.seen = append(u.seen, s)
	n := len(u.seen)
	u.mu.Unlock()
	if u.fn == nil {
		return created(w, r, n)
	}
	return u.fn(w, r, n)
}

func (u *fakeUpstream) calls() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

func (u *fakeUpstream) request(i int) seenRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[i]
}

// created is the default upstream answer: a 201 whose body names the call,
// so that a replay and a second execution cannot be mistaken for each other.
func created(w http.ResponseWriter, _ *http.Request, n int) error {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Add("X-Upstream", "a")
	h.Add("X-Upstream", "b")
	h.Set("Set-Cookie", "s=1")
	// Not end-to-end: never stored or replayed.
	h.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
	h.Set("Connection", "X-Hop")
	h.Set("X-Hop", "1")
	h.Set("Keep-Alive", "timeout=5")
	body := fmt.Sprintf("{\"id\":\"ch_%d\",\"amount\":100}\n", n)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusCreated)
	_, err := io.WriteString(w, body)
	return err
}

// hookLedger wraps a ledger to make it fail and to see its waiters.
type hookLedger struct {
	ledger.Ledger
	reserveErr  error
	completeErr error
	waits       chan string // the job id of each Wait call, when set
}

func (l *hookLedger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	if l.reserveErr != nil {
		return ledger.Reservation{}, l.reserveErr
	}
	return l.Ledger.Reserve(ctx, p)
}

func (l *hookLedger) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	if l.completeErr != nil {
		return ledger.Completion{}, l.completeErr
	}
	return l.Ledger.Complete(ctx, ref, resp)
}

func (l *hookLedger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	if l.waits != nil {
		l.waits <- jobID
	}
	return l.Ledger.Wait(ctx, jobID)
}

// testClock is a ledger clock the test moves.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// harness is a middleware in front of a fake upstream, with a memory ledger.
type harness struct {
	t    *testing.T
	m    *Middleware
	l    *memory.Ledger
	up   *fakeUpstream
	runs chan struct{} // a value each time a job's run ends
}

// newHarness builds a middleware for cfg. A nil cfg.Ledger is a new memory
// ledger; a *hookLedger must wrap a *memory.Ledger.
func newHarness(t *testing.T, cfg Config, fn upstreamFunc) *harness {
	t.Helper()
	h := &harness{t: t, up: &fakeUpstream{fn: fn}, runs: make(chan struct{}, 64)}
	switch l := cfg.Ledger.(type) {
	case nil:
		h.l = memory.New()
		cfg.Ledger = h.l
	case *memory.Ledger:
		h.l = l
	case *hookLedger:
		h.l = l.Ledger.(*memory.Ledger)
	case *lossyLedger:
		h.l = l.Ledger.(*memory.Ledger)
	}
	if cfg.Hold == nil {
		cfg.Hold = func() func() { return func() { h.runs <- struct{}{} } }
	}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.m = m
	return h
}

func (h *harness) do(r *http.Request) *httptest.ResponseRecorder {
	h.t.Helper()
	rec := httptest.NewRecorder()
	if err := h.m.ServeHTTP(rec, r, h.up); err != nil {
		h.t.Fatalf("ServeHTTP: %v", err)
	}
	return rec
}

// goDo serves r in its own goroutine, like a concurrent client.
func (h *harness) goDo(r *http.Request) <-chan *httptest.ResponseRecorder {
	ch := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		rec := httptest.NewRecorder()
		if err := h.m.ServeHTTP(rec, r, h.up); err != nil {
			h.t.Errorf("ServeHTTP: %v", err)
		}
		ch <- rec
	}()
	return ch
}

// waitRun waits for the end of a job's run (its detached attempts).
func (h *harness) waitRun() {
	h.t.Helper()
	recv(h.t, h.runs, "the end of a run")
}

func (h *harness) job(id string) *ledger.Job {
	h.t.Helper()
	if id == "" {
		h.t.Fatal("no job id")
	}
	j, err := h.l.Job(context.Background(), id)
	if err != nil {
		h.t.Fatalf("job %s: %v", id, err)
	}
	return j
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(patience):
		t.Fatalf("timed out waiting for %s", what)
	}
	var zero T
	return zero
}

// post is a ledgered request by testOwner; no key header when key is "".
func post(key, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/v1/charges?currency=eur", strings.NewReader(body))
	r.Header.Set("Authorization", testOwner)
	r.Header.Set("Content-Type", "application/json")
	if key != "" {
		r.Header.Set(DefaultKeyHeader, key)
	}
	return r
}

// wantProblem checks that rec is a problem+json answer of the named type
// and returns it.
func wantProblem(t *testing.T, rec *httptest.ResponseRecorder, status int, name string) Problem {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body %s", ct, rec.Body)
	}
	if cl := rec.Header().Get("Content-Length"); cl != strconv.Itoa(rec.Body.Len()) {
		t.Errorf("Content-Length %s, body is %d bytes", cl, rec.Body.Len())
	}
	var p Problem
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body %q: %v", rec.Body, err)
	}
	if p.Type != ProblemType(name) || p.Status != status || p.Title == "" {
		t.Fatalf("problem %+v, want type %s and status %d with a title", p, ProblemType(name), status)
	}
	if p.JobID != rec.Header().Get(HeaderJobID) {
		t.Errorf("job_id %q, %s header %q", p.JobID, HeaderJobID, rec.Header().Get(HeaderJobID))
	}
	if v := rec.Header().Get(HeaderReplayed); v != "" {
		t.Errorf("a problem carries %s: %s", HeaderReplayed, v)
	}
	return p
}

// wantRetryAfter checks that rec has a Retry-After of at least one second.
func wantRetryAfter(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	v := rec.Header().Get("Retry-After")
	if s, err := strconv.Atoi(v); err != nil || s < 1 {
		t.Errorf("Retry-After %q, want whole seconds >= 1", v)
	}
}

func jobID(t *testing.T, rec *httptest.ResponseRecorder) string {
	t.Helper()
	id := rec.Header().Get(HeaderJobID)
	if id == "" {
		t.Fatalf("no %s header; status %d, body %s", HeaderJobID, rec.Code, rec.Body)
	}
	return id
}

// ---- Requests that are not ledgered, and requests refused before a job.

func TestNotLedgeredPassThroughUntouched(t *testing.T) {
	tests := []struct {
		name string
		req  func() *http.Request
	}{
		{"GET with key", func() *http.Request {
			r := httptest.NewRequest(http.MethodGet, "/x", nil)
			r.Header.Set(DefaultKeyHeader, "k")
			r.Header.Set("Authorization", testOwner)
			return r
		}},
		{"PUT with key", func() *http.Request {
			r := post("k", "{}")
			r.Method = http.MethodPut
			return r
		}},
		{"DELETE with malformed key and no owner", func() *http.Request {
			r := httptest.NewRequest(http.MethodDelete, "/x", nil)
			r.Header.Set(DefaultKeyHeader, `"bad`)
			return r
		}},
		{"POST without key", func() *http.Request { return post("", `{"a":1}`) }},
		{"PATCH without key or owner", func() *http.Request {
			return httptest.NewRequest(http.MethodPatch, "/x", strings.NewReader("x"))
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := memory.New()
			m, err := New(Config{Ledger: l})
			if err != nil {
				t.Fatal(err)
			}
			sentinel := errors.New("from next")
			r := tt.req()
			rec := httptest.NewRecorder()
			calls := 0
			next := HandlerFunc(func(w http.ResponseWriter, got *http.Request) error {
				calls++
				if got != r {
					t.Error("next got another request")
				}
				if w != rec {
					t.Error("next got another ResponseWriter")
				}
				if got.Header.Get(HeaderJobID) != "" || got.Header.Get(HeaderAttempt) != "" {
					t.Error("the gateway added its headers to a request it does not ledger")
				}
				return sentinel
			})
			if err := m.ServeHTTP(rec, r, next); err != sentinel {
				t.Errorf("ServeHTTP returned %v, want next's error", err)
			}
			if calls != 1 {
				t.Errorf("next called %d times", calls)
			}
			if l.Len() != 0 {
				t.Errorf("%d jobs created", l.Len())
			}
		})
	}
}

func TestRequireKey(t *testing.T) {
	h := newHarness(t, Config{RequireKey: true}, nil)
	rec := h.do(post("", `{"a":1}`))
	p := wantProblem(t, rec, http.StatusBadRequest, ProblemKeyMissing)
	if p.JobID != "" {
		t.Errorf("job_id %q without a job", p.JobID)
	}
	if h.up.calls() != 0 || h.l.Len() != 0 {
		t.Errorf("upstream called %d times, %d jobs", h.up.calls(), h.l.Len())
	}
	// Methods that are not ledgered still pass without a key.
	get := httptest.NewRequest(http.MethodGet, "/x", nil)
	if rec := h.do(get); rec.Code != http.StatusCreated || h.up.calls() != 1 {
		t.Errorf("GET without key: status %d, %d upstream calls", rec.Code, h.up.calls())
	}
}

func TestInvalidKey(t *testing.T) {
	tests := []struct {
		name   string
		values []string
	}{
		{"two key headers", []string{"a", "b"}},
		{"two identical key headers", []string{"a", "a"}},
		{"empty", []string{""}},
		{"unterminated string", []string{`"abc`}},
		{"invalid escape", []string{`"a\b"`}},
		{"space", []string{"a b"}},
		{"non-ASCII", []string{"caf\u00e9"}},
		{"256 bytes", []string{strings.Repeat("k", 256)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{}, nil)
			r := post("", `{"a":1}`)
			for _, v := range tt.values {
				r.Header.Add(DefaultKeyHeader, v)
			}
			wantProblem(t, h.do(r), http.StatusBadRequest, ProblemKeyInvalid)
			if h.up.calls() != 0 || h.l.Len() != 0 {
				t.Errorf("upstream called %d times, %d jobs", h.up.calls(), h.l.Len())
			}
		})
	}
}

func TestOwnerMissing(t *testing.T) {
	t.Run("default owner, no Authorization", func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		r := post("k", `{}`)
		r.Header.Del("Authorization")
		wantProblem(t, h.do(r), http.StatusUnauthorized, ProblemOwnerMissing)
		if h.up.calls() != 0 || h.l.Len() != 0 {
			t.Errorf("upstream called %d times, %d jobs", h.up.calls(), h.l.Len())
		}
	})
	t.Run("configured owner resolves empty", func(t *testing.T) {
		h := newHarness(t, Config{Owner: func(r *http.Request) string { return r.Header.Get("X-User") }}, nil)
		wantProblem(t, h.do(post("k", `{}`)), http.StatusUnauthorized, ProblemOwnerMissing)
		if h.up.calls() != 0 || h.l.Len() != 0 {
			t.Errorf("upstream called %d times, %d jobs", h.up.calls(), h.l.Len())
		}
		r := post("k", `{}`)
		r.Header.Set("X-User", "u1")
		if rec := h.do(r); rec.Code != http.StatusCreated {
			t.Errorf("with an owner: status %d", rec.Code)
		}
	})
}

// unsized hides a body's length, as a chunked request does.
type unsized struct{ io.Reader }

func TestBodyTooLarge(t *testing.T) {
	const max = 16
	tests := []struct {
		name string
		body io.Reader
		ok   bool
	}{
		{"known length, one over", strings.NewReader(strings.Repeat("x", max+1)), false},
		{"unknown length, one over", unsized{strings.NewReader(strings.Repeat("x", max+1))}, false},
		{"unknown length, far over", unsized{strings.NewReader(strings.Repeat("x", 10*max))}, false},
		{"known length, exactly max", strings.NewReader(strings.Repeat("x", max)), true},
		{"unknown length, exactly max", unsized{strings.NewReader(strings.Repeat("x", max))}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{MaxRequestBody: max}, nil)
			r := httptest.NewRequest(http.MethodPost, "/x", tt.body)
			r.Header.Set(DefaultKeyHeader, "k")
			r.Header.Set("Authorization", testOwner)
			rec := h.do(r)
			if !tt.ok {
				p := wantProblem(t, rec, http.StatusRequestEntityTooLarge, ProblemBodyTooLarge)
				if p.JobID != "" {
					t.Errorf("job_id %q", p.JobID)
				}
				if h.l.Len() != 0 || h.up.calls() != 0 {
					t.Errorf("%d jobs, %d upstream calls: no job may be created", h.l.Len(), h.up.calls())
				}
				return
			}
			if rec.Code != http.StatusCreated || h.up.calls() != 1 {
				t.Fatalf("status %d, %d upstream calls", rec.Code, h.up.calls())
			}
			if got := h.up.request(0).body; string(got) != strings.Repeat("x", max) {
				t.Errorf("upstream got body %q", got)
			}
		})
	}
}

// ---- First request, replay, mismatch.

func TestFirstRequestThenReplay(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	first := h.do(post("k-1", `{"amount":100}`))
	if first.Code != http.StatusCreated {
		t.Fatalf("status %d, body %s", first.Code, first.Body)
	}
	id := jobID(t, first)
	if first.Header().Get(HeaderReplayed) != "" {
		t.Error("the first answer is marked replayed")
	}
	if got, want := first.Body.String(), "{\"id\":\"ch_1\",\"amount\":100}\n"; got != want {
		t.Errorf("body %q, want %q", got, want)
	}
	for _, k := range []string{"Date", "Connection", "X-Hop", "Keep-Alive"} {
		if v, ok := first.Header()[k]; ok {
			t.Errorf("hop-by-hop header %s: %v passed on", k, v)
		}
	}
	j := h.job(id)
	if j.State != ledger.JobCompleted || j.Response == nil || !j.Response.Stored || j.Response.Status != http.StatusCreated {
		t.Fatalf("job %+v, want completed with its answer stored", j)
	}
	if !bytes.Equal(j.Response.Body, first.Body.Bytes()) || j.Response.Size != int64(first.Body.Len()) {
		t.Errorf("stored body %q (size %d), sent %q", j.Response.Body, j.Response.Size, first.Body)
	}
	for _, k := range []string{"Date", "Connection", "X-Hop", "Keep-Alive", HeaderJobID, "Set-Cookie"} {
		if _, ok := j.Response.Header[k]; ok {
			t.Errorf("header %s stored", k)
		}
	}
	if first.Header().Get("Set-Cookie") != "s=1" {
		t.Errorf("the first client got Set-Cookie %q, want the provider's", first.Header().Get("Set-Cookie"))
	}

	for i := range 3 {
		retry := h.do(post("k-1", `{"amount":100}`))
		if retry.Code != first.Code {
			t.Errorf("retry %d: status %d, want %d", i, retry.Code, first.Code)
		}
		if !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) {
			t.Errorf("retry %d: body %q, want %q", i, retry.Body, first.Body)
		}
		if retry.Header().Get(HeaderReplayed) != "true" {
			t.Errorf("retry %d: %s = %q", i, HeaderReplayed, retry.Header().Get(HeaderReplayed))
		}
		got, want := retry.Header().Clone(), first.Header().Clone()
		got.Del(HeaderReplayed)
		want.Del("Set-Cookie") // the first client's alone
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("retry %d: headers\n%v\nwant\n%v", i, got, first.Header())
		}
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times, want 1", h.up.calls())
	}
	if h.l.Len() != 1 {
		t.Errorf("%d jobs", h.l.Len())
	}
}

// A bare key and its RFC 8941 string are the same key.
func TestQuotedKeyIsTheSameKey(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	first := h.do(post("abc", `{}`))
	retry := h.do(post(`"abc"`, `{}`))
	if retry.Header().Get(HeaderReplayed) != "true" || jobID(t, retry) != jobID(t, first) || h.up.calls() != 1 {
		t.Errorf(`"abc" did not replay abc's job: status %d, %d upstream calls`, retry.Code, h.up.calls())
	}
}

func TestKeyReused(t *testing.T) {
	tests := []struct {
		name   string
		modify func(r *http.Request) *http.Request
	}{
		{"different body", func(*http.Request) *http.Request { return post("k", `{"amount":999}`) }},
		{"different query", func(r *http.Request) *http.Request {
			r2 := httptest.NewRequest(http.MethodPost, "/v1/charges?currency=usd", strings.NewReader(`{"amount":100}`))
			r2.Header = r.Header
			return r2
		}},
		{"different path", func(r *http.Request) *http.Request {
			r2 := httptest.NewRequest(http.MethodPost, "/v1/refunds?currency=eur", strings.NewReader(`{"amount":100}`))
			r2.Header = r.Header
			return r2
		}},
		{"different method", func(r *http.Request) *http.Request {
			r.Method = http.MethodPatch
			return r
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{}, nil)
			first := h.do(post("k", `{"amount":100}`))
			id := jobID(t, first)
			rec := h.do(tt.modify(post("k", `{"amount":100}`)))
			p := wantProblem(t, rec, http.StatusUnprocessableEntity, ProblemKeyReused)
			if p.JobID != id {
				t.Errorf("job_id %q, want the existing job %q", p.JobID, id)
			}
			if strings.Contains(rec.Body.String(), "ch_") {
				t.Errorf("the mismatch leaks the first answer: %s", rec.Body)
			}
			if h.up.calls() != 1 {
				t.Errorf("upstream called %d times", h.up.calls())
			}
			// The job keeps its answer for the original request.
			if again := h.do(post("k", `{"amount":100}`)); again.Header().Get(HeaderReplayed) != "true" {
				t.Errorf("the original request no longer replays: %d %s", again.Code, again.Body)
			}
		})
	}
}

func TestFingerprintModesThroughMiddleware(t *testing.T) {
	t.Run("json: key order and white space replay", func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		h.do(post("k", `{"a":1,"b":[1,2]}`))
		rec := h.do(post("k", "{ \"b\": [1, 2],\n \"a\": 1 }"))
		if rec.Header().Get(HeaderReplayed) != "true" || h.up.calls() != 1 {
			t.Errorf("status %d, %d upstream calls; want a replay", rec.Code, h.up.calls())
		}
	})
	t.Run("json: numbers as written", func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		h.do(post("k", `{"a":1}`))
		wantProblem(t, h.do(post("k", `{"a":1.0}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
	})
	t.Run("raw: white space is a different request", func(t *testing.T) {
		h := newHarness(t, Config{Fingerprint: fingerprint.BodyRaw}, nil)
		h.do(post("k", `{"a":1}`))
		wantProblem(t, h.do(post("k", `{"a": 1}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
		if rec := h.do(post("k", `{"a":1}`)); rec.Header().Get(HeaderReplayed) != "true" {
			t.Errorf("identical raw body: status %d", rec.Code)
		}
	})
	t.Run("fingerprint_headers", func(t *testing.T) {
		h := newHarness(t, Config{FingerprintHeaders: []string{"x-account"}}, nil)
		r := post("k", `{}`)
		r.Header.Set("X-Account", "a1")
		h.do(r)
		r = post("k", `{}`)
		r.Header.Set("X-Account", "a2")
		wantProblem(t, h.do(r), http.StatusUnprocessableEntity, ProblemKeyReused)
		r = post("k", `{}`)
		r.Header.Set("X-Account", "a1")
		r.Header.Set("X-Other", "changes nothing")
		if rec := h.do(r); rec.Header().Get(HeaderReplayed) != "true" {
			t.Errorf("an unlisted header changed the fingerprint: %d %s", rec.Code, rec.Body)
		}
	})
	t.Run("original URI, not the rewritten one", func(t *testing.T) {
		h := newHarness(t, Config{OriginalURI: func(r *http.Request) string { return r.Header.Get("X-Original-URI") }}, nil)
		r := post("k", `{}`)
		r.Header.Set("X-Original-URI", "/a")
		h.do(r)
		r = post("k", `{}`)
		r.URL.Path, r.RequestURI = "/rewritten", "/rewritten"
		r.Header.Set("X-Original-URI", "/a")
		if rec := h.do(r); rec.Header().Get(HeaderReplayed) != "true" {
			t.Errorf("a rewrite changed the fingerprint: %d %s", rec.Code, rec.Body)
		}
	})
}

func TestOwnersAreSeparate(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	alice := h.do(post("shared-key", `{}`))
	r := post("shared-key", `{}`)
	r.Header.Set("Authorization", "Bearer bob")
	bob := h.do(r)
	if bob.Code != http.StatusCreated || bob.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("bob got status %d, replayed %q: another owner's job", bob.Code, bob.Header().Get(HeaderReplayed))
	}
	if h.up.calls() != 2 {
		t.Errorf("upstream called %d times, want 2", h.up.calls())
	}
	if jobID(t, alice) == jobID(t, bob) {
		t.Error("two owners share a job")
	}
	if !strings.Contains(bob.Body.String(), "ch_2") {
		t.Errorf("bob got %s", bob.Body)
	}
	// Each owner replays their own answer; a different body from bob is
	// his own mismatch, not alice's.
	r = post("shared-key", `{}`)
	r.Header.Set("Authorization", "Bearer bob")
	if rec := h.do(r); rec.Body.String() != bob.Body.String() {
		t.Errorf("bob's retry got %s", rec.Body)
	}
	if rec := h.do(post("shared-key", `{}`)); rec.Body.String() != alice.Body.String() {
		t.Errorf("alice's retry got %s", rec.Body)
	}
}

// ---- Concurrency: duplicates in flight.

func TestConcurrentDuplicatesExecuteOnce(t *testing.T) {
	const n = 10
	hl := &hookLedger{Ledger: memory.New(), waits: make(chan string, n)}
	entered, release := make(chan struct{}, n), make(chan struct{})
	h := newHarness(t, Config{Ledger: hl, AttemptTimeout: patience}, func(w http.ResponseWriter, r *http.Request, k int) error {
		entered <- struct{}{}
		<-release
		return created(w, r, k)
	})
	results := make([]<-chan *httptest.ResponseRecorder, n)
	for i := range results {
		results[i] = h.goDo(post("dup", `{"amount":100}`))
	}
	recv(t, entered, "the upstream call")
	for range n - 1 {
		recv(t, hl.waits, "a duplicate to wait")
	}
	close(release)

	var first *httptest.ResponseRecorder
	replayed := 0
	ids := map[string]bool{}
	for _, ch := range results {
		rec := recv(t, ch, "an answer")
		if rec.Code != http.StatusCreated {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		if first == nil {
			first = rec
		}
		if !bytes.Equal(rec.Body.Bytes(), first.Body.Bytes()) {
			t.Errorf("bodies differ: %q and %q", rec.Body, first.Body)
		}
		if rec.Header().Get(HeaderReplayed) == "true" {
			replayed++
		}
		ids[rec.Header().Get(HeaderJobID)] = true
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times, want exactly 1", h.up.calls())
	}
	if replayed != n-1 {
		t.Errorf("%d answers marked replayed, want %d (every waiter)", replayed, n-1)
	}
	if len(ids) != 1 || ids[""] {
		t.Errorf("job ids %v, want one", ids)
	}
}

func TestInFlightReject(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	h := newHarness(t, Config{InFlightReject: true, AttemptTimeout: patience}, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		return created(w, r, n)
	})
	firstCh := h.goDo(post("k", `{}`))
	recv(t, entered, "the upstream call")
	rec := h.do(post("k", `{}`))
	p := wantProblem(t, rec, http.StatusConflict, ProblemInFlight)
	wantRetryAfter(t, rec)
	close(release)
	first := recv(t, firstCh, "the first answer")
	if first.Code != http.StatusCreated || p.JobID != jobID(t, first) {
		t.Errorf("first: status %d, job %s; the 409 named job %q", first.Code, first.Header().Get(HeaderJobID), p.JobID)
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// waitScenario starts a first request whose upstream blocks until release,
// then a duplicate that waits; it returns both answers' channels. A
// *memory.Ledger in cfg is used, else a new one.
func waitScenario(t *testing.T, cfg Config, answer upstreamFunc) (h *harness, release chan struct{}, first, dup <-chan *httptest.ResponseRecorder) {
	return waitScenarioDup(t, cfg, answer, post("k", `{}`))
}

// waitScenarioDup is waitScenario with the duplicate request dupReq.
func waitScenarioDup(t *testing.T, cfg Config, answer upstreamFunc, dupReq *http.Request) (h *harness, release chan struct{}, first, dup <-chan *httptest.ResponseRecorder) {
	ml, ok := cfg.Ledger.(*memory.Ledger)
	if !ok {
		ml = memory.New()
	}
	hl := &hookLedger{Ledger: ml, waits: make(chan string, 4)}
	cfg.Ledger = hl
	entered := make(chan struct{}, 1)
	release = make(chan struct{})
	h = newHarness(t, cfg, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		return answer(w, r, n)
	})
	first = h.goDo(post("k", `{}`))
	recv(t, entered, "the upstream call")
	dup = h.goDo(dupReq)
	recv(t, hl.waits, "the duplicate to wait")
	return h, release, first, dup
}

func TestWaiterStillInFlightWhenTheWaitEnds(t *testing.T) {
	h, release, firstCh, dupCh := waitScenario(t, Config{AttemptTimeout: patience, InFlightWait: 50 * time.Millisecond}, created)
	dup := recv(t, dupCh, "the duplicate's answer")
	wantProblem(t, dup, http.StatusConflict, ProblemInFlight)
	wantRetryAfter(t, dup)
	close(release)
	first := recv(t, firstCh, "the first answer")
	if first.Code != http.StatusCreated || jobID(t, dup) != jobID(t, first) {
		t.Errorf("first %d, job ids %s / %s", first.Code, jobID(t, first), jobID(t, dup))
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

func TestWaiterSeesDefinitiveFailure(t *testing.T) {
	h, release, firstCh, dupCh := waitScenario(t, Config{AttemptTimeout: patience}, func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, err := io.WriteString(w, "busy")
		return err
	})
	close(release)
	first := recv(t, firstCh, "the first answer")
	if first.Code != http.StatusServiceUnavailable || first.Body.String() != "busy" {
		t.Errorf("first: %d %q, want the provider's 503", first.Code, first.Body)
	}
	dup := recv(t, dupCh, "the duplicate's answer")
	wantProblem(t, dup, http.StatusServiceUnavailable, ProblemAttemptFailed)
	wantRetryAfter(t, dup)
	if jobID(t, dup) != jobID(t, first) {
		t.Error("different job ids")
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

func TestWaiterSeesUnknown(t *testing.T) {
	h, release, firstCh, dupCh := waitScenario(t, Config{AttemptTimeout: patience}, func(http.ResponseWriter, *http.Request, int) error {
		return errors.New("connection reset after the request was written")
	})
	close(release)
	wantProblem(t, recv(t, firstCh, "the first answer"), http.StatusBadGateway, ProblemOutcomeUnknown)
	dup := recv(t, dupCh, "the duplicate's answer")
	wantProblem(t, dup, http.StatusConflict, ProblemOutcomeUnknown)
	wantRetryAfter(t, dup)
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// ---- Timeouts and unknown outcomes.

func TestAttemptTimeoutThenLateResult(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var lateCtxErr atomic.Value
	h := newHarness(t, Config{AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: patience}, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		lateCtxErr.Store(fmt.Sprint(r.Context().Err()))
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, "late")
		return err
	})
	rec := h.do(post("k", `{}`))
	p := wantProblem(t, rec, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	id := jobID(t, rec)
	if p.JobID != id || !strings.Contains(rec.Body.String(), id) {
		t.Errorf("the 504 does not name the job: %s", rec.Body)
	}
	recv(t, entered, "the upstream call")
	j := h.job(id)
	if j.State != ledger.JobUnknown || j.Attempts[0].State != ledger.AttemptUnknown {
		t.Fatalf("job %s, attempt %s; want unknown", j.State, j.Attempts[0].State)
	}

	// Retries of an unknown job: 409, no new attempt.
	for range 2 {
		retry := h.do(post("k", `{}`))
		wantProblem(t, retry, http.StatusConflict, ProblemOutcomeUnknown)
		wantRetryAfter(t, retry)
		if jobID(t, retry) != id {
			t.Errorf("retry names job %s, want %s", jobID(t, retry), id)
		}
	}
	if h.up.calls() != 1 {
		t.Fatalf("upstream called %d times", h.up.calls())
	}

	// The attempt kept running; its late result completes the job.
	close(release)
	h.waitRun()
	if got := lateCtxErr.Load(); got != "<nil>" {
		t.Errorf("the attempt's context ended before its deadline: %v", got)
	}
	j = h.job(id)
	if j.State != ledger.JobCompleted || j.CompletedBy != j.Attempts[0].ID || len(j.Attempts) != 1 {
		t.Fatalf("job %s completed by %q, %d attempts", j.State, j.CompletedBy, len(j.Attempts))
	}
	retry := h.do(post("k", `{}`))
	if retry.Code != http.StatusCreated || retry.Body.String() != "late" || retry.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("retry after the late result: %d %q replayed=%q", retry.Code, retry.Body, retry.Header().Get(HeaderReplayed))
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// A result after attempt_deadline (by the ledger's clock) is dropped, and
// the job stays unknown; its retries get no Retry-After any more.
func TestLateResultAfterDeadlineIsDropped(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	h := newHarness(t, Config{
		Ledger:         memory.New(memory.WithClock(clock.now)),
		AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: patience,
	}, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		return created(w, r, n)
	})
	rec := h.do(post("k", `{}`))
	wantProblem(t, rec, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
	id := jobID(t, rec)
	recv(t, entered, "the upstream call")
	wantRetryAfter(t, h.do(post("k", `{}`)))

	clock.advance(patience + time.Second)
	retry := h.do(post("k", `{}`))
	wantProblem(t, retry, http.StatusConflict, ProblemOutcomeUnknown)
	if v := retry.Header().Get("Retry-After"); v != "" {
		t.Errorf("Retry-After %q after attempt_deadline", v)
	}

	close(release)
	h.waitRun()
	j := h.job(id)
	if j.State != ledger.JobUnknown || j.CompletedBy != "" || j.Attempts[0].State != ledger.AttemptLost {
		t.Errorf("job %s completed by %q, attempt %s; want unknown, none, lost", j.State, j.CompletedBy, j.Attempts[0].State)
	}
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemOutcomeUnknown)
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// The timeout can fire before the attempt's goroutine has run at all: the
// job must still be recorded unknown before the client is told so.
func TestTimeoutBeforeTheAttemptStarts(t *testing.T) {
	for i := range 20 {
		release := make(chan struct{})
		h := newHarness(t, Config{AttemptTimeout: time.Nanosecond, AttemptDeadline: patience}, func(w http.ResponseWriter, r *http.Request, n int) error {
			<-release
			return created(w, r, n)
		})
		rec := h.do(post("k", `{}`))
		wantProblem(t, rec, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
		if j := h.job(jobID(t, rec)); j.State != ledger.JobUnknown {
			t.Fatalf("run %d: the client got a 504 but the job is %s", i, j.State)
		}
		close(release)
		h.waitRun()
	}
}

func TestUnknownOutcomes(t *testing.T) {
	tests := []struct {
		name   string
		status int
		fn     upstreamFunc
	}{
		{"error before writing", http.StatusBadGateway, func(http.ResponseWriter, *http.Request, int) error {
			return errors.New("read: connection reset by peer")
		}},
		{"OpError that is not a dial", http.StatusBadGateway, func(http.ResponseWriter, *http.Request, int) error {
			return &net.OpError{Op: "read", Net: "tcp", Err: errors.New("connection reset by peer")}
		}},
		{"timeout error", http.StatusGatewayTimeout, func(http.ResponseWriter, *http.Request, int) error {
			return fmt.Errorf("upstream: %w", context.DeadlineExceeded)
		}},
		{"499 from below", http.StatusBadGateway, func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(499)
			return nil
		}},
		{"error after writing", http.StatusBadGateway, func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"partial":`)
			return io.ErrUnexpectedEOF
		}},
		{"ErrAbortHandler after headers", http.StatusBadGateway, func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"partial":`)
			panic(http.ErrAbortHandler)
		}},
		{"panic before writing", http.StatusBadGateway, func(http.ResponseWriter, *http.Request, int) error {
			panic("provider bug")
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{}, tt.fn)
			rec := h.do(post("k", `{}`))
			p := wantProblem(t, rec, tt.status, ProblemOutcomeUnknown)
			if p.JobID == "" || strings.Contains(rec.Body.String(), "partial") {
				t.Errorf("body %s: want the job id and no part of the answer", rec.Body)
			}
			j := h.job(p.JobID)
			if j.State != ledger.JobUnknown || j.Attempts[0].State != ledger.AttemptUnknown {
				t.Errorf("job %s, attempt %s; want unknown", j.State, j.Attempts[0].State)
			}
			retry := h.do(post("k", `{}`))
			wantProblem(t, retry, http.StatusConflict, ProblemOutcomeUnknown)
			wantRetryAfter(t, retry)
			if h.up.calls() != 1 {
				t.Errorf("upstream called %d times: an unknown job was re-run", h.up.calls())
			}
			// The process survived, and other jobs still run.
			h.waitRun()
			h.up.fn = nil
			if rec := h.do(post("other", `{}`)); rec.Code != http.StatusCreated {
				t.Errorf("next job: status %d", rec.Code)
			}
		})
	}
}

// ---- Definitive failures and failover.

func TestUpstream503FailsThenRetryReopens(t *testing.T) {
	h := newHarness(t, Config{}, func(w http.ResponseWriter, r *http.Request, n int) error {
		if n == 1 {
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, err := io.WriteString(w, "overloaded")
			return err
		}
		return created(w, r, n)
	})
	first := h.do(post("k", `{}`))
	if first.Code != http.StatusServiceUnavailable || first.Body.String() != "overloaded" || first.Header().Get("Retry-After") != "7" {
		t.Fatalf("first: %d %q, want the provider's 503", first.Code, first.Body)
	}
	id := jobID(t, first)
	if j := h.job(id); j.State != ledger.JobFailed || j.Attempts[0].State != ledger.AttemptFailed {
		t.Fatalf("job %s, attempt %s; want failed", j.State, j.Attempts[0].State)
	}
	if got := h.up.request(0).header.Get(HeaderAttempt); got != "1" {
		t.Errorf("first attempt header %q", got)
	}

	retry := h.do(post("k", `{}`))
	if retry.Code != http.StatusCreated || retry.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("retry: %d replayed=%q, want a new attempt's answer", retry.Code, retry.Header().Get(HeaderReplayed))
	}
	if jobID(t, retry) != id {
		t.Errorf("the retry has a new job %s, want %s", jobID(t, retry), id)
	}
	if h.up.calls() != 2 {
		t.Fatalf("upstream called %d times", h.up.calls())
	}
	if got := h.up.request(1).header.Get(HeaderAttempt); got != "2" {
		t.Errorf("%s seen by the upstream: %q, want 2", HeaderAttempt, got)
	}
	if got := h.up.request(1).header.Get(HeaderJobID); got != id {
		t.Errorf("%s seen by the upstream: %q, want %s", HeaderJobID, got, id)
	}
	j := h.job(id)
	if j.State != ledger.JobCompleted || len(j.Attempts) != 2 || j.CompletedBy != j.Attempts[1].ID {
		t.Errorf("job %s with %d attempts, completed by %q", j.State, len(j.Attempts), j.CompletedBy)
	}
	if rec := h.do(post("k", `{}`)); rec.Body.String() != retry.Body.String() || rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("third request: %d %q", rec.Code, rec.Body)
	}
}

func TestConnectErrorAllProvidersFailed(t *testing.T) {
	dialErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	errNoUpstream := errors.New("no upstreams available")
	tests := []struct {
		name string
		cfg  Config
		err  error
	}{
		{"dial error", Config{}, fmt.Errorf("proxy: %w", dialErr)},
		{"custom connect error test", Config{IsConnectError: func(err error) bool { return errors.Is(err, errNoUpstream) }}, errNoUpstream},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, tt.cfg, func(w http.ResponseWriter, r *http.Request, n int) error {
				if n == 1 {
					return tt.err
				}
				return created(w, r, n)
			})
			rec := h.do(post("k", `{}`))
			p := wantProblem(t, rec, http.StatusBadGateway, ProblemAllFailed)
			if j := h.job(p.JobID); j.State != ledger.JobFailed {
				t.Fatalf("job %s, want failed", j.State)
			}
			retry := h.do(post("k", `{}`))
			if retry.Code != http.StatusCreated || h.up.calls() != 2 || h.up.request(1).header.Get(HeaderAttempt) != "2" {
				t.Errorf("retry: %d, %d upstream calls; want a second attempt", retry.Code, h.up.calls())
			}
		})
	}
}

func TestFailover(t *testing.T) {
	tests := []struct {
		name string
		a    upstreamFunc
	}{
		{"503", func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		}},
		{"429", func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(http.StatusTooManyRequests)
			return nil
		}},
		{"connect error", func(http.ResponseWriter, *http.Request, int) error {
			return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, b := &fakeUpstream{fn: tt.a}, &fakeUpstream{}
			h := newHarness(t, Config{Providers: []Provider{{Name: "a", Handler: a}, {Name: "b", Handler: b}}}, nil)
			rec := h.do(post("k", `{}`))
			if rec.Code != http.StatusCreated || a.calls() != 1 || b.calls() != 1 {
				t.Fatalf("status %d, a %d calls, b %d calls", rec.Code, a.calls(), b.calls())
			}
			id := jobID(t, rec)
			if got := b.request(0).header; got.Get(HeaderAttempt) != "2" || got.Get(HeaderJobID) != id {
				t.Errorf("b saw attempt %q of job %q", got.Get(HeaderAttempt), got.Get(HeaderJobID))
			}
			j := h.job(id)
			if len(j.Attempts) != 2 || j.Attempts[0].Provider != "a" || j.Attempts[0].State != ledger.AttemptFailed ||
				j.Attempts[1].Provider != "b" || j.Attempts[1].State != ledger.AttemptSucceeded || j.State != ledger.JobCompleted {
				t.Errorf("job %s, attempts %+v", j.State, j.Attempts)
			}
		})
	}
	t.Run("the last provider's answer", func(t *testing.T) {
		busy := func(w http.ResponseWriter, _ *http.Request, n int) error {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, err := fmt.Fprintf(w, "busy %d", n)
			return err
		}
		a, b := &fakeUpstream{fn: busy}, &fakeUpstream{fn: busy}
		h := newHarness(t, Config{Providers: []Provider{{Name: "a", Handler: a}, {Name: "b", Handler: b}}}, nil)
		rec := h.do(post("k", `{}`))
		if rec.Code != http.StatusServiceUnavailable || rec.Body.String() != "busy 1" || b.calls() != 1 {
			t.Errorf("%d %q, b %d calls; want b's 503", rec.Code, rec.Body, b.calls())
		}
		if j := h.job(jobID(t, rec)); j.State != ledger.JobFailed {
			t.Errorf("job %s", j.State)
		}
	})
	t.Run("no failover on an answer", func(t *testing.T) {
		a := &fakeUpstream{fn: func(w http.ResponseWriter, _ *http.Request, _ int) error {
			w.WriteHeader(http.StatusInternalServerError)
			return nil
		}}
		b := &fakeUpstream{}
		h := newHarness(t, Config{Providers: []Provider{{Name: "a", Handler: a}, {Name: "b", Handler: b}}}, nil)
		rec := h.do(post("k", `{}`))
		if rec.Code != http.StatusInternalServerError || b.calls() != 0 {
			t.Errorf("%d, b %d calls; a 500 is the job's result", rec.Code, b.calls())
		}
	})
	t.Run("no failover after a timeout", func(t *testing.T) {
		entered, release := make(chan struct{}, 1), make(chan struct{})
		a := &fakeUpstream{fn: func(w http.ResponseWriter, _ *http.Request, _ int) error {
			entered <- struct{}{}
			<-release
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		}}
		b := &fakeUpstream{}
		h := newHarness(t, Config{
			Providers:      []Provider{{Name: "a", Handler: a}, {Name: "b", Handler: b}},
			AttemptTimeout: 50 * time.Millisecond, AttemptDeadline: patience,
		}, nil)
		rec := h.do(post("k", `{}`))
		wantProblem(t, rec, http.StatusGatewayTimeout, ProblemOutcomeUnknown)
		recv(t, entered, "a's call")
		close(release)
		h.waitRun()
		if b.calls() != 0 {
			t.Errorf("b called %d times after a timed out", b.calls())
		}
		// The late 503 proves a did not act: the job failed, a retry may
		// start a new attempt.
		if j := h.job(jobID(t, rec)); j.State != ledger.JobFailed {
			t.Errorf("job %s, want failed", j.State)
		}
	})
	t.Run("connect_error not in failover_on", func(t *testing.T) {
		a := &fakeUpstream{fn: func(http.ResponseWriter, *http.Request, int) error {
			return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
		}}
		b := &fakeUpstream{}
		h := newHarness(t, Config{
			Providers:  []Provider{{Name: "a", Handler: a}, {Name: "b", Handler: b}},
			FailoverOn: fallback.FailoverOn{Statuses: map[int]bool{503: true}},
		}, nil)
		wantProblem(t, h.do(post("k", `{}`)), http.StatusBadGateway, ProblemAllFailed)
		if b.calls() != 0 {
			t.Errorf("b called %d times", b.calls())
		}
	})
}

// ---- The client and the detached attempt.

func TestClientDisconnectDoesNotStopTheAttempt(t *testing.T) {
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var upstreamCtxErr atomic.Value
	h := newHarness(t, Config{AttemptTimeout: patience}, func(w http.ResponseWriter, r *http.Request, n int) error {
		entered <- struct{}{}
		<-release
		upstreamCtxErr.Store(fmt.Sprint(r.Context().Err()))
		return created(w, r, n)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	recCh := h.goDo(post("k", `{}`).WithContext(ctx))
	recv(t, entered, "the upstream call")
	cancel()
	rec := recv(t, recCh, "ServeHTTP to return after the client left")
	if rec.Body.Len() != 0 {
		t.Errorf("wrote %q to a departed client", rec.Body)
	}
	close(release)
	h.waitRun()
	if got := upstreamCtxErr.Load(); got != "<nil>" {
		t.Errorf("the upstream's context was cancelled with the client's: %v", got)
	}
	retry := h.do(post("k", `{}`))
	if retry.Code != http.StatusCreated || retry.Header().Get(HeaderReplayed) != "true" || !strings.Contains(retry.Body.String(), "ch_1") {
		t.Errorf("retry: %d %q replayed=%q", retry.Code, retry.Body, retry.Header().Get(HeaderReplayed))
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

func TestLargeAnswerPassesThroughUnstored(t *testing.T) {
	const max, chunk, chunks = 64, 50, 10
	var want bytes.Buffer
	for i := range chunks {
		fmt.Fprintf(&want, "%0*d", chunk, i)
	}
	h := newHarness(t, Config{MaxResponseBody: max}, func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("X-Big", "yes")
		w.WriteHeader(http.StatusOK)
		for i := range chunks {
			if _, err := w.Write(want.Bytes()[i*chunk : (i+1)*chunk]); err != nil {
				return err
			}
		}
		return nil
	})
	rec := h.do(post("k", `{}`))
	if rec.Code != http.StatusOK || !bytes.Equal(rec.Body.Bytes(), want.Bytes()) {
		t.Fatalf("status %d, %d bytes; want all %d bytes", rec.Code, rec.Body.Len(), want.Len())
	}
	id := jobID(t, rec)
	if rec.Header().Get("X-Big") != "yes" || rec.Header().Get(HeaderReplayed) != "" {
		t.Errorf("headers %v", rec.Header())
	}
	j := h.job(id)
	if j.State != ledger.JobCompleted || j.Response == nil || j.Response.Stored || j.Response.Size != int64(want.Len()) ||
		j.Response.Status != http.StatusOK || len(j.Response.Body) != 0 {
		t.Fatalf("job %s, response %+v; want completed, not stored, size %d", j.State, j.Response, want.Len())
	}
	retry := h.do(post("k", `{}`))
	p := wantProblem(t, retry, http.StatusConflict, ProblemNotStored)
	if p.JobID != id {
		t.Errorf("job_id %q, want %q", p.JobID, id)
	}
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

func TestAnswerOfExactlyMaxIsStored(t *testing.T) {
	body := strings.Repeat("z", 64)
	h := newHarness(t, Config{MaxResponseBody: 64}, func(w http.ResponseWriter, _ *http.Request, _ int) error {
		_, err := io.WriteString(w, body)
		return err
	})
	first := h.do(post("k", `{}`))
	retry := h.do(post("k", `{}`))
	if first.Body.String() != body || retry.Body.String() != body || retry.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("first %q, retry %d %q", first.Body, retry.Code, retry.Body)
	}
}

// ---- What the upstream sees.

func TestUpstreamSeesIdentityHeaders(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	r := post("", `{"amount":100}`)
	const sent = `"a\"b"`
	r.Header.Set(DefaultKeyHeader, sent)
	r.Header.Set("X-Custom", "kept")
	rec := h.do(r)
	id := jobID(t, rec)
	got := h.up.request(0)
	if v := got.header.Values(DefaultKeyHeader); len(v) != 1 || v[0] != sent {
		t.Errorf("upstream saw key %q, want %q exactly as sent", v, sent)
	}
	if v := got.header.Get(HeaderJobID); v != id {
		t.Errorf("upstream saw job id %q, want %q", v, id)
	}
	if v := got.header.Get(HeaderAttempt); v != "1" {
		t.Errorf("upstream saw attempt %q, want 1", v)
	}
	if got.header.Get("X-Custom") != "kept" || got.header.Get("Authorization") != testOwner {
		t.Errorf("client headers lost: %v", got.header)
	}
	if got.method != http.MethodPost || got.uri != "/v1/charges?currency=eur" {
		t.Errorf("upstream saw %s %s", got.method, got.uri)
	}
	// The client's request is not changed.
	if r.Header.Get(HeaderJobID) != "" || r.Header.Get(HeaderAttempt) != "" {
		t.Error("the gateway's headers leaked into the client's request")
	}
}

// No HTTP client below the gateway may count an attempt's request as
// replayable: its body is never nil or http.NoBody, and it has no GetBody.
func TestUpstreamRequestIsNotReplayable(t *testing.T) {
	tests := []struct {
		name string
		body io.Reader
		want string
	}{
		{"no body", nil, ""},
		{"empty body", strings.NewReader(""), ""},
		{"empty body, unknown length", unsized{strings.NewReader("")}, ""},
		{"body", strings.NewReader(`{"a":1}`), `{"a":1}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, Config{}, nil)
			r := httptest.NewRequest(http.MethodPost, "/x", tt.body)
			r.Header.Set(DefaultKeyHeader, "k")
			r.Header.Set("Authorization", testOwner)
			if rec := h.do(r); rec.Code != http.StatusCreated {
				t.Fatalf("status %d", rec.Code)
			}
			got := h.up.request(0)
			if got.bodyNil || got.bodyNoBody || got.getBody {
				t.Errorf("body nil %v, NoBody %v, GetBody set %v: the request is replayable", got.bodyNil, got.bodyNoBody, got.getBody)
			}
			want := tt.want
			if string(got.body) != want {
				t.Errorf("upstream body %q, want %q", got.body, want)
			}
			if want != "" && got.contentLength != int64(len(want)) {
				t.Errorf("Content-Length %d, want %d", got.contentLength, len(want))
			}
			if want == "" && got.contentLength == 0 {
				t.Error("an empty body with Content-Length 0 becomes a nil body in reverse_proxy")
			}
		})
	}
}

// The proof at the transport: a provider that reads the request and then
// closes a reused connection without answering is executed once, although
// the request carries Idempotency-Key and Go's client re-sends such
// requests when it may.
func TestTransportDoesNotResendAnAttempt(t *testing.T) {
	for _, body := range []string{"", `{"a":1}`} {
		t.Run(fmt.Sprintf("body %q", body), func(t *testing.T) {
			var posts atomic.Int32
			backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method != http.MethodPost {
					io.WriteString(w, "warm")
					return
				}
				posts.Add(1)
				io.Copy(io.Discard, r.Body)
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				conn.Close()
			}))
			defer backend.Close()
			target, err := url.Parse(backend.URL)
			if err != nil {
				t.Fatal(err)
			}
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()

			// Leave an idle connection for the attempt to reuse.
			warm, err := http.NewRequest(http.MethodGet, backend.URL+"/warm", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := tr.RoundTrip(warm)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()

			proxy := HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				out := r.Clone(r.Context())
				out.URL.Scheme, out.URL.Host = target.Scheme, target.Host
				out.RequestURI, out.Host = "", ""
				resp, err := tr.RoundTrip(out)
				if err != nil {
					return err
				}
				defer resp.Body.Close()
				w.WriteHeader(resp.StatusCode)
				_, err = io.Copy(w, resp.Body)
				return err
			})
			m, err := New(Config{Ledger: memory.New()})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/x", strings.NewReader(body))
			r.Header.Set(DefaultKeyHeader, "k")
			r.Header.Set("Authorization", testOwner)
			rec := httptest.NewRecorder()
			if err := m.ServeHTTP(rec, r, proxy); err != nil {
				t.Fatal(err)
			}
			wantProblem(t, rec, http.StatusBadGateway, ProblemOutcomeUnknown)
			if n := posts.Load(); n != 1 {
				t.Errorf("the provider executed the request %d times, want 1", n)
			}
		})
	}
}

// ---- The ledger.

func TestLedgerUnavailable(t *testing.T) {
	hl := &hookLedger{Ledger: memory.New(), reserveErr: errors.New("connection refused")}
	h := newHarness(t, Config{Ledger: hl}, nil)
	rec := h.do(post("k", `{}`))
	p := wantProblem(t, rec, http.StatusServiceUnavailable, ProblemLedgerUnavailable)
	wantRetryAfter(t, rec)
	if p.JobID != "" {
		t.Errorf("job_id %q", p.JobID)
	}
	if h.up.calls() != 0 {
		t.Errorf("upstream called %d times: the gateway must fail closed", h.up.calls())
	}
}

func TestCompleteFailureStillDeliversTheAnswer(t *testing.T) {
	hl := &hookLedger{Ledger: memory.New(), completeErr: errors.New("ledger went away")}
	h := newHarness(t, Config{Ledger: hl, InFlightReject: true}, nil)
	rec := h.do(post("k", `{}`))
	if rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), "ch_1") || rec.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("%d %q: the client must get the provider's answer", rec.Code, rec.Body)
	}
	id := jobID(t, rec)
	if j := h.job(id); j.State != ledger.JobPending || j.CompletedBy != "" {
		t.Errorf("job %s completed by %q, want unreconciled (pending)", j.State, j.CompletedBy)
	}
	// Never re-executed on retry.
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemInFlight)
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

func TestOwnerSecretKeysTheStoredHashes(t *testing.T) {
	secret := []byte("s3cret")
	l := memory.New()
	h := newHarness(t, Config{Ledger: l, OwnerSecret: secret}, nil)
	rec := h.do(post("k-1", `{}`))
	id := jobID(t, rec)
	j := h.job(id)
	keyed, plain := NewHasher(secret), NewHasher(nil)
	if !bytes.Equal(j.OwnerHash, keyed.Owner(testOwner)) || !bytes.Equal(j.KeyHash, keyed.Key("k-1")) {
		t.Errorf("stored hashes %x / %x are not the HMACs of owner and key", j.OwnerHash, j.KeyHash)
	}
	if bytes.Equal(j.OwnerHash, plain.Owner(testOwner)) || bytes.Equal(j.KeyHash, plain.Key("k-1")) {
		t.Error("the owner secret does not change the stored hashes")
	}
	if bytes.Contains(j.OwnerHash, []byte("alice")) || bytes.Contains(j.KeyHash, []byte("k-1")) {
		t.Error("owner or key stored in clear")
	}

	// Another instance with the same secret finds the job...
	same := newHarness(t, Config{Ledger: l, OwnerSecret: secret}, nil)
	if rec := same.do(post("k-1", `{}`)); rec.Header().Get(HeaderReplayed) != "true" || same.up.calls() != 0 {
		t.Errorf("same secret: %d, %d upstream calls; want a replay", rec.Code, same.up.calls())
	}
	// ...one without it does not: its job is another, under plain hashes.
	other := newHarness(t, Config{Ledger: l}, nil)
	rec = other.do(post("k-1", `{}`))
	if rec.Code != http.StatusCreated || rec.Header().Get(HeaderReplayed) != "" || other.up.calls() != 1 {
		t.Fatalf("no secret: %d replayed=%q", rec.Code, rec.Header().Get(HeaderReplayed))
	}
	if otherID := jobID(t, rec); otherID == id || !bytes.Equal(other.job(otherID).OwnerHash, plain.Owner(testOwner)) {
		t.Errorf("without the secret: job %s (secret's job %s)", otherID, id)
	}
}

// ---- Plain net/http use, hooks and configuration.

func TestWrapHandlerThatWritesNothing(t *testing.T) {
	l := memory.New()
	m, err := New(Config{Ledger: l})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { calls.Add(1) }))
	first := httptest.NewRecorder()
	h.ServeHTTP(first, post("k", `{}`))
	if first.Code != http.StatusOK || first.Body.Len() != 0 {
		t.Fatalf("status %d body %q, want net/http's empty 200", first.Code, first.Body)
	}
	id := jobID(t, first)
	j, err := l.Job(context.Background(), id)
	if err != nil || j.State != ledger.JobCompleted || j.Response.Status != http.StatusOK {
		t.Fatalf("job %+v, %v", j, err)
	}
	retry := httptest.NewRecorder()
	h.ServeHTTP(retry, post("k", `{}`))
	if retry.Code != http.StatusOK || retry.Header().Get(HeaderReplayed) != "true" || calls.Load() != 1 {
		t.Errorf("retry %d replayed=%q, %d calls", retry.Code, retry.Header().Get(HeaderReplayed), calls.Load())
	}
}

type countingObserver struct {
	mu       sync.Mutex
	requests map[string]int
	attempts map[string]int
	inFlight int
	ops      map[string]int
	repeats  map[string]int
}

func newCountingObserver() *countingObserver {
	return &countingObserver{requests: map[string]int{}, attempts: map[string]int{}, ops: map[string]int{}, repeats: map[string]int{}}
}

func (o *countingObserver) Request(outcome string) {
	o.mu.Lock()
	o.requests[outcome]++
	o.mu.Unlock()
}

func (o *countingObserver) Attempt(provider, result string) {
	o.mu.Lock()
	o.attempts[provider+"/"+result]++
	o.mu.Unlock()
}

func (o *countingObserver) RaceLost() {}

func (o *countingObserver) InFlight(d int) {
	o.mu.Lock()
	o.inFlight += d
	o.mu.Unlock()
}

func (o *countingObserver) LedgerOp(op string, _ time.Duration) {
	o.mu.Lock()
	o.ops[op]++
	o.mu.Unlock()
}

func (o *countingObserver) LedgerRepeat(op string) {
	o.mu.Lock()
	o.repeats[op]++
	o.mu.Unlock()
}

func TestObserverAndVars(t *testing.T) {
	obs := newCountingObserver()
	var mu sync.Mutex
	vars := map[*http.Request]map[string]string{}
	setVar := func(r *http.Request, name, value string) {
		mu.Lock()
		defer mu.Unlock()
		if vars[r] == nil {
			vars[r] = map[string]string{}
		}
		vars[r][name] = value
	}
	h := newHarness(t, Config{Observer: obs, SetVar: setVar}, nil)
	r1, r2, r3 := post("k", `{}`), post("k", `{}`), post("k", `{"x":1}`)
	id := jobID(t, h.do(r1))
	h.do(r2)
	h.do(r3)
	h.waitRun()

	mu.Lock()
	if v := vars[r1]; v["job_id"] != id || v["attempt"] != "1" || v["replayed"] != "" {
		t.Errorf("first request vars %v", v)
	}
	if v := vars[r2]; v["job_id"] != id || v["replayed"] != "true" {
		t.Errorf("replay vars %v", v)
	}
	mu.Unlock()

	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.requests["new"] != 1 || obs.requests["replayed"] != 1 || obs.requests["mismatch"] != 1 {
		t.Errorf("requests %v", obs.requests)
	}
	if obs.attempts[DefaultProvider+"/succeeded"] != 1 || len(obs.attempts) != 1 {
		t.Errorf("attempts %v", obs.attempts)
	}
	if obs.inFlight != 0 {
		t.Errorf("in flight %d after every run ended", obs.inFlight)
	}
	if obs.ops["reserve"] != 3 || obs.ops["complete"] != 1 {
		t.Errorf("ledger ops %v", obs.ops)
	}
}

func TestConfigDefaultsAndErrors(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Error("New without a ledger succeeded")
	}
	if _, err := New(Config{Ledger: memory.New(), AttemptTimeout: time.Minute, AttemptDeadline: time.Second}); err == nil {
		t.Error("attempt_deadline shorter than attempt_timeout accepted")
	}
	m, err := New(Config{Ledger: memory.New(), KeyHeader: "x-idem-key", Methods: []string{"put"}, FingerprintHeaders: []string{"x-account"}})
	if err != nil {
		t.Fatal(err)
	}
	c := m.Config()
	if c.KeyHeader != "X-Idem-Key" || c.Methods[0] != "PUT" || c.FingerprintHeaders[0] != "X-Account" {
		t.Errorf("names not canonical: %q %q %q", c.KeyHeader, c.Methods, c.FingerprintHeaders)
	}
	if c.AttemptTimeout != DefaultAttemptTimeout || c.AttemptDeadline != DefaultAttemptDeadline || c.InFlightWait != c.AttemptTimeout ||
		c.MaxRequestBody != DefaultMaxRequestBody || c.MaxResponseBody != DefaultMaxResponseBody || c.Retention != DefaultRetention {
		t.Errorf("defaults %+v", c)
	}
	if !c.FailoverOn.ConnectError || !c.FailoverOn.Statuses[429] || !c.FailoverOn.Statuses[503] || c.FailoverOn.Statuses[500] {
		t.Errorf("failover_on default %+v", c.FailoverOn)
	}

	// The configured header and methods are the ones ledgered.
	h := newHarness(t, Config{KeyHeader: "x-idem-key", Methods: []string{"put"}}, nil)
	r := httptest.NewRequest(http.MethodPut, "/x", strings.NewReader("{}"))
	r.Header.Set("Authorization", testOwner)
	r.Header.Set("X-Idem-Key", "k")
	h.do(r)
	r = httptest.NewRequest(http.MethodPut, "/x", strings.NewReader("{}"))
	r.Header.Set("Authorization", testOwner)
	r.Header.Set("X-Idem-Key", "k")
	if rec := h.do(r); rec.Header().Get(HeaderReplayed) != "true" || h.up.calls() != 1 {
		t.Errorf("PUT with X-Idem-Key not ledgered: %d", rec.Code)
	}
	if rec := h.do(post("k", "{}")); rec.Header().Get(HeaderJobID) != "" || h.up.calls() != 2 {
		t.Errorf("POST is ledgered although methods is PUT")
	}
}

func TestParseFailoverOn(t *testing.T) {
	tests := []struct {
		words   []string
		want    fallback.FailoverOn
		wantErr bool
	}{
		{[]string{"connect_error", "429", "503"}, fallback.FailoverOn{ConnectError: true, Statuses: map[int]bool{429: true, 503: true}}, false},
		{[]string{"502"}, fallback.FailoverOn{Statuses: map[int]bool{502: true}}, false},
		{[]string{"contract", "503"}, fallback.FailoverOn{Contract: true, Statuses: map[int]bool{503: true}}, false},
		{nil, fallback.FailoverOn{Statuses: map[int]bool{}}, false},
		{[]string{"5xx"}, fallback.FailoverOn{}, true},
		{[]string{"99"}, fallback.FailoverOn{}, true},
		{[]string{"600"}, fallback.FailoverOn{}, true},
		{[]string{"connect-error"}, fallback.FailoverOn{}, true},
	}
	for _, tt := range tests {
		got, err := fallback.ParseFailoverOn(tt.words)
		if (err != nil) != tt.wantErr {
			t.Errorf("fallback.ParseFailoverOn(%q) error %v", tt.words, err)
			continue
		}
		if !tt.wantErr && fmt.Sprint(got) != fmt.Sprint(tt.want) {
			t.Errorf("fallback.ParseFailoverOn(%q) = %+v, want %+v", tt.words, got, tt.want)
		}
	}
	// An explicit empty failover_on is kept, not replaced by the default.
	f, _ := fallback.ParseFailoverOn(nil)
	m, err := New(Config{Ledger: memory.New(), FailoverOn: f})
	if err != nil {
		t.Fatal(err)
	}
	if c := m.Config(); c.FailoverOn.ConnectError || len(c.FailoverOn.Statuses) != 0 {
		t.Errorf("empty failover_on became %+v", c.FailoverOn)
	}
}

func TestStoredHeader(t *testing.T) {
	h := http.Header{
		"Content-Type":      {"application/json"},
		"X-Multi":           {"1", "2"},
		"Connection":        {"X-Hop-A, x-hop-b", "close"},
		"X-Hop-A":           {"a"},
		"X-Hop-B":           {"b"},
		"Keep-Alive":        {"timeout=5"},
		"Transfer-Encoding": {"chunked"},
		"Trailer":           {"X-T"},
		"Upgrade":           {"h2c"},
		"Date":              {"Mon, 02 Jan 2006 15:04:05 GMT"},
		HeaderJobID:         {"j"},
		HeaderReplayed:      {"true"},
		"X-Empty":           {},
	}
	got := storedHeader(h)
	want := map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"1", "2"}, "X-Empty": nil}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("storedHeader = %#v, want %#v", got, want)
	}
	got["X-Multi"][0] = "changed"
	if h["X-Multi"][0] != "1" {
		t.Error("storedHeader shares value slices with the live header")
	}
	// The values share one array: appending to one header's must not
	// write over another's.
	_ = append(got["Content-Type"], "appended")
	_ = append(got["X-Multi"], "appended")
	if got["X-Multi"][1] != "2" || got["Content-Type"][0] != "application/json" {
		t.Errorf("an append to one stored header's values changed another's: %v", got)
	}
}

func TestProblemWrite(t *testing.T) {
	rec := httptest.NewRecorder()
	rec.Header().Set(HeaderReplayed, "true")
	problem(http.StatusConflict, ProblemInFlight, "Request in flight").withJob("j-1").withDetail("d").retry(1500 * time.Millisecond).Write(rec)
	p := wantProblem(t, rec, http.StatusConflict, ProblemInFlight)
	if p.JobID != "j-1" || p.Detail != "d" || rec.Header().Get("Retry-After") != "2" {
		t.Errorf("problem %+v, Retry-After %q", p, rec.Header().Get("Retry-After"))
	}
	for d, want := range map[time.Duration]string{0: "1", time.Millisecond: "1", time.Second: "1", time.Second + 1: "2", 10 * time.Second: "10"} {
		if got := retryAfterSeconds(d); got != want {
			t.Errorf("retryAfterSeconds(%v) = %s, want %s", d, got, want)
		}
	}
}

// rewriting changes a header field's values in place when the answer's
// header is written, as Caddy's deferred `header` operations do (a replace
// writes hdr[field][i]): a handler in front of the gateway may, and the
// answer it rewrites must be the client's alone.
type rewriting struct {
	http.ResponseWriter
	field string
}

func (w rewriting) WriteHeader(code int) {
	vals := w.Header()[w.field]
	for i := range vals {
		vals[i] += "+rewritten"
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w rewriting) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func TestReplayedHeadersAreTheClients(t *testing.T) {
	h := newHarness(t, Config{}, func(w http.ResponseWriter, r *http.Request, n int) error {
		w.Header().Set("Location", "/v1/charges/ch_1")
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, `{"id":"ch_1"}`)
		return err
	})
	first := h.do(post("k-rw", `{"amount":100}`))
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	h.waitRun()
	for i := range 3 {
		rec := httptest.NewRecorder()
		if err := h.m.ServeHTTP(rewriting{rec, "Location"}, post("k-rw", `{"amount":100}`), h.up); err != nil {
			t.Fatal(err)
		}
		if got := rec.Header().Get("Location"); got != "/v1/charges/ch_1+rewritten" {
			t.Errorf("rewritten replay %d: Location %q, want the stored answer's, rewritten once", i, got)
		}
	}
	if got := http.Header(h.job(jobID(t, first)).Response.Header).Get("Location"); got != "/v1/charges/ch_1" {
		t.Errorf("stored Location %q after rewritten replays", got)
	}
	if got := h.do(post("k-rw", `{"amount":100}`)).Header().Get("Location"); got != "/v1/charges/ch_1" {
		t.Errorf("replay: Location %q, want the stored answer's", got)
	}
}

// setCanonical takes these names as they are.
func TestHeaderNamesAreCanonical(t *testing.T) {
	for _, name := range []string{DefaultKeyHeader, HeaderJobID, HeaderAttempt, HeaderReplayed, HeaderReconciled, HeaderExpires, HeaderPreferenceApplied} {
		if c := http.CanonicalHeaderKey(name); c != name {
			t.Errorf("%q is not canonical: %q", name, c)
		}
	}
}

// appendHTTPDate writes what time.Format writes, for times of every
// weekday, month, and digit of the clock, in any zone.
func TestAppendHTTPDate(t *testing.T) {
	zone := time.FixedZone("UTC+5:30", 5*3600+1800)
	times := []time.Time{
		time.Date(1, time.January, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, time.December, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, time.January, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, time.March, 1, 0, 0, 0, 0, time.UTC),
		time.Date(2026, time.February, 28, 23, 30, 0, 0, zone),
	}
	at := time.Date(1999, time.December, 30, 0, 0, 0, 0, time.UTC)
	for i := range 5000 {
		times = append(times, at.In(zone))
		at = at.Add(time.Duration(i)*time.Hour + 61*time.Minute + 7*time.Second)
	}
	for _, tm := range times {
		if got, want := string(appendHTTPDate(nil, tm)), tm.UTC().Format(http.TimeFormat); got != want {
			t.Errorf("%v: %q, want %q", tm, got, want)
		}
	}
}

// A gateway behind another on the same ledger (an idempotency handler
// nested in a route of one already guarding the site) passes the outer
// one's attempts through: it used to find the outer job in flight and
// wait on it while the outer waited on it, until attempt_timeout left the
// job unknown and the provider never called.
func TestNestedGatewayPassesAttemptsThrough(t *testing.T) {
	l := memory.New()
	h := newHarness(t, Config{Ledger: l, AttemptTimeout: 2 * time.Second, Methods: []string{http.MethodPost}}, nil)
	inner, err := New(Config{Ledger: l, AttemptTimeout: 2 * time.Second}) // POST and PATCH
	if err != nil {
		t.Fatal(err)
	}
	through := HandlerFunc(func(w http.ResponseWriter, r *http.Request) error { return inner.ServeHTTP(w, r, h.up) })
	serve := func(method, key string) *httptest.ResponseRecorder {
		r := post(key, `{"amount":100}`)
		r.Method = method
		rec := httptest.NewRecorder()
		if err := h.m.ServeHTTP(rec, r, through); err != nil {
			t.Fatal(err)
		}
		return rec
	}
	first := serve(http.MethodPost, "k-nested")
	if first.Code != http.StatusCreated || first.Header().Get(HeaderReplayed) != "" {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	h.waitRun()
	replay := serve(http.MethodPost, "k-nested")
	if replay.Code != http.StatusCreated || replay.Header().Get(HeaderReplayed) != "true" || replay.Body.String() != first.Body.String() {
		t.Errorf("replay: %d %q %s", replay.Code, replay.Header().Get(HeaderReplayed), replay.Body)
	}
	if h.up.calls() != 1 || l.Len() != 1 {
		t.Errorf("upstream called %d times, %d jobs; want 1 and 1", h.up.calls(), l.Len())
	}
	wantJob(t, h.job(jobID(t, first)), ledger.JobCompleted, "next/succeeded")

	// A PATCH the outer one passes through is the inner one's to guard.
	patch := serve(http.MethodPatch, "k-patch")
	if patch.Code != http.StatusCreated || patch.Header().Get(HeaderJobID) == "" || l.Len() != 2 {
		t.Fatalf("PATCH: %d, job %q, %d jobs; want a job of the inner gateway's", patch.Code, patch.Header().Get(HeaderJobID), l.Len())
	}
	if again := serve(http.MethodPatch, "k-patch"); again.Header().Get(HeaderReplayed) != "true" || h.up.calls() != 2 {
		t.Errorf("PATCH again: replayed %q, upstream called %d times", again.Header().Get(HeaderReplayed), h.up.calls())
	}
}

// forgeOwnHeaders sets, as a provider might, the headers that are the
// gateway's own, with values no gateway would give.
func forgeOwnHeaders(h http.Header) {
	h.Set(HeaderJobID, "job_forged")
	h.Set(HeaderReplayed, "forged")
	h.Set(HeaderExpires, "Thu, 01 Jan 1970 00:00:00 GMT")
	h.Set(HeaderReconciled, "lookup")
}

// wantOwnHeaders fails unless h carries the gateway's own headers for job
// j, and not a provider's: its id, its expiry, and the replay mark on a
// replay alone.
func wantOwnHeaders(t *testing.T, name string, h http.Header, j *ledger.Job, replayed bool) {
	t.Helper()
	if got := h.Values(HeaderJobID); len(got) != 1 || got[0] != j.ID {
		t.Errorf("%s: %s %q, want %q", name, HeaderJobID, got, j.ID)
	}
	if got, want := h.Values(HeaderExpires), j.ExpiresAt.UTC().Format(http.TimeFormat); j.ExpiresAt.IsZero() || len(got) != 1 || got[0] != want {
		t.Errorf("%s: %s %q, want %q", name, HeaderExpires, got, want)
	}
	want := []string(nil)
	if replayed {
		want = []string{"true"}
	}
	if got := h.Values(HeaderReplayed); !slices.Equal(got, want) {
		t.Errorf("%s: %s %q, want %q", name, HeaderReplayed, got, want)
	}
	if got := h.Values(HeaderReconciled); got != nil {
		t.Errorf("%s: %s %q on an answer no lookup found", name, HeaderReconciled, got)
	}
}

// A provider's own Idempotency-Job-Id, Idempotent-Replayed or
// Idempotency-Expires never reaches a client, nor the stored answer: the
// first answer and every replay carry the gateway's.
func TestProviderCannotSetOwnHeaders(t *testing.T) {
	h := newHarness(t, Config{}, func(w http.ResponseWriter, r *http.Request, n int) error {
		forgeOwnHeaders(w.Header())
		w.WriteHeader(http.StatusCreated)
		_, err := io.WriteString(w, `{"id":"ch_1"}`)
		return err
	})
	first := h.do(post("k-own", `{"amount":100}`))
	if first.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	h.waitRun()
	j := h.job(first.Header().Get(HeaderJobID))
	wantOwnHeaders(t, "first answer", first.Header(), j, false)
	for _, name := range []string{HeaderJobID, HeaderReplayed, HeaderExpires, HeaderReconciled} {
		if v, ok := j.Response.Header[name]; ok {
			t.Errorf("stored answer carries %s %q", name, v)
		}
	}
	wantOwnHeaders(t, "replay", h.do(post("k-own", `{"amount":100}`)).Header(), j, true)
}
