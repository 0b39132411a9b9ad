//go:build integration

package integration

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const auth = "Bearer alice"

// site is a site block with the gateway in front of u. Unless extra sets
// it, attempt_timeout is short so that timeouts are quick to provoke.
func site(u string, extra ...string) string {
	if !strings.Contains(strings.Join(extra, "\n"), "attempt_timeout") {
		extra = append(extra, "attempt_timeout 400ms")
	}
	return fmt.Sprintf("\tidempotency {\n\t\t{ledger}\n\t\tattempt_deadline 20s\n%s\t}\n\treverse_proxy %s\n",
		indent(extra), u)
}

func indent(lines []string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString("\t\t" + l + "\n")
	}
	return b.String()
}

func TestSimultaneousDuplicatesOneJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			time.Sleep(150 * time.Millisecond)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"charge":%d,"at":%q}`, n, time.Now().Format(time.RFC3339Nano))
		})
		g := startGateway(t, b, site(up.addr()))
		const n = 5
		var wg sync.WaitGroup
		resps := make([]response, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resps[i] = g.post(t, "/charges", "dup-1", auth, `{"amount": 10}`)
			}()
		}
		wg.Wait()
		first := resps[0]
		replayed := 0
		for _, r := range resps {
			if r.status != http.StatusCreated || r.body != first.body || r.header.Get("Idempotency-Job-Id") != first.header.Get("Idempotency-Job-Id") {
				t.Errorf("responses differ: %v vs %v", r, first)
			}
			if r.header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}
		if replayed != n-1 {
			t.Errorf("%d responses marked replayed, want %d", replayed, n-1)
		}
		if c := up.count("dup-1"); c != 1 {
			t.Errorf("upstream called %d times, want 1", c)
		}
		// A later retry replays the same bytes.
		again := g.post(t, "/charges", "dup-1", auth, `{"amount":10}`)
		if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry = %v", again)
		}
		if b.schema != "" {
			if st, atts := jobState(t, b, first.header.Get("Idempotency-Job-Id")); st != "completed" || len(atts) != 1 || atts[0] != "succeeded" {
				t.Errorf("ledger: job %s attempts %v", st, atts)
			}
		}
	})
}

func TestKeyReusedWithOtherInput(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"secret":"first answer %d"}`, n)
		})
		g := startGateway(t, b, site(up.addr()))
		first := g.post(t, "/charges", "reuse-1", auth, `{"amount":10}`)
		if first.status != http.StatusOK {
			t.Fatal(first)
		}
		other := g.post(t, "/charges", "reuse-1", auth, `{"amount":11}`)
		if other.status != http.StatusUnprocessableEntity || strings.Contains(other.body, "first answer") ||
			!strings.Contains(other.body, "urn:onejob:problem:key-reused") ||
			other.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("other input: %v", other)
		}
		otherPath := g.post(t, "/refunds", "reuse-1", auth, `{"amount":10}`)
		if otherPath.status != http.StatusUnprocessableEntity {
			t.Errorf("other path: %v", otherPath)
		}
		if up.count("reuse-1") != 1 {
			t.Errorf("upstream called %d times", up.count("reuse-1"))
		}
	})
}

func TestTimeoutIsUnknownThenLateResultCompletes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		release := make(chan struct{})
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			<-release
			fmt.Fprint(w, `{"late":true}`)
		})
		g := startGateway(t, b, site(up.addr()))
		first := g.post(t, "/charges", "slow-1", auth, `{}`)
		jobID := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout || !strings.Contains(first.body, "outcome-unknown") || !strings.Contains(first.body, jobID) || jobID == "" {
			t.Fatalf("timeout: %v", first)
		}
		if b.schema != "" {
			if st, atts := jobState(t, b, jobID); st != "unknown" || len(atts) != 1 || atts[0] != "unknown" {
				t.Errorf("ledger after timeout: job %s attempts %v", st, atts)
			}
		}
		for range 3 {
			r := g.post(t, "/charges", "slow-1", auth, `{}`)
			if r.status != http.StatusConflict || !strings.Contains(r.body, "outcome-unknown") || r.header.Get("Retry-After") == "" {
				t.Errorf("retry while unknown: %v", r)
			}
		}
		if c := up.count("slow-1"); c != 1 {
			t.Errorf("upstream called %d times, want 1", c)
		}
		close(release)
		var last response
		eventually(t, "the late result completes the job", func() bool {
			last = g.post(t, "/charges", "slow-1", auth, `{}`)
			return last.status == http.StatusOK
		})
		if last.body != `{"late":true}` || last.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay of the late result: %v", last)
		}
		if b.schema != "" {
			if st, atts := jobState(t, b, jobID); st != "completed" || atts[0] != "succeeded" {
				t.Errorf("ledger after late result: job %s attempts %v", st, atts)
			}
		}
		if c := up.count("slow-1"); c != 1 {
			t.Errorf("upstream called %d times, want 1", c)
		}
	})
}

