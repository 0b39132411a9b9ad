package caddymodule

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// --- registry ---

func providerNames() []string {
	var names []string
	for _, p := range listProviders() {
		names = append(names, p.Name)
	}
	return names
}

func TestRegistry(t *testing.T) {
	if got := providerNames(); len(got) != 0 {
		t.Fatalf("registry not empty at start: %v", got)
	}
	un1 := registerProviders("s", []string{"a", "b", "a"})
	un2 := registerProviders("s", []string{"c", "b"}) // a reload overlapping the first config
	if got := providerNames(); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("providers = %v, want [a b c]", got)
	}
	if p := listProviders()[0]; p.Probe != nil {
		t.Errorf("a provider without a probe has probe %+v", p.Probe)
	}

	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	setProbe("s", "b", ProbeResult{OK: false, Error: "contract: status 500", At: at, Status: 500})
	setProbe("s", "nobody", ProbeResult{OK: true, At: at}) // not registered: dropped
	list := listProviders()
	if got := list[1]; got.Name != "b" || got.Probe == nil || got.Probe.OK || got.Probe.Status != 500 || !got.Probe.At.Equal(at) {
		t.Fatalf("b = %+v (probe %+v)", got, got.Probe)
	}
	list[1].Probe.Status = 1 // a copy: the registry is unchanged
	if listProviders()[1].Probe.Status != 500 {
		t.Error("listProviders returned the registry's own probe")
	}
	if len(list) != 3 {
		t.Errorf("an unregistered probe added a provider: %v", providerNames())
	}

	un1()
	un1() // no further effect
	if got := providerNames(); !slices.Equal(got, []string{"b", "c"}) {
		t.Fatalf("after the first config's cleanup: %v, want [b c]", got)
	}
	if listProviders()[0].Probe == nil {
		t.Error("b lost its probe while still registered")
	}
	un3 := registerProviders("s", []string{"a"})
	if got := providerNames(); !slices.Equal(got, []string{"b", "c", "a"}) {
		t.Fatalf("re-registered a is listed in first-registration order: %v, want [b c a]", got)
	}
	un2()
	un3()
	if got := providerNames(); len(got) != 0 {
		t.Fatalf("registry not empty after every cleanup: %v", got)
	}
	// A provider registered again starts without its old probe.
	un4 := registerProviders("s", []string{"b"})
	defer un4()
	if p := listProviders()[0]; p.Probe != nil {
		t.Errorf("a new registration kept an old probe: %+v", p.Probe)
	}
}

func TestRegistryConcurrent(t *testing.T) {
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 200 {
				name := fmt.Sprintf("p%d", j%5)
				scope := fmt.Sprintf("s%d", i%3)
				un := registerProviders(scope, []string{name, "shared"})
				setProbe(scope, name, ProbeResult{OK: i%2 == 0, At: time.Now()})
				probeOf(scope, "shared")
				listProviders()
				un()
			}
		})
	}
	wg.Wait()
	if got := providerNames(); len(got) != 0 {
		t.Fatalf("registry not empty: %v", got)
	}
}

// --- admin API ---

// testLedger opens a memory ledger in the process's pool, as a ledger
// module would, and closes it at the end of the test.
func testLedger(t *testing.T) *memory.Ledger {
	t.Helper()
	mem := memory.New()
	putLedger(t, mem)
	return mem
}

func putLedger(t *testing.T, l ledger.Ledger) {
	t.Helper()
	key := "test\x00" + t.Name() + "\x00" + ledger.NewID()
	if _, _, err := ledgers.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newShared(key, l, zap.NewNop()), nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ledgers.Delete(key); err != nil {
			t.Error(err)
		}
	})
}

func sum(s string) []byte {
	h := sha256.Sum256([]byte(s))
	return h[:]
}

func params(key, provider string) ledger.ReserveParams {
	return ledger.ReserveParams{
		OwnerHash:          sum("owner"),
		KeyHash:            sum(key),
		Fingerprint:        sum("fingerprint"),
		FingerprintVersion: 1,
		Retention:          time.Hour,
		Attempt:            ledger.NextAttempt{Provider: provider, Lease: time.Minute},
	}
}

