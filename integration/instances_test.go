//go:build integration

package integration

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// shared runs fn on each ledger a fleet can share: PostgreSQL, Redis and
// Redis Cluster.
func shared(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Run("postgres", func(t *testing.T) { fn(t, pgBackend(t)) })
	t.Run("redis", func(t *testing.T) { fn(t, redisBackend(t)) })
	t.Run("redis-cluster", func(t *testing.T) { fn(t, redisClusterBackend(t)) })
}

// fleet starts n gateways on one shared ledger.
func fleet(t *testing.T, b backend, n int, site string) []*gateway {
	gs := make([]*gateway, n)
	for i := range gs {
		gs[i] = startGateway(t, b, site)
	}
	return gs
}

// TestFleetBurstOneJob: identical requests spread over three instances make
// one upstream call and one job.
func TestFleetBurstOneJob(t *testing.T) { shared(t, testFleetBurstOneJob) }

func testFleetBurstOneJob(t *testing.T, b backend) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		time.Sleep(200 * time.Millisecond)
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	gs := fleet(t, b, 3, site(up.addr(), "attempt_timeout 10s"))
	const per = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	var resps []response
	for _, g := range gs {
		for range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := g.post(t, "/charges", "fleet-1", auth, `{}`)
				mu.Lock()
				resps = append(resps, r)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	for _, r := range resps {
		if r.status != http.StatusOK || r.body != `{"n":1}` || r.header.Get("Idempotency-Job-Id") != resps[0].header.Get("Idempotency-Job-Id") {
			t.Errorf("response %v", r)
		}
	}
	if c := up.count("fleet-1"); c != 1 {
		t.Errorf("upstream called %d times, want 1", c)
	}
}

// TestFleetWaiterWokenByNotification: a duplicate waiting on instance B is
// woken by the completion on instance A. B polls nothing: the attempt's
// lease (60 s) is longer than B's wait (5 s), so without the notification
// B would answer 409 when its wait ends.
func TestFleetWaiterWokenByNotification(t *testing.T) { shared(t, testFleetWaiterWokenByNotification) }

func testFleetWaiterWokenByNotification(t *testing.T, b backend) {
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	s := fmt.Sprintf("\tidempotency {\n\t\t{ledger}\n\t\tattempt_timeout 30s\n\t\tattempt_deadline 60s\n\t\tin_flight wait 5s\n\t}\n\treverse_proxy %s\n", up.addr())
	gs := fleet(t, b, 2, s)
	first := make(chan response, 1)
	go func() { first <- gs[0].post(t, "/charges", "wake-1", auth, `{}`) }()
	eventually(t, "instance A's attempt reaches the upstream", func() bool { return up.count("wake-1") == 1 })
	waiter := make(chan response, 1)
	go func() { waiter <- gs[1].post(t, "/charges", "wake-1", auth, `{}`) }()
	// Give B's request time to reach its wait; then complete on A.
	eventually(t, "B's request is waiting", func() bool {
		_, body := gs[1].adminCall(t, http.MethodGet, "/metrics", "")
		return strings.Contains(body, `caddy_idempotency_ledger_seconds_count{operation="reserve"} 1`)
	})
	close(release)
	a, w := <-first, <-waiter
	if a.status != http.StatusOK || w.status != http.StatusOK || w.body != a.body || w.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("A: %v\nB: %v", a, w)
	}
}

// TestFleetKilledInstance: an instance killed with SIGKILL mid-attempt
// leaves its attempt unknown once the lease runs out; a survivor never
// re-runs it.
func TestFleetKilledInstance(t *testing.T) { shared(t, testFleetKilledInstance) }

func testFleetKilledInstance(t *testing.T, b backend) {
	release := make(chan struct{})
	defer close(release)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { <-release })
	s := fmt.Sprintf("\tidempotency {\n\t\t{ledger}\n\t\tattempt_timeout 1s\n\t\tattempt_deadline 1500ms\n\t\tin_flight reject\n\t}\n\treverse_proxy %s\n", up.addr())
	gs := fleet(t, b, 2, s)
	victim, survivor := gs[0], gs[1]
	go func() { // answered by nobody: the victim dies
		req, _ := http.NewRequest(http.MethodPost, victim.url+"/charges", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "kill-1")
		req.Header.Set("Authorization", auth)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	eventually(t, "the victim's attempt reaches the upstream", func() bool { return up.count("kill-1") == 1 })
	victim.cmd.Process.Kill()
	<-victim.exited
	victim.cmd = nil

	var r response
	eventually(t, "the lease runs out and the job reads unknown", func() bool {
		r = survivor.post(t, "/charges", "kill-1", auth, `{}`)
		return strings.Contains(r.body, "outcome-unknown")
	})
	if r.status != http.StatusConflict || r.header.Get("Retry-After") != "" {
		t.Errorf("retry after the lease: %v", r)
	}
	j := survivor.job(t, r.header.Get("Idempotency-Job-Id"))
	if j.State != "unknown" || len(j.Attempts) != 1 || j.Attempts[0].State != "unknown" {
		t.Errorf("job: %+v", j)
	}
	if c := up.count("kill-1"); c != 1 {
		t.Errorf("upstream called %d times: a survivor re-ran the attempt", c)
	}
}
