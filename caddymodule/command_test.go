package caddymodule

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// fakeAdmin stands in for Caddy's admin endpoint: it records each request
// and answers with the canned answer for its method and path.
type fakeAdmin struct {
	*httptest.Server
	mu       sync.Mutex
	requests []recorded
	answers  map[string]cannedAnswer // "GET /idempotency/jobs"
}

type recorded struct {
	method, path, query, origin, body string
}

type cannedAnswer struct {
	status int
	ctype  string
	body   string
}

func newFakeAdmin(t *testing.T, answers map[string]cannedAnswer) *fakeAdmin {
	f := &fakeAdmin{answers: answers}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.requests = append(f.requests, recorded{r.Method, r.URL.Path, r.URL.RawQuery, r.Header.Get("Origin"), string(body)})
		f.mu.Unlock()
		a, ok := f.answers[r.Method+" "+r.URL.Path]
		if !ok {
			http.Error(w, "unexpected request", http.StatusTeapot)
			return
		}
		w.Header().Set("Content-Type", a.ctype)
		w.WriteHeader(a.status)
		io.WriteString(w, a.body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeAdmin) addr() string { return strings.TrimPrefix(f.URL, "http://") }

func (f *fakeAdmin) only(t *testing.T) recorded {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) != 1 {
		t.Fatalf("the admin endpoint got %d requests, want 1: %+v", len(f.requests), f.requests)
	}
	return f.requests[0]
}

// runCLI runs "caddy idempotency <args>" as the caddy binary would, and
// returns what it wrote and its error.
func runCLI(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := &cobra.Command{Use: "caddy", SilenceUsage: true}
	cmd := &cobra.Command{Use: "idempotency"}
	idempotencyCommand(cmd)
	root.AddCommand(cmd)
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(append([]string{"idempotency"}, args...))
	err = root.Execute()
	return out.String(), errOut.String(), err
}

const (
	hedgedJobJSON = `{"id":"01a23741-576c-797d-af0b-27881c34062a","state":"completed","version":2,
"owner_hash":"3e0e9b17","key_hash":"7c4954d9","fingerprint":"bb9c2287",
"created_at":"2026-12-02T14:55:58.831245Z","completed_at":"2026-12-02T14:55:59.075913Z",
"completed_by":"01a23741-5808-7a3d-8d85-c207c5c74762",
"response":{"status":200,"size":29,"stored":true},
"attempts":[
{"number":1,"id":"01a23741-576c-7981-b46f-bdcf9a2194b2","provider":"primary","state":"lost",
 "started_at":"2026-12-02T14:55:58.831500Z","finished_at":"2026-12-02T14:55:59.333700Z","error":"result arrived after the job was settled"},
{"number":2,"id":"01a23741-5808-7a3d-8d85-c207c5c74762","provider":"fallback","state":"succeeded",
 "started_at":"2026-12-02T14:55:58.988600Z","finished_at":"2026-12-02T14:55:59.075800Z","error":null}]}`

	unknownJobJSON = `{"id":"01a23742-5c4a-7866-af89-dc2532f13bd1","state":"unknown","version":1,
"owner_hash":"3e0e9b17","key_hash":"86724a6e","fingerprint":"17f831b3",
"created_at":"2026-12-02T14:57:05.614Z","completed_at":null,"completed_by":null,"response":null,
"attempts":[{"number":1,"id":"01a23742-5c4a-7873-98ef-595cad3c716b","provider":"next","state":"unknown",
 "started_at":"2026-12-02T14:57:05.614Z","finished_at":"2026-12-02T14:57:06.029Z","error":"attempt_timeout: no answer headers in 400ms"}]}`

	cancelledJobJSON = `{"id":"01a23742-5c4a-7866-af89-dc2532f13bd1","state":"failed","version":2,
"owner_hash":"3e0e9b17","key_hash":"86724a6e","fingerprint":"17f831b3",
"created_at":"2026-12-02T14:57:05.614Z","completed_at":"2026-12-02T14:58:00Z","completed_by":null,"response":null,
"attempts":[{"number":1,"id":"01a23742-5c4a-7873-98ef-595cad3c716b","provider":"next","state":"cancelled",
 "started_at":"2026-12-02T14:57:05.614Z","finished_at":"2026-12-02T14:58:00Z","error":"attempt_timeout: no answer headers in 400ms"}]}`

	notFoundProblem = `{"type":"urn:onejob:problem:not-found","title":"Job not found","status":404,
"detail":"No open ledger holds job \"01a23742-0000-7000-8000-000000000000\" (or its retention has passed)."}`
)