func reserve(t *testing.T, l ledger.Ledger, key, provider string) ledger.Reservation {
	t.Helper()
	r, err := l.Reserve(context.Background(), params(key, provider).WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != ledger.Created {
		t.Fatalf("reserve %s: %v, want created", key, r.Outcome)
	}
	return r
}

// reserveUnknown reserves a job whose attempt then ends unknown, for why.
func reserveUnknown(t *testing.T, l ledger.Ledger, key, why string) ledger.Reservation {
	t.Helper()
	r := reserve(t, l, key, "primary")
	if err := l.MarkUnknown(context.Background(), r.Attempt.Ref(), why); err != nil {
		t.Fatal(err)
	}
	return r
}

func complete(t *testing.T, l ledger.Ledger, a *ledger.Attempt, body string) {
	t.Helper()
	c, err := l.Complete(context.Background(), a.Ref(), ledger.Response{
		Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(body), Size: int64(len(body)), Stored: true,
	})
	if err != nil || !c.Won {
		t.Fatalf("complete: won %v, %v", c.Won, err)
	}
}

// adminMux routes requests to the admin module's routes as Caddy's admin
// endpoint does, and fails the test if a handler returns an error: every
// answer, errors included, is written by the module itself.
func adminMux(t *testing.T) http.Handler {
	t.Helper()
	a := new(adminAPI)
	mux := http.NewServeMux()
	for _, route := range a.Routes() {
		mux.Handle(route.Pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := route.Handler.ServeHTTP(w, r); err != nil {
				t.Errorf("%s %s: handler returned %v", r.Method, r.URL, err)
			}
		}))
	}
	return mux
}

func do(t *testing.T, h http.Handler, method, target, body string) *httptest.ResponseRecorder {
	t.Helper()
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, target, nil)
	} else {
		r = httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func decode[T any](t *testing.T, w *httptest.ResponseRecorder, status int) T {
	t.Helper()
	var v T
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q, want application/json", ct)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("body %s: %v", w.Body, err)
	}
	return v
}

type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	JobID  string `json:"job_id"`
}

func wantProblem(t *testing.T, w *httptest.ResponseRecorder, status int, name string) problemBody {
	t.Helper()
	if w.Code != status {
		t.Fatalf("status %d, want %d; body %s", w.Code, status, w.Body)
	}
	if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json", ct)
	}
	var p problemBody
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem %s: %v", w.Body, err)
	}
	if p.Type != "urn:onejob:problem:"+name || p.Status != status || p.Title == "" || p.Detail == "" {
		t.Fatalf("problem %+v, want type %s, status %d, a title and a detail", p, name, status)
	}
	return p
}

type listBody struct {
	Jobs []map[string]any `json:"jobs"`
	Next *string          `json:"next"`
}

func ids(jobs []map[string]any) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i], _ = j["id"].(string)
	}
	return out
}

