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

// recordsUpstream is a provider that keeps a record of what it did for
// each job (by Idempotency-Job-Id) and answers lookups of it: GET
// /records/<job id> is 200 with the record when it acted, 404 when it
// never did. How it treats a charge is the test's: act or not, then
// answer at once or too late for the gateway.
type recordsUpstream struct {
	*upstream
	mu      sync.Mutex
	effects map[string]int
	lookups map[string]int
	// busy, while above zero, answers that many lookups 503 first.
	busy map[string]int
	// looking counts lookups running now; overlap is the most at once.
	looking, overlap int
	hold             time.Duration // how long a lookup takes
}

// charge says, for attempt n of a job, whether the provider acts and
// how long it takes to answer.
type charge func(n int) (act bool, answerAfter time.Duration)

func newRecordsUpstream(t *testing.T, c charge) *recordsUpstream {
	u := &recordsUpstream{effects: map[string]int{}, lookups: map[string]int{}, busy: map[string]int{}}
	u.upstream = newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if job, ok := strings.CutPrefix(r.URL.Path, "/records/"); ok && r.Method == http.MethodGet {
			u.lookup(w, job)
			return
		}
		job := r.Header.Get("Idempotency-Job-Id")
		var n int
		fmt.Sscan(r.Header.Get("Idempotency-Attempt"), &n)
		act, after := c(n)
		if act {
			u.mu.Lock()
			u.effects[job]++
			u.mu.Unlock()
		}
		time.Sleep(after)
		if act {
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"charge":%q,"attempt":%d}`, job, n)
		} else {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	return u
}

func (u *recordsUpstream) lookup(w http.ResponseWriter, job string) {
	u.mu.Lock()
	u.lookups[job]++
	u.looking++
	u.overlap = max(u.overlap, u.looking)
	busy := u.busy[job] > 0
	if busy {
		u.busy[job]--
	}
	acted := u.effects[job] > 0
	hold := u.hold
	u.mu.Unlock()
	time.Sleep(hold)
	u.mu.Lock()
	u.looking--
	u.mu.Unlock()
	switch {
	case busy:
		w.WriteHeader(http.StatusServiceUnavailable)
	case acted:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"charge":%q,"found":true}`, job)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func (u *recordsUpstream) counts(job string) (effects, lookups int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.effects[job], u.lookups[job]
}

// lookupSite is a route whose provider has a lookup: attempts time out at
// 300ms, their deadline is 2s, and the reconciler runs every 100ms.
func lookupSite(addr string) string {
	return fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_timeout 300ms
		attempt_deadline 2s
		reconcile_every 100ms
		provider payments {
			lookup GET /records/{idempotency.job_id} {
				absent 404
			}
			reverse_proxy %s
		}
	}