func TestCLIJobs(t *testing.T) {
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"GET /idempotency/jobs": {200, "application/json",
			`{"jobs":[` + unknownJobJSON + `,` + hedgedJobJSON + `],"next":"01a23741-576c-797d-af0b-27881c34062a"}`},
	})
	out, errOut, err := runCLI(t, "", "jobs", "--address", f.addr(), "--state", "completed", "--provider", "fallback", "--limit", "2")
	if err != nil {
		t.Fatalf("jobs: %v\n%s", err, errOut)
	}
	want := `ID                                    STATE      PROVIDER  ATTEMPTS  CREATED (UTC)        COMPLETED BY
01a23742-5c4a-7866-af89-dc2532f13bd1  unknown    next      1         2026-12-02 14:57:05  -
01a23741-576c-797d-af0b-27881c34062a  completed  fallback  2         2026-12-02 14:55:58  #2 fallback
`
	if out != want {
		t.Errorf("jobs printed\n%s\nwant\n%s", out, want)
	}
	if errOut != "older jobs: caddy idempotency jobs --before 01a23741-576c-797d-af0b-27881c34062a\n" {
		t.Errorf("the hint for the next page: %q", errOut)
	}
	req := f.only(t)
	if req.method != http.MethodGet || req.query != "limit=2&provider=fallback&state=completed" {
		t.Errorf("request: %+v", req)
	}
	// Caddy's admin endpoint accepts its own address as the Origin.
	if req.origin != "http://"+f.addr() {
		t.Errorf("Origin %q, want http://%s", req.origin, f.addr())
	}
}

func TestCLIJobsEmptyAndCursor(t *testing.T) {
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"GET /idempotency/jobs": {200, "application/json", `{"jobs":[],"next":null}`},
	})
	out, errOut, err := runCLI(t, "", "jobs", "--address", f.addr(), "--before", "01a23741-576c-797d-af0b-27881c34062a")
	if err != nil || out != "No jobs.\n" || errOut != "" {
		t.Errorf("jobs: %v, stdout %q, stderr %q", err, out, errOut)
	}
	if req := f.only(t); req.query != "before=01a23741-576c-797d-af0b-27881c34062a" {
		t.Errorf("query %q", req.query)
	}
}

func TestCLIShow(t *testing.T) {
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"GET /idempotency/jobs/01a23741-576c-797d-af0b-27881c34062a": {200, "application/json", hedgedJobJSON},
	})
	out, errOut, err := runCLI(t, "", "show", "01a23741-576c-797d-af0b-27881c34062a", "--address", f.addr())
	if err != nil {
		t.Fatalf("show: %v\n%s", err, errOut)
	}
	want := `Job           01a23741-576c-797d-af0b-27881c34062a
State         completed (version 2)
Created       2026-12-02 14:55:58.831 UTC
Completed     2026-12-02 14:55:59.075 UTC
Completed by  #2 fallback
Response      status 200, 29 bytes, stored
Fingerprint   bb9c2287
Key hash      7c4954d9
Owner hash    3e0e9b17

#  ATTEMPT                               PROVIDER  STATE            STARTED  ENDED   RECONCILED  ERROR
1  01a23741-576c-7981-b46f-bdcf9a2194b2  primary   lost             +0s      +502ms  -           result arrived after the job was settled
2  01a23741-5808-7a3d-8d85-c207c5c74762  fallback  succeeded (won)  +157ms   +244ms  -           -
(STARTED and ENDED count from the first attempt's start, 2026-12-02 14:55:58.831 UTC)
`
	if out != want {
		t.Errorf("show printed\n%s\nwant\n%s", out, want)
	}
}