func keysOf(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

func rfc3339(t *testing.T, v any) time.Time {
	t.Helper()
	s, ok := v.(string)
	if !ok {
		t.Fatalf("time %v is not a string", v)
	}
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	if !strings.HasSuffix(s, "Z") {
		t.Errorf("time %q is not UTC", s)
	}
	return tm
}

func TestAdminModule(t *testing.T) {
	mi, err := caddy.GetModule("admin.api.idempotency")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := mi.New().(caddy.AdminRouter); !ok {
		t.Fatal("admin.api.idempotency is not an AdminRouter")
	}
}

// TestAdminJobShape pins the job's JSON: every field present, hashes in
// hex, times in RFC 3339, absent values null.
func TestAdminJobShape(t *testing.T) {
	mem := testLedger(t)
	h := adminMux(t)
	jobKeys := []string{"attempts", "completed_at", "completed_by", "created_at", "fingerprint", "id",
		"key_hash", "owner_hash", "response", "state", "version"}
	attemptKeys := []string{"error", "finished_at", "id", "number", "provider", "reconcile", "reconciled", "resend", "scope", "started_at", "state"}

	// A pending job: nothing completed yet.
	r := reserve(t, mem, "shape-pending", "shape")
	j := decode[map[string]any](t, do(t, h, "GET", "/idempotency/jobs/"+r.Job.ID, ""), 200)
	if got := keysOf(j); !slices.Equal(got, jobKeys) {
		t.Fatalf("job fields %v, want %v", got, jobKeys)
	}
	if j["id"] != r.Job.ID || j["state"] != "pending" || j["version"] != float64(r.Job.Version) {
		t.Errorf("job %v", j)
	}
	for _, k := range []string{"completed_at", "completed_by", "response"} {
		if j[k] != nil {
			t.Errorf("%s = %v, want null", k, j[k])
		}
	}
	if j["owner_hash"] != hex.EncodeToString(sum("owner")) || j["key_hash"] != hex.EncodeToString(sum("shape-pending")) ||
		j["fingerprint"] != hex.EncodeToString(sum("fingerprint")) {
		t.Errorf("hashes %v %v %v", j["owner_hash"], j["key_hash"], j["fingerprint"])
	}
	if got := rfc3339(t, j["created_at"]); !got.Equal(r.Job.CreatedAt) {
		t.Errorf("created_at %v, want %v", got, r.Job.CreatedAt)
	}
	atts, _ := j["attempts"].([]any)
	if len(atts) != 1 {
		t.Fatalf("attempts %v", j["attempts"])
	}
	a := atts[0].(map[string]any)
	if got := keysOf(a); !slices.Equal(got, attemptKeys) {
		t.Fatalf("attempt fields %v, want %v", got, attemptKeys)
	}
	if a["number"] != float64(1) || a["id"] != r.Attempt.ID || a["provider"] != "shape" || a["state"] != "starting" ||
		a["finished_at"] != nil || a["error"] != nil {
		t.Errorf("attempt %v", a)
	}
	rfc3339(t, a["started_at"])

	// A completed job: the response without its body, the winner named.
	complete(t, mem, r.Attempt, `{"ok":true}`)
	j = decode[map[string]any](t, do(t, h, "GET", "/idempotency/jobs/"+strings.ToUpper(r.Job.ID), ""), 200)
	if j["state"] != "completed" || j["completed_by"] != r.Attempt.ID || j["version"] != float64(r.Job.Version+1) {
		t.Errorf("completed job %v", j)
	}
	rfc3339(t, j["completed_at"])
	resp, _ := j["response"].(map[string]any)
	if got := keysOf(resp); !slices.Equal(got, []string{"size", "status", "stored"}) ||
		resp["status"] != float64(201) || resp["size"] != float64(11) || resp["stored"] != true {
		t.Errorf("response %v", j["response"])
	}
	a = j["attempts"].([]any)[0].(map[string]any)
	if a["state"] != "succeeded" || a["error"] != nil {
		t.Errorf("attempt %v", a)
	}
	rfc3339(t, a["finished_at"])

	// An unknown attempt carries its reason.
	r2 := reserve(t, mem, "shape-unknown", "shape")
	if err := mem.MarkUnknown(context.Background(), r2.Attempt.Ref(), "attempt timed out"); err != nil {
		t.Fatal(err)
	}
	j = decode[map[string]any](t, do(t, h, "GET", "/idempotency/jobs/"+r2.Job.ID, ""), 200)
	a = j["attempts"].([]any)[0].(map[string]any)
	if j["state"] != "unknown" || a["state"] != "unknown" || a["error"] != "attempt timed out" {
		t.Errorf("unknown job %v", j)
	}

	// The listing shows the same shape.
	l := decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=shape", ""), 200)
	if len(l.Jobs) != 2 || l.Next != nil {
		t.Fatalf("listing %+v", l)
	}
	for _, j := range l.Jobs {
		if got := keysOf(j); !slices.Equal(got, jobKeys) {
			t.Errorf("listed job fields %v", got)
		}
	}
}

// TestAdminList: filters, newest first, and paging with the cursor across
// two ledgers.
func TestAdminList(t *testing.T) {
	l1, l2 := testLedger(t), testLedger(t)
	h := adminMux(t)
	ctx := context.Background()

	// Jobs alternate between the ledgers; ids grow with time.
	var all []string // oldest first
	states := map[string]string{}
	for i := range 7 {
		l := []*memory.Ledger{l1, l2}[i%2]
		r := reserve(t, l, fmt.Sprintf("list-%d", i), "lister")
		all = append(all, r.Job.ID)
		switch i % 4 {
		case 0:
			complete(t, l, r.Attempt, "done")
			states[r.Job.ID] = "completed"
		case 1:
			if err := l.MarkUnknown(ctx, r.Attempt.Ref(), "timeout"); err != nil {
				t.Fatal(err)
			}
			states[r.Job.ID] = "unknown"
		case 2:
			if _, err := l.Fail(ctx, r.Attempt.Ref(), "503", nil); err != nil {
				t.Fatal(err)
			}
			states[r.Job.ID] = "failed"
		default:
			states[r.Job.ID] = "pending"
		}
	}
	// A job on another provider, which the provider filter leaves out.
	other := reserve(t, l1, "list-other", "elsewhere")
	newest := slices.Clone(all)
	slices.Reverse(newest)

	got := decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=lister", ""), 200)
	if !slices.Equal(ids(got.Jobs), newest) || got.Next != nil {
		t.Fatalf("listing %v next %v, want %v and null", ids(got.Jobs), got.Next, newest)
	}
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=elsewhere", ""), 200)
	if !slices.Equal(ids(got.Jobs), []string{other.Job.ID}) {
		t.Fatalf("provider=elsewhere: %v", ids(got.Jobs))
	}
	// A full page from one ledger alone still says there is more.
	other2 := reserve(t, l1, "list-other-2", "elsewhere")
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=elsewhere&limit=1", ""), 200)
	if !slices.Equal(ids(got.Jobs), []string{other2.Job.ID}) || got.Next == nil || *got.Next != other2.Job.ID {
		t.Fatalf("provider=elsewhere&limit=1: %v next %v", ids(got.Jobs), got.Next)
	}
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=elsewhere&limit=1&before="+*got.Next, ""), 200)
	if !slices.Equal(ids(got.Jobs), []string{other.Job.ID}) || got.Next != nil {
		t.Fatalf("second page of provider=elsewhere: %v next %v", ids(got.Jobs), got.Next)
	}
	// Without a filter, every job of both ledgers is there, newest first.
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?limit=1000", ""), 200)
	listed := ids(got.Jobs)
	if !slices.IsSortedFunc(listed, func(a, b string) int { return strings.Compare(b, a) }) {
		t.Errorf("listing is not newest first: %v", listed)
	}
	for _, id := range append(slices.Clone(all), other.Job.ID, other2.Job.ID) {
		if !slices.Contains(listed, id) {
			t.Errorf("job %s missing from the unfiltered listing", id)
		}
	}

	for _, state := range []string{"pending", "unknown", "completed", "failed"} {
		var want []string
		for _, id := range newest {
			if states[id] == state {
				want = append(want, id)
			}
		}
		got := decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=lister&state="+state, ""), 200)
		if !slices.Equal(ids(got.Jobs), want) {
			t.Errorf("state=%s: %v, want %v", state, ids(got.Jobs), want)
		}
		for _, j := range got.Jobs {
			if j["state"] != state {
				t.Errorf("state=%s listed a %v job", state, j["state"])
			}
		}
	}

	// Pages of 3 across both ledgers: 3, 3, 1, then the end.
	var paged []string
	target := "/idempotency/jobs?provider=lister&limit=3"
	for page := 0; ; page++ {
		if page > 5 {
			t.Fatal("paging never ends")
		}
		got := decode[listBody](t, do(t, h, "GET", target, ""), 200)
		paged = append(paged, ids(got.Jobs)...)
		if got.Next == nil {
			if len(got.Jobs) != 1 {
				t.Errorf("last page has %d jobs, want 1", len(got.Jobs))
			}
			break
		}
		if len(got.Jobs) != 3 || *got.Next != ids(got.Jobs)[2] {
			t.Fatalf("page %d: %v next %v", page, ids(got.Jobs), *got.Next)
		}
		target = "/idempotency/jobs?provider=lister&limit=3&before=" + *got.Next
	}
	if !slices.Equal(paged, newest) {
		t.Fatalf("paged %v, want %v", paged, newest)
	}
	// A page that holds exactly the rest has no next; a cursor past the
	// oldest job gives an empty page.
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=lister&limit=7", ""), 200)
	if len(got.Jobs) != 7 || got.Next != nil {
		t.Errorf("limit=7 of 7: %d jobs, next %v", len(got.Jobs), got.Next)
	}
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs?provider=lister&before="+all[0], ""), 200)
	if len(got.Jobs) != 0 || got.Next != nil || got.Jobs == nil {
		t.Errorf("before the oldest: %+v, want [] and null", got)
	}
	// The trailing-slash form lists too.
	got = decode[listBody](t, do(t, h, "GET", "/idempotency/jobs/?provider=lister&limit=2", ""), 200)
	if !slices.Equal(ids(got.Jobs), newest[:2]) {
		t.Errorf("/idempotency/jobs/: %v", ids(got.Jobs))
	}
}

func TestAdminErrors(t *testing.T) {
	mem := testLedger(t)
	h := adminMux(t)
	r := reserve(t, mem, "errors", "errs")
	job := "/idempotency/jobs/" + r.Job.ID

	for _, q := range []string{"state=done", "state=PENDING", "limit=0", "limit=1001", "limit=ten", "limit=-1",
		"limit=1.5", "before=nope", "before=" + r.Job.ID + "x"} {
		wantProblem(t, do(t, h, "GET", "/idempotency/jobs?"+q, ""), 400, "invalid-request")
	}
	for _, target := range []string{
		"/idempotency/jobs/" + ledger.NewID(),
		"/idempotency/jobs/not-a-uuid",
		"/idempotency/jobs/" + ledger.NewID() + "/resolve",
		job + "/bogus",
	} {
		method := "GET"
		body := ""
		if strings.HasSuffix(target, "/resolve") {
			method, body = "POST", `{"outcome":"cancel"}`
		}
		wantProblem(t, do(t, h, method, target, body), 404, "not-found")
	}
	for _, c := range []struct{ method, target, allow string }{
		{"POST", "/idempotency/jobs", "GET"},
		{"DELETE", job, "GET"},
		{"PUT", job, "GET"},
		{"GET", job + "/resolve", "POST"},
		{"POST", "/idempotency/providers", "GET"},
	} {
		w := do(t, h, c.method, c.target, "")
		wantProblem(t, w, 405, "method-not-allowed")
		if got := w.Header().Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow %q, want %q", c.method, c.target, got, c.allow)
		}
	}
	b64 := base64.StdEncoding.EncodeToString([]byte("x"))
	for _, body := range []string{
		``,
		`{`,
		`[]`,
		`{"outcome":"cancel"} {}`,
		`{"outcome":"cancel","extra":1}`,
		`{"outcome":"retry"}`,
		`{}`,
		`{"outcome":"cancel","response":{"status":200}}`,
		`{"outcome":"complete"}`,
		`{"outcome":"complete","response":{"status":99}}`,
		`{"outcome":"complete","response":{"status":600}}`,
		`{"outcome":"complete","response":{"status":"200"}}`,
		`{"outcome":"complete","response":{"status":200,"body":"not base64!"}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Bad Name":["x"]},"body":"` + b64 + `"}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"X-A":["a\r\nb"]}}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Transfer-Encoding":["chunked"]}}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Content-Length":["5"]},"body":"` + b64 + `"}}`,
	} {
		w := do(t, h, "POST", job+"/resolve", body)
		if w.Code != 400 {
			t.Errorf("body %s: status %d, want 400 (%s)", body, w.Code, w.Body)
			continue
		}
		wantProblem(t, w, 400, "invalid-request")
	}
	// None of those touched the job.
	j, err := mem.Job(context.Background(), r.Job.ID)
	if err != nil || j.State != ledger.JobPending || j.Version != r.Job.Version {
		t.Fatalf("job after refused resolves: %+v %v", j, err)
	}
	// An oversized body is refused before it is read whole.
	defer func(n int64) { maxResolveBody = n }(maxResolveBody)
	maxResolveBody = 1 << 10
	huge := `{"outcome":"complete","response":{"status":200,"body":"` + strings.Repeat("A", 1<<10) + `"}}`
	wantProblem(t, do(t, h, "POST", job+"/resolve", huge), 413, "request-too-large")
}

