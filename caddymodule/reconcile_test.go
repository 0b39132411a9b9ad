package caddymodule

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/proxy"
)

// TestReconcilerSettlesByLookup: a lookup runs only after the attempt's
// deadline, with the job id and attempt number in its URI; 503 leaves the
// attempt unknown and backs off; 404 fails it; a 2xx completes the job
// with the lookup's answer, marked; each lookup is counted by result.
func TestReconcilerSettlesByLookup(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	l := memory.New(memory.WithClock(clock.now))
	var (
		mu     sync.Mutex
		status = map[string]int{}
		uris   []string
	)
	p := &Provider{Name: "pay", Lookup: &LookupConfig{Method: "GET", URI: "/charges/{idempotency.job_id}/{idempotency.attempt}"}}
	p.handler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		mu.Lock()
		defer mu.Unlock()
		uris = append(uris, r.RequestURI)
		if r.Header.Get(proxy.HeaderJobID) == "" || r.Header.Get(proxy.HeaderAttempt) != "1" {
			t.Errorf("lookup headers: %v", r.Header)
		}
		code := status[r.RequestURI]
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		w.Write([]byte(`{"charge":"ch_1"}`))
		return nil
	})
	reg := prometheus.NewRegistry()
	obs, err := newMetrics(reg, "s")
	if err != nil {
		t.Fatal(err)
	}
	mw, err := proxy.New(proxy.Config{Ledger: l, NeverStore: []string{"X-Secret"}})
	if err != nil {
		t.Fatal(err)
	}
	rc := mw.Reconciler(lookups([]*Provider{p}, 1<<20))
	rc.Every, rc.Timeout, rc.Reconciled, rc.Logger = 10*time.Second, time.Second, obs.Reconciled, zap.NewNop()

	pending, absent, found := ledgertest.UnknownJob(t, l, ""), ledgertest.UnknownJob(t, l, ""), ledgertest.UnknownJob(t, l, "")
	uri := func(r ledger.Reservation) string { return "/charges/" + r.Job.ID + "/1" }
	status[uri(pending)], status[uri(absent)], status[uri(found)] = 503, 404, 201

	rc.Round(context.Background())
	if len(uris) != 0 {
		t.Fatalf("lookups before attempt_deadline: %v", uris)
	}
	clock.add(time.Minute)
	rc.Round(context.Background())
	if len(uris) != 3 {
		t.Fatalf("lookups after attempt_deadline: %v", uris)
	}

	j, _ := l.Job(context.Background(), pending.Job.ID)
	a := j.Attempts[0].Lookups()
	if j.State != ledger.JobUnknown || a.Tries != 1 || a.LastStatus != 503 || a.NextAt.Sub(a.LastAt) != 10*time.Second {
		t.Errorf("after 503: job %s, lookup %+v", j.State, a)
	}
	j, _ = l.Job(context.Background(), absent.Job.ID)
	if j.State != ledger.JobFailed || j.Attempts[0].Reconciled(j) != "lookup" {
		t.Errorf("after 404: job %s, attempt %+v", j.State, j.Attempts[0])
	}
	j, _ = l.Job(context.Background(), found.Job.ID)
	if j.State != ledger.JobCompleted || j.Response.Status != 201 || string(j.Response.Body) != `{"charge":"ch_1"}` ||
		j.Response.Header[proxy.HeaderReconciled][0] != "lookup" || j.Attempts[0].Reconciled(j) != "lookup" {
		t.Errorf("after 201: job %s, response %+v", j.State, j.Response)
	}

	// Not due again until its backoff ran out; then looked up once more.
	rc.Round(context.Background())
	clock.add(10 * time.Second)
	rc.Round(context.Background())
	if len(uris) != 4 || uris[3] != uri(pending) {
		t.Errorf("lookups after the backoff: %v", uris)
	}
	for result, want := range map[string]float64{"pending": 2, "failed": 1, "completed": 1} {
		if got := testutil.ToFloat64(obs.reconciled.WithLabelValues("s", "pay", result)); got != want {
			t.Errorf("reconciled_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}