// TestCLIShowReconciled: the attempts' lookups, and what settled them.
func TestCLIShowReconciled(t *testing.T) {
	const doc = `{"id":"j1","state":"completed","version":2,"created_at":"2026-12-03T12:00:00Z",
		"completed_at":"2026-12-03T12:00:41Z","completed_by":"a2","response":{"status":201,"size":2,"stored":true},
		"attempts":[
		{"number":1,"id":"a1","provider":"pay","state":"unknown","started_at":"2026-12-03T12:00:00Z","finished_at":"2026-12-03T12:00:30Z",
		 "error":"attempt_timeout","resend":false,"reconciled":null,
		 "reconcile":{"tries":2,"last_status":503,"last_at":"2026-12-03T12:00:40Z","next_at":"2026-12-03T12:01:20Z"}},
		{"number":2,"id":"a2","provider":"pay","state":"succeeded","started_at":"2026-12-03T12:00:40Z","finished_at":"2026-12-03T12:00:41Z",
		 "error":null,"resend":true,"reconciled":"resend","reconcile":null},
		{"number":3,"id":"a3","provider":"pay","state":"failed","started_at":"2026-12-03T12:00:40Z","finished_at":"2026-12-03T12:00:50Z",
		 "error":"no trace","resend":false,"reconciled":"lookup",
		 "reconcile":{"tries":1,"last_status":404,"last_at":"2026-12-03T12:00:50Z","next_at":null}}]}`
	f := newFakeAdmin(t, map[string]cannedAnswer{"GET /idempotency/jobs/j1": {200, "application/json", doc}})
	out, errOut, err := runCLI(t, "", "show", "j1", "--address", f.addr())
	if err != nil {
		t.Fatalf("show: %v\n%s", err, errOut)
	}
	for _, want := range []string{
		"1  a1       pay       unknown          +0s      +30s   2 tries, last 503, next +1m20s  attempt_timeout",
		"2  a2       pay       succeeded (won)  +40s     +41s   resend                          -",
		"3  a3       pay       failed           +40s     +50s   lookup (1 try, 404)             no trace",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show printed\n%s\nwant a line\n%s", out, want)
		}
	}
}

func TestCLIResolveCancel(t *testing.T) {
	const id = "01a23742-5c4a-7866-af89-dc2532f13bd1"
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"POST /idempotency/jobs/" + id + "/resolve": {200, "application/json", cancelledJobJSON},
	})
	out, errOut, err := runCLI(t, "", "resolve", id, "--cancel", "--address", f.addr())
	if err != nil {
		t.Fatalf("resolve: %v\n%s", err, errOut)
	}
	if !strings.HasPrefix(out, "Cancelled job "+id+": it is now failed (version 2); a retry starts a new attempt.\n\nJob ") ||
		!strings.Contains(out, "\nFailed        2026-12-02 14:58:00.000 UTC\n") ||
		!strings.Contains(out, "1  01a23742-5c4a-7873-98ef-595cad3c716b  next      cancelled") {
		t.Errorf("resolve printed\n%s", out)
	}
	req := f.only(t)
	if req.body != `{"outcome":"cancel"}` || req.origin != "http://"+f.addr() {
		t.Errorf("request: %+v", req)
	}
}