func TestAdminResolveCancel(t *testing.T) {
	mem := testLedger(t)
	h := adminMux(t)
	ctx := context.Background()

	r := reserveUnknown(t, mem, "cancel", "attempt timed out")
	j := decode[map[string]any](t, do(t, h, "POST", "/idempotency/jobs/"+r.Job.ID+"/resolve", `{"outcome":"cancel"}`), 200)
	if j["id"] != r.Job.ID || j["state"] != "failed" || j["completed_by"] != nil || j["response"] != nil ||
		j["version"] != float64(r.Job.Version+1) {
		t.Fatalf("cancelled job %v", j)
	}
	rfc3339(t, j["completed_at"])
	a := j["attempts"].([]any)[0].(map[string]any)
	if a["state"] != "cancelled" || a["finished_at"] == nil {
		t.Fatalf("cancelled attempt %v", a)
	}

	// The cancelled attempt's late result loses; the attempt stays
	// cancelled, so it never blocks the job again.
	c, err := mem.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("late"), Size: 4, Stored: true})
	if err != nil {
		t.Fatal(err)
	}
	if c.Won || c.Job.State != ledger.JobFailed || c.Job.Response != nil {
		t.Fatalf("late result after cancel: won %v, job %+v", c.Won, c.Job)
	}
	if got := c.Job.Attempts[0].State; got != ledger.AttemptCancelled {
		t.Errorf("late attempt is %s, want cancelled", got)
	}

	// A retry may start a new attempt under the same job.
	rr, err := mem.Reserve(ctx, params("cancel", "primary").WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if rr.Outcome != ledger.Reopened || rr.Job.ID != r.Job.ID || rr.Attempt.Number != 2 {
		t.Fatalf("retry after cancel: %v job %s attempt %+v", rr.Outcome, rr.Job.ID, rr.Attempt)
	}
}

