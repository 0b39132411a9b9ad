//go:build integration

package integration

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// providers is a site whose gateway has a primary and a fallback provider.
func providers(primary, fallback string, extra ...string) string {
	return fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_deadline 20s
%s		provider primary {
			reverse_proxy %s
		}
		provider fallback {
			reverse_proxy %s
		}
	}
`, indent(extra), primary, fallback)
}

func answering(body string) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, body)
	}
}

func TestFailoverOn503(t *testing.T) {
	b := pgBackend(t)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	})
	fallback := newUpstream(t, answering(`{"from":"fallback"}`))
	g := startGateway(t, b, providers(primary.addr(), fallback.addr(), "attempt_timeout 5s"))
	r := g.post(t, "/charges", "fo-1", auth, `{}`)
	if r.status != http.StatusOK || r.body != `{"from":"fallback"}` {
		t.Fatalf("failover: %v", r)
	}
	jobID := r.header.Get("Idempotency-Job-Id")
	if st, atts := jobState(t, b, jobID); st != "completed" || len(atts) != 2 || atts[0] != "failed" || atts[1] != "succeeded" {
		t.Errorf("ledger: job %s attempts %v, want completed [failed succeeded]", st, atts)
	}
	pc, fc := primary.callsFor("fo-1"), fallback.callsFor("fo-1")
	if len(pc) != 1 || len(fc) != 1 || pc[0].attempt != "1" || fc[0].attempt != "2" || fc[0].jobID != jobID {
		t.Errorf("calls: primary %+v fallback %+v", pc, fc)
	}
	again := g.post(t, "/charges", "fo-1", auth, `{}`)
	if again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" || primary.count("fo-1") != 1 {
		t.Errorf("retry: %v", again)
	}
}

func TestFailoverOnConnectError(t *testing.T) {
	b := pgBackend(t)
	closed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	fallback := newUpstream(t, answering(`{"from":"fallback"}`))
	g := startGateway(t, b, providers(closed, fallback.addr(), "attempt_timeout 5s"))
	r := g.post(t, "/charges", "ce-1", auth, `{}`)
	if r.status != http.StatusOK || r.body != `{"from":"fallback"}` {
		t.Fatalf("failover: %v", r)
	}
	if st, atts := jobState(t, b, r.header.Get("Idempotency-Job-Id")); st != "completed" || len(atts) != 2 || atts[0] != "failed" {
		t.Errorf("ledger: job %s attempts %v", st, atts)
	}
}

func TestEveryProviderFails(t *testing.T) {
	b := pgBackend(t)
	closed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	busy := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if n > 1 {
			io.WriteString(w, `{"second":"try"}`)
			return
		}
		http.Error(w, "still busy", http.StatusServiceUnavailable)
	})
	g := startGateway(t, b, providers(closed, busy.addr(), "attempt_timeout 5s"))
	r := g.post(t, "/charges", "all-1", auth, `{}`)
	if r.status != http.StatusServiceUnavailable || r.body != "still busy\n" {
		t.Fatalf("the last provider's answer: %v", r)
	}
	jobID := r.header.Get("Idempotency-Job-Id")
	if st, atts := jobState(t, b, jobID); st != "failed" || len(atts) != 2 {
		t.Errorf("ledger: job %s attempts %v", st, atts)
	}
	// A retry re-opens the job on the primary, then fails over again.
	again := g.post(t, "/charges", "all-1", auth, `{}`)
	if again.status != http.StatusOK || again.body != `{"second":"try"}` || again.header.Get("Idempotency-Job-Id") != jobID {
		t.Errorf("retry: %v", again)
	}
	if st, atts := jobState(t, b, jobID); st != "completed" || len(atts) != 4 || atts[3] != "succeeded" {
		t.Errorf("ledger after retry: job %s attempts %v", st, atts)
	}
}

func TestTimeoutDoesNotFailOver(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	defer close(release)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { <-release })
	fallback := newUpstream(t, answering(`{"from":"fallback"}`))
	g := startGateway(t, b, providers(primary.addr(), fallback.addr(), "attempt_timeout 300ms"))
	r := g.post(t, "/charges", "to-1", auth, `{}`)
	if r.status != http.StatusGatewayTimeout || !strings.Contains(r.body, "outcome-unknown") {
		t.Fatalf("timeout: %v", r)
	}
	retry := g.post(t, "/charges", "to-1", auth, `{}`)
	if retry.status != http.StatusConflict {
		t.Errorf("retry: %v", retry)
	}
	if c := fallback.count("to-1"); c != 0 {
		t.Errorf("fallback called %d times after a timeout", c)
	}
	if st, atts := jobState(t, b, r.header.Get("Idempotency-Job-Id")); st != "unknown" || len(atts) != 1 || atts[0] != "unknown" {
		t.Errorf("ledger: job %s attempts %v", st, atts)
	}
}

// TestHedgeReverseOrder: the primary leaves first and returns last; the
// hedge on the fallback answers first and wins; the primary's late answer
// is lost, and retries replay the fallback's body.
func TestHedgeReverseOrder(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		io.WriteString(w, `{"from":"primary"}`)
	})
	fallback := newUpstream(t, answering(`{"from":"fallback"}`))
	g := startGateway(t, b, providers(primary.addr(), fallback.addr(), "attempt_timeout 10s", "hedge_after 150ms"))
	r := g.post(t, "/charges", "hedge-1", auth, `{}`)
	if r.status != http.StatusOK || r.body != `{"from":"fallback"}` {
		t.Fatalf("hedged answer: %v", r)
	}
	jobID := r.header.Get("Idempotency-Job-Id")
	close(release)
	eventually(t, "the primary's late answer is recorded as lost", func() bool {
		_, atts := jobState(t, b, jobID)
		return len(atts) == 2 && atts[0] == "lost"
	})
	if st, atts := jobState(t, b, jobID); st != "completed" || atts[1] != "succeeded" {
		t.Errorf("ledger: job %s attempts %v", st, atts)
	}
	again := g.post(t, "/charges", "hedge-1", auth, `{}`)
	if again.body != `{"from":"fallback"}` || again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry replays %v", again)
	}
	pc, fc := primary.callsFor("hedge-1"), fallback.callsFor("hedge-1")
	if len(pc) != 1 || len(fc) != 1 || pc[0].attempt != "1" || fc[0].attempt != "2" {
		t.Errorf("calls: primary %+v fallback %+v", pc, fc)
	}
}

// TestServerSentEvents: a stream reaches the client before it ends, and is
// replayed whole.
func TestServerSentEvents(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		second := make(chan struct{})
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			w.(http.Flusher).Flush()
			<-second
			io.WriteString(w, "data: two\n\n")
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s"))
		req, _ := http.NewRequest(http.MethodPost, g.url+"/stream", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "sse-1")
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if err != nil || line != "data: one\n" {
			t.Fatalf("first event before the stream ended: %q %v", line, err)
		}
		close(second)
		rest, _ := io.ReadAll(br)
		if got := line + string(rest); got != "data: one\n\ndata: two\n\n" {
			t.Errorf("stream = %q", got)
		}
		var replay response
		eventually(t, "the stream is stored", func() bool {
			replay = g.post(t, "/stream", "sse-1", auth, `{}`)
			return replay.status == http.StatusOK
		})
		if replay.body != "data: one\n\ndata: two\n\n" || replay.header.Get("Idempotent-Replayed") != "true" ||
			replay.header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("replay: %v", replay)
		}
		if c := up.count("sse-1"); c != 1 {
			t.Errorf("upstream called %d times", c)
		}
	})
}

// TestDeduplicatesSendsTheJobID: a provider that deduplicates receives the
// job id in its header through the real binary, on every ledger; the
// client's key never reaches it.
func TestDeduplicatesSendsTheJobID(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, answering(`{"ok":true}`))
		g := startGateway(t, b, fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_timeout 5s
		provider payments {
			deduplicates
			reverse_proxy %s
		}
	}
`, up.addr()))
		r := g.post(t, "/charges", "client-key-1", auth, `{}`)
		job := r.header.Get("Idempotency-Job-Id")
		if r.status != http.StatusOK || job == "" {
			t.Fatalf("first: %v", r)
		}
		if up.count("client-key-1") != 0 || up.count(job) != 1 {
			t.Errorf("the provider saw the client's key %d times and the job id %d times", up.count("client-key-1"), up.count(job))
		}
	})
}