func TestUpstream503FailsThenRetryRunsAttempt2(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				w.Header().Set("Retry-After", "1")
				http.Error(w, "busy", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintf(w, `{"attempt":%q}`, r.Header.Get("Idempotency-Attempt"))
		})
		g := startGateway(t, b, site(up.addr()))
		first := g.post(t, "/charges", "busy-1", auth, `{}`)
		if first.status != http.StatusServiceUnavailable || first.body != "busy\n" {
			t.Fatalf("first: %v", first)
		}
		jobID := first.header.Get("Idempotency-Job-Id")
		if b.schema != "" {
			if st, atts := jobState(t, b, jobID); st != "failed" || len(atts) != 1 || atts[0] != "failed" {
				t.Errorf("ledger after 503: job %s attempts %v", st, atts)
			}
		}
		second := g.post(t, "/charges", "busy-1", auth, `{}`)
		if second.status != http.StatusOK || second.body != `{"attempt":"2"}` || second.header.Get("Idempotency-Job-Id") != jobID {
			t.Errorf("retry: %v", second)
		}
		calls := up.callsFor("busy-1")
		if len(calls) != 2 || calls[0].attempt != "1" || calls[1].attempt != "2" || calls[0].jobID != jobID || calls[1].jobID != jobID {
			t.Errorf("upstream calls: %+v", calls)
		}
		if b.schema != "" {
			if st, atts := jobState(t, b, jobID); st != "completed" || len(atts) != 2 || atts[0] != "failed" || atts[1] != "succeeded" {
				t.Errorf("ledger after retry: job %s attempts %v", st, atts)
			}
		}
	})
}

func TestDisconnectedClientRetryReplays(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		started := make(chan struct{}, 1)
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			started <- struct{}{}
			time.Sleep(300 * time.Millisecond)
			fmt.Fprintf(w, `{"done":%d}`, n)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s"))
		ctx, cancel := context.WithCancel(context.Background())
		go func() { <-started; cancel() }()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, g.url+"/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "gone-1")
		req.Header.Set("Authorization", auth)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			t.Fatalf("the client was meant to leave, got %d", resp.StatusCode)
		}
		var r response
		eventually(t, "the retry replays the swallowed answer", func() bool {
			r = g.post(t, "/charges", "gone-1", auth, `{}`)
			return r.status == http.StatusOK
		})
		if r.body != `{"done":1}` || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry: %v", r)
		}
		if c := up.count("gone-1"); c != 1 {
			t.Errorf("upstream called %d times", c)
		}
	})
}

func TestAnswerSurvivesRestart(t *testing.T) {
	t.Run("postgres", func(t *testing.T) { testAnswerSurvivesRestart(t, pgBackend(t)) })
	t.Run("file", func(t *testing.T) { testAnswerSurvivesRestart(t, backend{name: "file"}) })
}

func testAnswerSurvivesRestart(t *testing.T, b backend) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	g := startGateway(t, b, site(up.addr()))
	first := g.post(t, "/charges", "durable-1", auth, `{}`)
	if first.status != http.StatusOK {
		t.Fatal(first)
	}
	g.stop()
	g.start()
	again := g.post(t, "/charges", "durable-1", auth, `{}`)
	if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Idempotency-Job-Id") != first.header.Get("Idempotency-Job-Id") {
		t.Errorf("after restart: %v", again)
	}
	if c := up.count("durable-1"); c != 1 {
		t.Errorf("upstream called %d times", c)
	}
}

