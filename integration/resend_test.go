//go:build integration

package integration

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// dedupUpstream is a provider that honours Idempotency-Key as its own
// idempotency key: the work for a key is done once (effects counts it); a
// request for a key whose work runs is answered 409; one for a key done gets
// the stored answer. Its first answer for a key is lost when lose says so:
// the connection is closed after the work, without an answer.
type dedupUpstream struct {
	*upstream
	mu      sync.Mutex
	effects map[string]int
	done    map[string]string
	running map[string]bool
}

func newDedupUpstream(t *testing.T, lose func(key string) bool, hold <-chan struct{}) *dedupUpstream {
	d := &dedupUpstream{effects: map[string]int{}, done: map[string]string{}, running: map[string]bool{}}
	d.upstream = newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		key := r.Header.Get("Idempotency-Key")
		d.mu.Lock()
		if answer, ok := d.done[key]; ok {
			d.mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, answer)
			return
		}
		if d.running[key] {
			d.mu.Unlock()
			w.WriteHeader(http.StatusConflict)
			return
		}
		d.running[key] = true
		d.mu.Unlock()
		if hold != nil {
			<-hold
		}
		d.mu.Lock()
		d.effects[key]++
		d.done[key] = fmt.Sprintf(`{"charged":%q}`, key)
		delete(d.running, key)
		d.mu.Unlock()
		if n == 1 && lose(key) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // the work is done; its answer is lost
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, d.done[key])
	})
	return d
}

func (d *dedupUpstream) sideEffects(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.effects[key]
}

func dedupSite(addr string, extra ...string) string {
	return fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_deadline 20s
%s		provider payments {
			deduplicates
			reverse_proxy %s
		}
	}
`, indent(extra), addr)
}

// TestResendWithinRequest: the answer of a deduplicating provider is lost
// after the work; the gateway sends the request again within the client's
// request, and the client gets the one answer. One side effect.
func TestResendWithinRequest(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		d := newDedupUpstream(t, func(string) bool { return true }, nil)
		g := startGateway(t, b, dedupSite(d.addr(), "attempt_timeout 5s"))
		r := g.post(t, "/charges", "rw-1", auth, `{}`)
		job := r.header.Get("Idempotency-Job-Id")
		if r.status != http.StatusCreated || r.body != fmt.Sprintf(`{"charged":%q}`, job) {
			t.Fatalf("answer: %v", r)
		}
		if j := g.job(t, job); j.State != "completed" || len(j.Attempts) != 2 || j.Attempts[0].State != "unknown" ||
			j.Attempts[1].State != "succeeded" || !j.Attempts[1].Resend || j.Attempts[1].Reconciled == nil {
			t.Errorf("job %+v", j)
		}
		if d.count(job) != 2 || d.sideEffects(job) != 1 {
			t.Errorf("the provider saw the job %d times, %d side effects", d.count(job), d.sideEffects(job))
		}
		if again := g.post(t, "/charges", "rw-1", auth, `{}`); again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry: %v", again)
		}
	})
}

// TestResendOnClientRetry: the attempt timed out while the provider still
// worked. A retry is sent again: the provider says 409 (in progress), the
// job stays unknown; once the work is done, the next retry's re-send gets
// the provider's answer. One side effect.
func TestResendOnClientRetry(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		hold := make(chan struct{})
		var once sync.Once
		release := func() { once.Do(func() { close(hold) }) }
		t.Cleanup(release)
		d := newDedupUpstream(t, func(string) bool { return true }, hold)
		g := startGateway(t, b, dedupSite(d.addr(), "attempt_timeout 300ms"))
		first := g.post(t, "/charges", "rr-1", auth, `{}`)
		job := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout || job == "" {
			t.Fatalf("first: %v", first)
		}
		busy := g.post(t, "/charges", "rr-1", auth, `{}`)
		if busy.status != http.StatusConflict || d.count(job) != 2 {
			t.Fatalf("retry while the work runs: %v (the provider saw the job %d times)", busy, d.count(job))
		}
		if j := g.job(t, job); j.State != "unknown" {
			t.Errorf("after a refused re-send the job is %s, want unknown", j.State)
		}
		// The work ends; the original's answer is lost on the way back.
		release()
		eventually(t, "the provider did the work", func() bool { return d.sideEffects(job) == 1 })
		var r response
		eventually(t, "a retry gets the answer", func() bool {
			r = g.post(t, "/charges", "rr-1", auth, `{}`)
			return r.status == http.StatusCreated
		})
		if r.body != fmt.Sprintf(`{"charged":%q}`, job) || d.sideEffects(job) != 1 {
			t.Errorf("answer %v, %d side effects", r, d.sideEffects(job))
		}
		if j := g.job(t, job); j.State != "completed" {
			t.Errorf("job %s, want completed", j.State)
		}
	})
}

// TestResendInProgressAnswers: a re-send answered 409, 425, 429 or 503 says
// the original may still be running or was not taken: the re-send failed,
// the job stays unknown, the client gets 409 outcome-unknown, and nothing
// fails over or runs again.
func TestResendInProgressAnswers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		u := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				select { // past attempt_timeout: unknown
				case <-release:
				case <-r.Context().Done():
				}
				return
			}
			status, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/charges/"))
			w.WriteHeader(status)
		})
		g := startGateway(t, b, dedupSite(u.addr(), "attempt_timeout 300ms"))
		for _, status := range []int{409, 425, 429, 503} {
			path, key := fmt.Sprintf("/charges/%d", status), fmt.Sprintf("ip-%d", status)
			first := g.post(t, path, key, auth, `{}`)
			job := first.header.Get("Idempotency-Job-Id")
			if first.status != http.StatusGatewayTimeout {
				t.Fatalf("%d: first %v", status, first)
			}
			r := g.post(t, path, key, auth, `{}`)
			if r.status != http.StatusConflict || !strings.Contains(r.body, "outcome-unknown") {
				t.Errorf("the retry whose re-send got %d: %v", status, r)
			}
			j := g.job(t, job)
			if j.State != "unknown" || len(j.Attempts) != 2 || j.Attempts[0].State != "unknown" ||
				j.Attempts[1].State != "failed" || !j.Attempts[1].Resend {
				t.Errorf("after a re-send answered %d the job is %+v", status, j)
			}
			if n := u.count(job); n != 2 {
				t.Errorf("%d: the provider saw the job %d times, want 2", status, n)
			}
		}
	})
}