func TestAdminResolveComplete(t *testing.T) {
	mem := testLedger(t)
	h := adminMux(t)
	ctx := context.Background()

	r := reserveUnknown(t, mem, "complete", "connection broken")
	body := []byte(`{"charge":"ch_1","status":"succeeded"}`)
	req, err := json.Marshal(map[string]any{
		"outcome": "complete",
		"response": map[string]any{
			"status":  200,
			"headers": map[string][]string{"content-type": {"application/json"}, "X-Charge": {"ch_1"}},
			"body":    base64.StdEncoding.EncodeToString(body),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	j := decode[map[string]any](t, do(t, h, "POST", "/idempotency/jobs/"+r.Job.ID+"/resolve", string(req)), 200)
	atts := j["attempts"].([]any)
	if j["state"] != "completed" || len(atts) != 2 {
		t.Fatalf("completed job %v", j)
	}
	first, admin := atts[0].(map[string]any), atts[1].(map[string]any)
	if first["state"] != "cancelled" {
		t.Errorf("the unknown attempt is %v, want cancelled", first["state"])
	}
	if admin["provider"] != "admin" || admin["state"] != "succeeded" || admin["number"] != float64(2) ||
		j["completed_by"] != admin["id"] {
		t.Errorf("admin attempt %v, completed_by %v", admin, j["completed_by"])
	}
	resp := j["response"].(map[string]any)
	if resp["status"] != float64(200) || resp["size"] != float64(len(body)) || resp["stored"] != true {
		t.Errorf("response %v", resp)
	}

	// A retry replays the operator's answer.
	rr, err := mem.Reserve(ctx, params("complete", "primary").WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if rr.Outcome != ledger.Done || rr.Job.Response == nil || !bytes.Equal(rr.Job.Response.Body, body) ||
		rr.Job.Response.Status != 200 {
		t.Fatalf("retry after complete: %v %+v", rr.Outcome, rr.Job.Response)
	}
	if got := rr.Job.Response.Header["Content-Type"]; !slices.Equal(got, []string{"application/json"}) {
		t.Errorf("stored headers %v: names must be canonical", rr.Job.Response.Header)
	}

	// Completed: it cannot be resolved again.
	for _, body := range []string{`{"outcome":"cancel"}`, string(req)} {
		p := wantProblem(t, do(t, h, "POST", "/idempotency/jobs/"+r.Job.ID+"/resolve", body), 409, "already-completed")
		if p.JobID != r.Job.ID {
			t.Errorf("409 names job %q, want %s", p.JobID, r.Job.ID)
		}
	}

	// An empty body completes too.
	r2 := reserve(t, mem, "complete-empty", "primary")
	j = decode[map[string]any](t, do(t, h, "POST", "/idempotency/jobs/"+r2.Job.ID+"/resolve",
		`{"outcome":"complete","response":{"status":204}}`), 200)
	if j["state"] != "completed" || j["response"].(map[string]any)["size"] != float64(0) {
		t.Errorf("empty answer: %v", j)
	}
}

// failing is a ledger that cannot answer.
type failing struct{ ledger.Ledger }

var errDown = errors.New("connection refused")

func (failing) Job(context.Context, string) (*ledger.Job, error) { return nil, errDown }
func (failing) Jobs(context.Context, ledger.JobQuery) (ledger.JobPage, error) {
	return ledger.JobPage{}, errDown
}
func (failing) Resolve(context.Context, string, ledger.Resolution) (*ledger.Job, error) {
	return nil, errDown
}

// TestAdminLedgerDown: a ledger that cannot answer makes listings and
// misses a 503, but a job another ledger holds is still found.
func TestAdminLedgerDown(t *testing.T) {
	mem := testLedger(t)
	putLedger(t, failing{memory.New()})
	h := adminMux(t)
	r := reserve(t, mem, "down", "primary")

	wantProblem(t, do(t, h, "GET", "/idempotency/jobs", ""), 503, "ledger-unavailable")
	wantProblem(t, do(t, h, "GET", "/idempotency/jobs/"+ledger.NewID(), ""), 503, "ledger-unavailable")
	wantProblem(t, do(t, h, "POST", "/idempotency/jobs/"+ledger.NewID()+"/resolve", `{"outcome":"cancel"}`), 503, "ledger-unavailable")

	j := decode[map[string]any](t, do(t, h, "GET", "/idempotency/jobs/"+r.Job.ID, ""), 200)
	if j["id"] != r.Job.ID {
		t.Errorf("job %v", j)
	}
	j = decode[map[string]any](t, do(t, h, "POST", "/idempotency/jobs/"+r.Job.ID+"/resolve", `{"outcome":"cancel"}`), 200)
	if j["state"] != "failed" {
		t.Errorf("job %v", j)
	}
}

// TestAdminHoldsLedgers: a request holds the ledgers it uses, so a config
// unloaded meanwhile does not close one under it; the last release does.
func TestAdminHoldsLedgers(t *testing.T) {
	mem := memory.New()
	key := "test\x00" + t.Name()
	if _, _, err := ledgers.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newShared(key, mem, zap.NewNop()), nil
	}); err != nil {
		t.Fatal(err)
	}
	a := new(adminAPI)
	ls, release := a.openLedgers()
	if !slices.ContainsFunc(ls, func(l ledger.Ledger) bool { s, ok := l.(*shared); return ok && s.Ledger == mem }) {
		t.Fatal("openLedgers did not return the test ledger")
	}
	if deleted, err := ledgers.Delete(key); deleted || err != nil { // the config goes away
		t.Fatalf("ledger closed while a request held it: %v %v", deleted, err)
	}
	release()
	if _, ok := ledgers.References(key); ok {
		t.Fatal("the request's release left the ledger open")
	}
}

func TestAdminProviders(t *testing.T) {
	h := adminMux(t)
	got := decode[map[string]any](t, do(t, h, "GET", "/idempotency/providers", ""), 200)
	if ps, ok := got["providers"].([]any); !ok || len(ps) != 0 {
		t.Fatalf("providers %v, want []", got)
	}

	un := registerProviders("s", []string{"primary", "fallback"})
	defer un()
	at := time.Date(2026, 3, 4, 5, 6, 7, 800, time.FixedZone("x", 3600))
	setProbe("s", "fallback", ProbeResult{OK: false, Error: "status 503", At: at, Status: 503})

	type providersBody struct {
		Providers []struct {
			Scope string          `json:"scope"`
			Name  string          `json:"name"`
			Probe json.RawMessage `json:"probe"`
		} `json:"providers"`
	}
	body := decode[providersBody](t, do(t, h, "GET", "/idempotency/providers", ""), 200)
	if len(body.Providers) != 2 || body.Providers[0].Name != "primary" || body.Providers[1].Name != "fallback" ||
		body.Providers[0].Scope != "s" || body.Providers[1].Scope != "s" {
		t.Fatalf("providers %+v", body.Providers)
	}
	fields := decode[map[string][]map[string]any](t, do(t, h, "GET", "/idempotency/providers", ""), 200)
	if got := keysOf(fields["providers"][0]); !slices.Equal(got, []string{"name", "probe", "scope"}) {
		t.Errorf("provider fields %v", got)
	}
	if string(body.Providers[0].Probe) != "null" {
		t.Errorf("primary probe %s, want null", body.Providers[0].Probe)
	}
	var probe map[string]any
	if err := json.Unmarshal(body.Providers[1].Probe, &probe); err != nil {
		t.Fatal(err)
	}
	if got := keysOf(probe); !slices.Equal(got, []string{"at", "error", "ok", "status"}) {
		t.Fatalf("probe fields %v", got)
	}
	if probe["ok"] != false || probe["error"] != "status 503" || probe["status"] != float64(503) ||
		!rfc3339(t, probe["at"]).Equal(at) {
		t.Errorf("probe %v", probe)
	}
}

// TestJobJSONReconciled: the admin API marks re-sends, says "reconciled":
// "resend" on the one that settled its job, and shows an attempt's lookups
// and "reconciled": "lookup" on the one a lookup settled.
func TestJobJSONReconciled(t *testing.T) {
	at := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	j := &ledger.Job{ID: "j", State: ledger.JobCompleted, CompletedBy: "a3", Attempts: []ledger.Attempt{
		{Number: 1, ID: "a1", Provider: "pay", State: ledger.AttemptUnknown,
			Lookup: &ledger.Lookup{Tries: 2, LastStatus: 503, LastAt: at, NextAt: at.Add(time.Minute), Holder: "h"}},
		{Number: 2, ID: "a2", Provider: "pay", State: ledger.AttemptFailed, Resend: true},
		{Number: 3, ID: "a3", Provider: "pay", State: ledger.AttemptSucceeded, Resend: true},
	}}
	b, err := json.Marshal(newJobJSON(j))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Attempts []struct {
			Resend     bool            `json:"resend"`
			Reconciled *string         `json:"reconciled"`
			Reconcile  *map[string]any `json:"reconcile"`
		} `json:"attempts"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	a := doc.Attempts
	if len(a) != 3 || a[0].Resend || a[0].Reconciled != nil || !a[1].Resend || a[1].Reconciled != nil ||
		!a[2].Resend || a[2].Reconciled == nil || *a[2].Reconciled != "resend" || a[1].Reconcile != nil {
		t.Errorf("attempts: %s", b)
	}
	if r := a[0].Reconcile; r == nil || (*r)["tries"] != float64(2) || (*r)["last_status"] != float64(503) ||
		(*r)["last_at"] != "2026-12-03T12:00:00Z" || (*r)["next_at"] != "2026-12-03T12:01:00Z" {
		t.Errorf("the looked-up attempt's reconcile: %s", b)
	}

	j.Attempts[0].State = ledger.AttemptFailed
	j.Attempts[0].Lookup = &ledger.Lookup{Tries: 2, LastStatus: 404, LastAt: at, Settled: true, Holder: "h"}
	b, _ = json.Marshal(newJobJSON(j))
	doc.Attempts = nil
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if a := doc.Attempts[0]; a.Reconciled == nil || *a.Reconciled != "lookup" || (*a.Reconcile)["next_at"] != nil {
		t.Errorf("an attempt a lookup settled: %s", b)
	}
}