func TestOwnersAreSeparate(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		hold := make(chan struct{})
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if r.Header.Get("Authorization") == "Bearer alice" {
				<-hold
			}
			fmt.Fprintf(w, `{"for":%q}`, r.Header.Get("Authorization"))
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s"))
		aliceDone := make(chan response, 1)
		go func() { aliceDone <- g.post(t, "/charges", "shared-key", "Bearer alice", `{}`) }()
		eventually(t, "alice's attempt reaches the upstream", func() bool { return up.count("shared-key") == 1 })
		// Alice's job is in flight: Bob is neither blocked nor replayed.
		bob := g.post(t, "/charges", "shared-key", "Bearer bob", `{}`)
		if bob.status != http.StatusOK || bob.body != `{"for":"Bearer bob"}` || bob.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("bob: %v", bob)
		}
		close(hold)
		alice := <-aliceDone
		if alice.body != `{"for":"Bearer alice"}` || alice.header.Get("Idempotency-Job-Id") == bob.header.Get("Idempotency-Job-Id") {
			t.Errorf("alice: %v", alice)
		}
		bob2 := g.post(t, "/charges", "shared-key", "Bearer bob", `{}`)
		if bob2.body != bob.body {
			t.Errorf("bob's replay shows %q", bob2.body)
		}
		anon := g.post(t, "/charges", "shared-key", "", `{}`)
		if anon.status != http.StatusUnauthorized || !strings.Contains(anon.body, "owner-missing") {
			t.Errorf("no owner: %v", anon)
		}
		if c := up.count("shared-key"); c != 2 {
			t.Errorf("upstream called %d times, want 2", c)
		}
	})
}