func TestCLIResolveComplete(t *testing.T) {
	const id = "01a23742-5c4a-7866-af89-dc2532f13bd1"
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"POST /idempotency/jobs/" + id + "/resolve": {200, "application/json", hedgedJobJSON},
	})
	bodyFile := filepath.Join(t.TempDir(), "answer.json")
	if err := os.WriteFile(bodyFile, []byte(`{"settled":"by hand"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, stdin string
		args        []string
	}{
		{"file", "", []string{"--body-file", bodyFile}},
		{"stdin", `{"settled":"by hand"}`, []string{"--body-file", "-"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.mu.Lock()
			f.requests = nil
			f.mu.Unlock()
			args := append([]string{"resolve", id, "--complete", "--status", "201", "--address", f.addr(),
				"--header", "Content-Type: application/json", "--header", "X-Settled: yes", "--header", "x-settled: twice"}, tc.args...)
			out, errOut, err := runCLI(t, tc.stdin, args...)
			if err != nil {
				t.Fatalf("resolve: %v\n%s", err, errOut)
			}
			if !strings.HasPrefix(out, "Completed job 01a23741-576c-797d-af0b-27881c34062a with status 201: it is now completed (version 2); retries get this answer.\n") {
				t.Errorf("resolve printed\n%s", out)
			}
			var sent struct {
				Outcome  string `json:"outcome"`
				Response struct {
					Status  int                 `json:"status"`
					Headers map[string][]string `json:"headers"`
					Body    []byte              `json:"body"` // base64 in JSON
				} `json:"response"`
			}
			if err := json.Unmarshal([]byte(f.only(t).body), &sent); err != nil {
				t.Fatal(err)
			}
			r := sent.Response
			if sent.Outcome != "complete" || r.Status != 201 || string(r.Body) != `{"settled":"by hand"}` ||
				len(r.Headers) != 3 || r.Headers["Content-Type"][0] != "application/json" || r.Headers["X-Settled"][0] != "yes" {
				t.Errorf("sent %+v", sent)
			}
		})
	}
}

func TestCLIResolveFlags(t *testing.T) {
	f := newFakeAdmin(t, nil)
	const id = "01a23742-5c4a-7866-af89-dc2532f13bd1"
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"resolve", id}, "resolve needs either --cancel or --complete\n"},
		{[]string{"resolve", id, "--cancel", "--complete"}, "resolve needs either --cancel or --complete\n"},
		{[]string{"resolve", id, "--cancel", "--status", "200"}, "--status, --body-file and --header go with --complete, not --cancel\n"},
		{[]string{"resolve", id, "--complete"}, "--complete needs --status\n"},
		{[]string{"resolve", id, "--complete", "--status", "200", "--header", "no colon"}, "--header \"no colon\": want 'Name: value'\n"},
		{[]string{"resolve", id, "--complete", "--status", "200", "--body-file", "/nonexistent/answer"}, "reading the body: open /nonexistent/answer: no such file or directory\n"},
	} {
		_, errOut, err := runCLI(t, "", append(tc.args, "--address", f.addr())...)
		if err == nil || errOut != tc.want {
			t.Errorf("%v: error %v, stderr %q, want %q", tc.args, err, errOut, tc.want)
		}
	}
	if _, _, err := runCLI(t, "", "show", "--address", f.addr()); err == nil {
		t.Error("show with no job id succeeded")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.requests) != 0 {
		t.Errorf("invalid commands reached the admin endpoint: %+v", f.requests)
	}
}

// Errors of the admin API are printed as "title: detail" and fail the
// command.
func TestCLIErrors(t *testing.T) {
	const id = "01a23742-0000-7000-8000-000000000000"
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"GET /idempotency/jobs/" + id:               {404, "application/problem+json", notFoundProblem},
		"POST /idempotency/jobs/" + id + "/resolve": {409, "application/problem+json", `{"type":"urn:onejob:problem:already-completed","title":"Job already completed","status":409,"detail":"The job already completed; its result cannot be changed."}`},
		"GET /idempotency/jobs":                     {403, "application/json", `{"error":"client is not allowed to access from origin 'http://example.com'"}`},
		"GET /idempotency/providers":                {500, "text/plain", "boom\n"},
	})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"show", id}, `Job not found: No open ledger holds job "01a23742-0000-7000-8000-000000000000" (or its retention has passed).` + "\n"},
		{[]string{"resolve", id, "--cancel"}, "Job already completed: The job already completed; its result cannot be changed.\n"},
		{[]string{"jobs"}, "HTTP 403: client is not allowed to access from origin 'http://example.com'\n"},
	} {
		out, errOut, err := runCLI(t, "", append(tc.args, "--address", f.addr())...)
		if err == nil || out != "" || errOut != tc.want {
			t.Errorf("%v: error %v, stdout %q, stderr %q, want %q", tc.args, err, out, errOut, tc.want)
		}
	}
	if e := newAdminError(500, []byte("boom\n")); e.Error() != "HTTP 500: boom" {
		t.Errorf("a plain-text error reads %q", e)
	}

	// Nothing listens: the message says where it looked.
	closed := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(closed.URL, "http://")
	closed.Close()
	_, errOut, err := runCLI(t, "", "jobs", "--address", addr)
	if err == nil || !strings.HasPrefix(errOut, "cannot reach Caddy's admin endpoint at "+addr+" (is Caddy running? see --address and --config)") {
		t.Errorf("no admin endpoint: %v, %q", err, errOut)
	}
}

// Without --address, the admin endpoint is the one of --config.
func TestCLIAddressFromConfig(t *testing.T) {
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"GET /idempotency/jobs": {200, "application/json", `{"jobs":[],"next":null}`},
	})
	config := filepath.Join(t.TempDir(), "Caddyfile")
	caddyfile := "{\n\tadmin " + f.addr() + "\n}\n\nhttp://127.0.0.1:1 {\n\trespond ok\n}\n"
	if err := os.WriteFile(config, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := runCLI(t, "", "jobs", "--config", config, "--adapter", "caddyfile")
	if err != nil || out != "No jobs.\n" {
		t.Fatalf("jobs --config: %v, %q, %q", err, out, errOut)
	}
	f.only(t)
}

func TestCLIRegistered(t *testing.T) {
	c, ok := caddycmd.Commands()["idempotency"]
	if !ok || c.CobraFunc == nil {
		t.Fatal(`"caddy idempotency" is not registered`)
	}
	cmd := &cobra.Command{Use: "idempotency"}
	c.CobraFunc(cmd)
	var names []string
	for _, sub := range cmd.Commands() {
		names = append(names, sub.Name())
	}
	if strings.Join(names, " ") != "jobs purge resolve show" {
		t.Errorf("subcommands: %v", names)
	}
}

// sameJSON reports whether got is exactly one JSON document whose compact
// form is want's: the admin API's fields, in its order.
func sameJSON(t *testing.T, got, want string) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(got))
	var doc json.RawMessage
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, got)
	}
	if dec.More() || !strings.HasSuffix(got, "}\n") {
		t.Errorf("output is not one document ending in a newline:\n%q", got)
	}
	var g, w bytes.Buffer
	if err := json.Compact(&g, doc); err != nil {
		t.Fatal(err)
	}
	if err := json.Compact(&w, []byte(want)); err != nil {
		t.Fatal(err)
	}
	if g.String() != w.String() {
		t.Errorf("output\n%s\nwant\n%s", g.String(), w.String())
	}
}

// TestCLIJSON: with --json, jobs, show and resolve print the admin API's
// answer as one JSON document and nothing else; errors stay one line on
// standard error.
func TestCLIJSON(t *testing.T) {
	const id = "01a23742-5c4a-7866-af89-dc2532f13bd1"
	page := `{"jobs":[` + unknownJobJSON + `,` + hedgedJobJSON + `],"next":"01a23741-576c-797d-af0b-27881c34062a"}`
	f := newFakeAdmin(t, map[string]cannedAnswer{
		"GET /idempotency/jobs": {200, "application/json", page},
		"GET /idempotency/jobs/01a23741-576c-797d-af0b-27881c34062a": {200, "application/json", hedgedJobJSON},
		"POST /idempotency/jobs/" + id + "/resolve":                  {200, "application/json", cancelledJobJSON},
		"GET /idempotency/jobs/01a23742-0000-7000-8000-000000000000": {404, "application/problem+json", notFoundProblem},
	})
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"jobs", []string{"jobs", "--json", "--state", "unknown"}, page},
		{"show", []string{"show", "--json", "01a23741-576c-797d-af0b-27881c34062a"}, hedgedJobJSON},
		{"resolve", []string{"resolve", id, "--cancel", "--json"}, cancelledJobJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := runCLI(t, "", append(tc.args, "--address", f.addr())...)
			if err != nil || errOut != "" {
				t.Fatalf("%v: %v, stderr %q", tc.args, err, errOut)
			}
			sameJSON(t, out, tc.want)
		})
	}
	f.mu.Lock()
	reqs := f.requests
	f.mu.Unlock()
	if len(reqs) != 3 || reqs[0].query != "state=unknown" || reqs[2].body != `{"outcome":"cancel"}` {
		t.Errorf("requests: %+v", reqs)
	}

	out, errOut, err := runCLI(t, "", "show", "--json", "01a23742-0000-7000-8000-000000000000", "--address", f.addr())
	if err == nil || out != "" || !strings.HasPrefix(errOut, "Job not found: No open ledger holds job") {
		t.Errorf("show --json of a missing job: %v, stdout %q, stderr %q", err, out, errOut)
	}
}