`, addr)
}

// TestLookupAbsent: the first attempt times out and the provider never
// acted on it; after its deadline the lookup says 404, the job fails by
// itself, and the client's retry runs it, once.
func TestLookupAbsent(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		u := newRecordsUpstream(t, func(n int) (bool, time.Duration) {
			if n == 1 {
				return false, 3 * time.Second // dropped, never acted
			}
			return true, 0
		})
		g := startGateway(t, b, lookupSite(u.addr()))
		first := g.post(t, "/charges", "la-1", auth, `{}`)
		job := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout || job == "" {
			t.Fatalf("first: %v", first)
		}
		if r := g.post(t, "/charges", "la-1", auth, `{}`); r.status != http.StatusConflict {
			t.Fatalf("a retry before the lookup: %v, want 409", r)
		}
		eventually(t, "the lookup fails the job", func() bool { return g.job(t, job).State == "failed" })
		j := g.job(t, job)
		if a := j.Attempts[0]; a.State != "failed" || a.Reconciled == nil || *a.Reconciled != "lookup" ||
			a.Reconcile == nil || a.Reconcile.Tries != 1 || a.Reconcile.LastStatus == nil || *a.Reconcile.LastStatus != 404 {
			t.Errorf("the looked-up attempt: %+v", a)
		}
		r := g.post(t, "/charges", "la-1", auth, `{}`)
		if r.status != http.StatusCreated || r.body != fmt.Sprintf(`{"charge":%q,"attempt":2}`, job) {
			t.Fatalf("the retry: %v", r)
		}
		if again := g.post(t, "/charges", "la-1", auth, `{}`); again.body != r.body || again.header.Get("Idempotency-Reconciled") != "" {
			t.Errorf("replay: %v", again)
		}
		if effects, _ := u.counts(job); effects != 1 {
			t.Errorf("%d side effects, want 1", effects)
		}
		if v := g.metricValue(t, `caddy_idempotency_reconciled_total{provider="payments",result="failed",scope="srv0"}`); v != 1 {
			t.Errorf("reconciled_total{result=failed} = %v, want 1", v)
		}
	})
}

// TestLookupCompletes: the provider acted but its answer came too late;
// the lookup finds its record, which becomes the job's answer: the retry
// replays it, marked, and nothing runs again.
func TestLookupCompletes(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		u := newRecordsUpstream(t, func(int) (bool, time.Duration) { return true, 3 * time.Second })
		g := startGateway(t, b, lookupSite(u.addr()))
		first := g.post(t, "/charges", "lc-1", auth, `{}`)
		job := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout || job == "" {
			t.Fatalf("first: %v", first)
		}
		eventually(t, "the lookup completes the job", func() bool { return g.job(t, job).State == "completed" })
		r := g.post(t, "/charges", "lc-1", auth, `{}`)
		if r.status != http.StatusOK || r.body != fmt.Sprintf(`{"charge":%q,"found":true}`, job) ||
			r.header.Get("Idempotency-Reconciled") != "lookup" || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the retry: %v", r)
		}
		if j := g.job(t, job); len(j.Attempts) != 1 || j.Attempts[0].State != "succeeded" ||
			j.Attempts[0].Reconciled == nil || *j.Attempts[0].Reconciled != "lookup" || j.Version != 2 {
			t.Errorf("job %+v", j)
		}
		if effects, lookups := u.counts(job); effects != 1 || lookups != 1 {
			t.Errorf("%d side effects, %d lookups; want 1 and 1", effects, lookups)
		}
	})
}

// TestLookupOneReconcilerPerAttempt: three instances share the ledger and
// each runs its reconciler; a slow lookup that answers 503 twice is never
// run by two of them at once, and every lookup is recorded once.
func TestLookupOneReconcilerPerAttempt(t *testing.T) {
	shared(t, func(t *testing.T, b backend) {
		u := newRecordsUpstream(t, func(int) (bool, time.Duration) { return true, 3 * time.Second })
		u.hold = 150 * time.Millisecond
		gs := fleet(t, b, 3, lookupSite(u.addr()))
		first := gs[0].post(t, "/charges", "lo-1", auth, `{}`)
		job := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout || job == "" {
			t.Fatalf("first: %v", first)
		}
		u.mu.Lock()
		u.busy[job] = 2
		u.mu.Unlock()
		eventually(t, "a lookup completes the job", func() bool { return gs[1].job(t, job).State == "completed" })
		j := gs[2].job(t, job)
		_, lookups := u.counts(job)
		u.mu.Lock()
		overlap := u.overlap
		u.mu.Unlock()
		if overlap != 1 || lookups != 3 || j.Attempts[0].Reconcile == nil || j.Attempts[0].Reconcile.Tries != 3 {
			t.Errorf("%d lookups, at most %d at once, attempt %+v; want 3, 1 and 3 tries", lookups, overlap, j.Attempts[0])
		}
		var total float64
		for _, g := range gs {
			for _, result := range []string{"pending", "completed"} {
				total += g.metricValue(t, `caddy_idempotency_reconciled_total{provider="payments",result="`+result+`",scope="srv0"}`)
			}
		}
		if total != 3 {
			t.Errorf("the instances counted %v lookups, want 3", total)
		}
	})
}

// TestLookupOnlyOfItsOwnRoute: two routes share a ledger and both call
// their provider api, but they are different upstreams and only route b's
// has a lookup. Route a's charge acted and answered too late (unknown);
// route b's reconciler, whose upstream never saw that job and would answer
// absent, never looks it up: the job stays unknown and its retry gets 409,
// never a second charge. Route b's own unknown job is looked up twice (a
// 503, then the 404 that fails it), so by then a whole round of lookups
// ran while route a's job was due.
func TestLookupOnlyOfItsOwnRoute(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		ua := newRecordsUpstream(t, func(int) (bool, time.Duration) { return true, 3 * time.Second })
		ub := newRecordsUpstream(t, func(int) (bool, time.Duration) { return false, 3 * time.Second })
		// route is a route whose provider api is at addr; only route b
		// has a lookup and so a reconciler.
		route := func(path, addr string, lookup bool) string {
			reconcile, lookupLine := "", ""
			if lookup {
				reconcile = "reconcile_every 100ms"
				lookupLine = "lookup GET /records/{idempotency.job_id} {\n\t\t\t\t\tabsent 404\n\t\t\t\t}"
			}
			return fmt.Sprintf(`	route %s {
		idempotency {
			{ledger}
			attempt_timeout 300ms
			attempt_deadline 2s
			%s
			provider api {
				%s
				reverse_proxy %s
			}
		}
	}
`, path, reconcile, lookupLine, addr)
		}
		g := startGateway(t, b, route("/a/*", ua.addr(), false)+route("/b/*", ub.addr(), true))

		first := g.post(t, "/a/charges", "scoped-1", auth, `{}`)
		jobA := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout || jobA == "" {
			t.Fatalf("route a: %v", first)
		}
		other := g.post(t, "/b/charges", "scoped-2", auth, `{}`)
		jobB := other.header.Get("Idempotency-Job-Id")
		if other.status != http.StatusGatewayTimeout || jobB == "" {
			t.Fatalf("route b: %v", other)
		}
		ub.mu.Lock()
		ub.busy[jobB] = 1
		ub.mu.Unlock()
		eventually(t, "route b's lookup fails its own job", func() bool { return g.job(t, jobB).State == "failed" })

		if _, lookups := ub.counts(jobA); lookups != 0 {
			t.Errorf("route b's upstream was asked %d times about route a's job", lookups)
		}
		if j := g.job(t, jobA); j.State != "unknown" || j.Attempts[0].Reconcile != nil {
			t.Errorf("route a's job: %+v, want unknown, never looked up", j)
		}
		if r := g.post(t, "/a/charges", "scoped-1", auth, `{}`); r.status != http.StatusConflict {
			t.Errorf("route a's retry: %v, want 409", r)
		}
		if effects, _ := ua.counts(jobA); effects != 1 {
			t.Errorf("route a's upstream acted %d times, want once", effects)
		}
	})
}
