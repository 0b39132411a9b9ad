//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
)

// replyLostSite is a gateway with one provider, name, at up. Its deadlines
// are short, so that a job left behind shows within the test's waits.
func replyLostSite(name, up string) string {
	return fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_timeout 2s
		attempt_deadline 3s
		in_flight wait 1s
		provider %s {
			reverse_proxy %s
		}
	}
`, name, up)
}

// unique is a marker no other byte sent to a ledger carries.
func unique(prefix string) string { return fmt.Sprintf("%s%016x", prefix, rand.Uint64()) }

// created answers 201 with the call's number for its key, and marker in
// an X-Marker header (none when empty).
func created(marker string) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		if marker != "" {
			w.Header().Set("X-Marker", marker)
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"charge":%d}`, n)
	}
}

// streaming sends three events, flushed one by one, each carrying
// bodyMarker, with headerMarker in an X-Marker header (none when empty).
func streaming(headerMarker, bodyMarker string) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "text/event-stream")
		if headerMarker != "" {
			w.Header().Set("X-Marker", headerMarker)
		}
		w.WriteHeader(http.StatusOK)
		for i := range 3 {
			fmt.Fprint(w, streamEvent(n, i, bodyMarker))
			w.(http.Flusher).Flush()
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func streamEvent(call, i int, marker string) string {
	return fmt.Sprintf("data: call %d event %d %s\n\n", call, i, marker)
}

// TestLedgerReplyLost lets one ledger call through and drops its reply
// (faultproxy.Proxy.DropReply): the transition happened, but the gateway saw its
// connection break. Every transition is idempotent (docs/contract.md,
// section 2, rule 3), so the gateway may repeat it and gets what the first application
// returned: the first client gets its own answer (never marked replayed),
// a retry replays it, and nothing runs twice. A reservation whose reply
// was lost while the ledger then went away was never sent: once the
// ledger is back, it is recorded failed (rule 7) and a retry runs the
// request.
func TestLedgerReplyLost(t *testing.T) {
	faultyLedgers(t, func(t *testing.T, b backend, p *faultproxy.Proxy) {
		// start runs a gateway whose one provider is named name; post
		// sends to it, each request bounded in time.
		start := func(t *testing.T, name string, serve func(http.ResponseWriter, *http.Request, int)) (*upstream, func(key string) response, *gateway) {
			t.Cleanup(p.Restore)
			up := newUpstream(t, serve)
			g := startGateway(t, b, replyLostSite(name, up.addr()))
			return up, func(key string) response {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				return g.do(t, ctx, http.MethodPost, "/charges", key, auth, "{}")
			}, g
		}
		// replays checks a retry of key: the first answer, replayed.
		replays := func(t *testing.T, retry, first response) {
			t.Helper()
			if retry.status != first.status || retry.body != first.body || retry.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("retry: %v, want a replay of %d %s", retry, first.status, first.body)
			}
		}
		ranOnce := func(t *testing.T, up *upstream, key string) {
			t.Helper()
			if c := up.count(key); c != 1 {
				t.Errorf("the upstream ran %d times, want once", c)
			}
		}

		t.Run("completion", func(t *testing.T) {
			marker := unique("complete-")
			up, post, _ := start(t, "primary", created(marker))
			d := p.DropReply(marker, false)
			first := post("rl-complete")
			waitDrop(t, d)
			if first.status != http.StatusCreated || first.body != `{"charge":1}` || first.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("first client: %v, want the upstream's 201 {\"charge\":1}, not replayed", first)
			}
			replays(t, post("rl-complete"), response{status: http.StatusCreated, body: `{"charge":1}`})
			ranOnce(t, up, "rl-complete")
		})

		// A stream takes the result slot when its headers come (the head
		// completion carries X-Marker) and saves its body when it ends
		// (save_body carries the events' marker).
		for _, c := range []struct{ name, head, body string }{
			{name: "stream-head", head: unique("head-")},
			{name: "stream-body", body: unique("body-")},
		} {
			t.Run(c.name, func(t *testing.T) {
				key := "rl-" + c.name
				up, post, _ := start(t, "primary", streaming(c.head, c.body))
				d := p.DropReply(c.head+c.body, false)
				first := post(key)
				waitDrop(t, d)
				want := streamEvent(1, 0, c.body) + streamEvent(1, 1, c.body) + streamEvent(1, 2, c.body)
				if first.status != http.StatusOK || first.body != want || first.header.Get("Idempotent-Replayed") != "" {
					t.Errorf("first client: %v, want the whole stream %q, not replayed", first, want)
				}
				var retry response
				eventually(t, "a retry is no longer told the answer is still streaming", func() bool {
					retry = post(key)
					return retry.status != http.StatusConflict || !strings.Contains(retry.body, "urn:onejob:problem:in-flight")
				})
				replays(t, retry, response{status: http.StatusOK, body: want})
				ranOnce(t, up, key)
			})
		}

		t.Run("reserve-then-down", func(t *testing.T) {
			name := unique("reserve-")
			up, post, g := start(t, name, created(""))
			d := p.DropReply(name, true)
			first := post("rl-reserve-down")
			waitDrop(t, d)
			if c := up.count("rl-reserve-down"); c != 0 {
				t.Fatalf("the upstream ran %d times though its reservation was not recorded", c)
			}
			wantProblemType(t, first, http.StatusServiceUnavailable, "ledger-unavailable")

			p.Restore()
			id := findJob(t, g, name)
			// As soon as the ledger answers again, the attempt is recorded
			// failed: the gateway knows it never sent it.
			var state string
			var attempts []string
			deadline := time.Now().Add(10 * time.Second)
			for {
				state, attempts = recordedState(t, b, g, id)
				if state == "failed" && slices.Equal(attempts, []string{"failed"}) || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if state != "failed" || !slices.Equal(attempts, []string{"failed"}) {
				t.Errorf("10 s after the ledger came back: job %s, attempts %v; want failed, [failed] (never sent)", state, attempts)
			}
			retry := post("rl-reserve-down")
			if retry.status != http.StatusCreated || retry.body != `{"charge":1}` || retry.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("retry: %v, want the upstream's 201 {\"charge\":1}, not replayed", retry)
			}
			ranOnce(t, up, "rl-reserve-down")
		})

		t.Run("reserve", func(t *testing.T) {
			name := unique("reserve-")
			up, post, _ := start(t, name, created(""))
			d := p.DropReply(name, false)
			first := post("rl-reserve")
			waitDrop(t, d)
			if first.status != http.StatusCreated || first.body != `{"charge":1}` || first.header.Get("Idempotent-Replayed") != "" {
				t.Errorf("first client: %v, want the upstream's 201 {\"charge\":1}, not replayed", first)
			}
			replays(t, post("rl-reserve"), response{status: http.StatusCreated, body: `{"charge":1}`})
			ranOnce(t, up, "rl-reserve")
		})
	})
}

// findJob returns the id of the one job whose attempts went to provider,
// from the admin API's listing, once the ledger answers it.
func findJob(t *testing.T, g *gateway, provider string) string {
	t.Helper()
	var status int
	var body string
	var page struct {
		Jobs []adminJob `json:"jobs"`
	}
	eventually(t, "the admin API lists the job", func() bool {
		status, body = g.adminCall(t, http.MethodGet, "/idempotency/jobs?provider="+url.QueryEscape(provider), "")
		return status == http.StatusOK && json.Unmarshal([]byte(body), &page) == nil && len(page.Jobs) > 0
	})
	if len(page.Jobs) != 1 {
		t.Fatalf("jobs of provider %s: %s", provider, body)
	}
	return page.Jobs[0].ID
}

// recordedState is a job's state and its attempts' states, as an operator
// reads them: from the tables of a PostgreSQL ledger (leases not applied),
// from the admin API for others.
func recordedState(t *testing.T, b backend, g *gateway, id string) (string, []string) {
	t.Helper()
	if b.schema != "" {
		return jobState(t, b, id)
	}
	j := g.job(t, id)
	var attempts []string
	for _, a := range j.Attempts {
		attempts = append(attempts, a.State)
	}
	return j.State, attempts
}