func TestHandleBlockIsProtected(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"n":%d}`, n)
		})
		g := startGateway(t, b, fmt.Sprintf(`	handle /api/* {
		reverse_proxy %s
	}
	idempotency {
		{ledger}
		require_key
	}
	respond "not here" 404
`, up.addr()))
		first := g.post(t, "/api/charges", "h-1", auth, `{}`)
		second := g.post(t, "/api/charges", "h-1", auth, `{}`)
		if first.status != 200 || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("handle block not behind the gateway: %v / %v", first, second)
		}
		if c := up.count("h-1"); c != 1 {
			t.Errorf("upstream called %d times", c)
		}
		noKey := g.post(t, "/api/charges", "", auth, `{}`)
		if noKey.status != http.StatusBadRequest || !strings.Contains(noKey.body, "key-missing") {
			t.Errorf("require_key: %v", noKey)
		}
		get := g.do(t, context.Background(), http.MethodGet, "/api/charges", "", auth, "")
		if get.status != http.StatusOK {
			t.Errorf("GET passes through: %v", get)
		}
	})
}

// TestEmptyPOSTNotResentBelow: an empty-body POST with a key is, to Go's
// HTTP client, a request it may re-send by itself when a reused connection
// breaks. The provider here reads the request, then drops the reused
// connection without answering: it must have been executed once.
func TestEmptyPOSTNotResentBelow(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		d := newDropper(t)
		g := startGateway(t, b, site(d.ln.Addr().String()))
		warm := g.post(t, "/charges", "warm-1", auth, "")
		if warm.status != http.StatusOK {
			t.Fatalf("first request: %v", warm)
		}
		r := g.post(t, "/charges", "empty-1", auth, "")
		if c := d.count("empty-1"); c != 1 {
			t.Fatalf("provider read the empty POST %d times, want 1", c)
		}
		if r.status != http.StatusBadGateway || !strings.Contains(r.body, "outcome-unknown") {
			t.Errorf("dropped answer: %v", r)
		}
		again := g.post(t, "/charges", "empty-1", auth, "")
		if again.status != http.StatusConflict || d.count("empty-1") != 1 {
			t.Errorf("retry of the unknown job: %v (provider reads %d)", again, d.count("empty-1"))
		}
	})
}

// TestHeaderDirectiveRewritesEachAnswer: Caddy's `header` directive in
// front of the gateway rewrites the answer's values in place when it is
// written; each client's answer is rewritten once, and the stored answer
// never (a replay used to hand the directive the ledger's own values, and
// every replay rewrote them again).
func TestHeaderDirectiveRewritesEachAnswer(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("X-Trace", "first")
			fmt.Fprintf(w, `{"n":%d}`, n)
		})
		g := startGateway(t, b, "\theader >X-Trace first first-seen\n"+site(up.addr()))
		for i := range 4 {
			r := g.post(t, "/charges", "hdr-1", auth, `{}`)
			if r.status != http.StatusOK || r.body != `{"n":1}` || r.header.Get("X-Trace") != "first-seen" {
				t.Errorf("answer %d: %v, want X-Trace rewritten once", i, r)
			}
		}
	})
}

// TestNestedHandlersOneJob: an idempotency handler nested in a route of a
// site that one already guards, both on the same ledger: a keyed request
// runs once and is answered at once, and its retry replays it (it used to
// wait on itself until attempt_timeout, then answer 504 with the job
// unknown and the provider never called).
func TestNestedHandlersOneJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"n":%d}`, n)
		})
		g := startGateway(t, b, "\tidempotency {\n\t\t{ledger}\n\t}\n\troute {\n"+site(up.addr())+"\t}\n")
		first := g.post(t, "/charges", "nested-1", auth, `{}`)
		if first.status != http.StatusOK || first.body != `{"n":1}` {
			t.Fatalf("first: %v", first)
		}
		replay := g.post(t, "/charges", "nested-1", auth, `{}`)
		if replay.status != http.StatusOK || replay.body != `{"n":1}` || replay.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay: %v", replay)
		}
		if n := up.count("nested-1"); n != 1 {
			t.Errorf("the provider was called %d times, want 1", n)
		}
		if !strings.Contains(g.out.String(), "nested") {
			t.Errorf("no warning of the nested handler in the log")
		}
	})
}

// TestProviderOwnHeadersIgnored: a provider that sends the gateway's own
// headers (Idempotency-Job-Id, Idempotent-Replayed, Idempotency-Expires)
// reaches no client with them, first answer or replay: each carries the
// gateway's values alone (the expiry used to be the provider's, and to be
// stored and replayed).
func TestProviderOwnHeadersIgnored(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Idempotency-Job-Id", "job_forged")
			w.Header().Set("Idempotent-Replayed", "forged")
			w.Header().Set("Idempotency-Expires", "Thu, 01 Jan 1970 00:00:00 GMT")
			w.Header().Set("Idempotency-Reconciled", "lookup")
			fmt.Fprintf(w, `{"n":%d}`, n)
		})
		g := startGateway(t, b, site(up.addr()))
		first := g.post(t, "/charges", "own-1", auth, `{}`)
		replay := g.post(t, "/charges", "own-1", auth, `{}`)
		id := first.header.Get("Idempotency-Job-Id")
		for _, tc := range []struct {
			name     string
			r        response
			replayed []string
		}{{"first", first, nil}, {"replay", replay, []string{"true"}}} {
			h := tc.r.header
			if tc.r.status != http.StatusOK || tc.r.body != `{"n":1}` {
				t.Errorf("%s: %v", tc.name, tc.r)
			}
			if got := h.Values("Idempotency-Job-Id"); len(got) != 1 || got[0] == "job_forged" || got[0] != id {
				t.Errorf("%s: Idempotency-Job-Id %q", tc.name, got)
			}
			if got := h.Values("Idempotent-Replayed"); !slices.Equal(got, tc.replayed) {
				t.Errorf("%s: Idempotent-Replayed %q, want %q", tc.name, got, tc.replayed)
			}
			if got := h.Values("Idempotency-Reconciled"); got != nil {
				t.Errorf("%s: Idempotency-Reconciled %q on an answer no lookup found", tc.name, got)
			}
			got := h.Values("Idempotency-Expires")
			at, err := http.ParseTime(h.Get("Idempotency-Expires"))
			if len(got) != 1 || err != nil || !at.After(time.Now()) {
				t.Errorf("%s: Idempotency-Expires %q, want the gateway's (after now)", tc.name, got)
			}
		}
	})
}
