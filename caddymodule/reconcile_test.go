package caddymodule

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/proxy"
)

// unknownJob reserves a job on provider "pay" whose attempt timed out.
func unknownJob(t *testing.T, l ledger.Ledger) ledger.Reservation {
	t.Helper()
	return unknownJobIn(t, l, "")
}

// unknownJobIn is unknownJob with the attempt sent under scope.
func unknownJobIn(t *testing.T, l ledger.Ledger, scope string) ledger.Reservation {
	t.Helper()
	p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte(ledger.NewID()),
		Fingerprint: []byte("f"), FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("pay", time.Minute)}
	p.Attempt.Scope = scope
	r, err := l.Reserve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.MarkUnknown(context.Background(), r.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	return r
}

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
	rc := &reconciler{ledger: l, providers: []*Provider{p}, every: 10 * time.Second, timeout: time.Second, max: 1 << 20,
		found: mw.Found, metrics: obs, logger: zap.NewNop()}

	pending, absent, found := unknownJob(t, l), unknownJob(t, l), unknownJob(t, l)
	uri := func(r ledger.Reservation) string { return "/charges/" + r.Job.ID + "/1" }
	status[uri(pending)], status[uri(absent)], status[uri(found)] = 503, 404, 201

	rc.round(context.Background())
	if len(uris) != 0 {
		t.Fatalf("lookups before attempt_deadline: %v", uris)
	}
	clock.add(time.Minute)
	rc.round(context.Background())
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
	rc.round(context.Background())
	clock.add(10 * time.Second)
	rc.round(context.Background())
	if len(uris) != 4 || uris[3] != uri(pending) {
		t.Errorf("lookups after the backoff: %v", uris)
	}
	for result, want := range map[string]float64{"pending": 2, "failed": 1, "completed": 1} {
		if got := testutil.ToFloat64(obs.reconciled.WithLabelValues("s", "pay", result)); got != want {
			t.Errorf("reconciled_total{result=%q} = %v, want %v", result, got, want)
		}
	}
}

// TestReconcilerLooksUpOnlyItsScope: two handlers on one ledger both call
// their provider "pay"; a reconciler asks its own "pay" only about its own
// handler's attempts, never about the other handler's, nor about one
// recorded without a scope, whose upstream it cannot know.
func TestReconcilerLooksUpOnlyItsScope(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)}
	l := memory.New(memory.WithClock(clock.now))
	var looked []string
	p := &Provider{Name: "pay", Lookup: &LookupConfig{Method: "GET", URI: "/charges/{idempotency.job_id}"}}
	p.handler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		looked = append(looked, r.RequestURI)
		w.WriteHeader(http.StatusNotFound)
		return nil
	})
	obs, err := newMetrics(prometheus.NewRegistry(), "site")
	if err != nil {
		t.Fatal(err)
	}
	rc := &reconciler{ledger: l, scope: "site", providers: []*Provider{p}, every: 10 * time.Second, timeout: time.Second,
		max: 1 << 20, metrics: obs, logger: zap.NewNop()}

	mine, theirs, unscoped := unknownJobIn(t, l, "site"), unknownJobIn(t, l, "site#2"), unknownJobIn(t, l, "")
	clock.add(time.Minute)
	rc.round(context.Background())
	if want := []string{"/charges/" + mine.Job.ID}; !slices.Equal(looked, want) {
		t.Errorf("looked up %v, want %v", looked, want)
	}
	for name, r := range map[string]ledger.Reservation{"site#2": theirs, "unscoped": unscoped} {
		if j, _ := l.Job(context.Background(), r.Job.ID); j.State != ledger.JobUnknown || j.Attempts[0].Lookup != nil {
			t.Errorf("the %s job: %s, lookups %+v; want unknown, never looked up", name, j.State, j.Attempts[0].Lookup)
		}
	}
}

func TestLookupBackoff(t *testing.T) {
	for tries, want := range map[int]time.Duration{0: 30 * time.Second, 1: time.Minute, 3: 4 * time.Minute, 7: time.Hour, 100: time.Hour} {
		if got := lookupBackoff(30*time.Second, tries); got != want {
			t.Errorf("backoff after %d tries: %v, want %v", tries, got, want)
		}
	}
}

// blackHole is a ledger whose link swallows the calls named in hole: they
// never answer, until their context ends.
type blackHole struct {
	ledger.Ledger
	hole string
}

func (b *blackHole) swallow(ctx context.Context, op string) error {
	if op != b.hole {
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}

func (b *blackHole) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	if err := b.swallow(ctx, "jobs"); err != nil {
		return ledger.JobPage{}, err
	}
	return b.Ledger.Jobs(ctx, q)
}

func (b *blackHole) Job(ctx context.Context, id string) (*ledger.Job, error) {
	if err := b.swallow(ctx, "job"); err != nil {
		return nil, err
	}
	return b.Ledger.Job(ctx, id)
}

func (b *blackHole) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	if err := b.swallow(ctx, "claim"); err != nil {
		return nil, err
	}
	return b.Ledger.ClaimLookup(ctx, ref, holder, lease)
}

func (b *blackHole) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	if err := b.swallow(ctx, "settle"); err != nil {
		return nil, err
	}
	return b.Ledger.SettleLookup(ctx, ref, holder, r)
}

// TestReconcilerLedgerCallsAreBounded: a ledger link that black-holes any
// one of the reconciler's calls does not hold its round forever (on the
// virtual clock of synctest, where a round that never ends is a deadlock);
// the attempt stays unknown for a later round. With no hole, the same round
// settles it: the setup reaches every call.
func TestReconcilerLedgerCallsAreBounded(t *testing.T) {
	for _, hole := range []string{"", "jobs", "job", "claim", "settle"} {
		t.Run("hole="+hole, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				mem := memory.New()
				r := unknownJob(t, mem)
				time.Sleep(2 * time.Minute) // past the attempt's deadline
				looked := 0
				p := &Provider{Name: "pay", Lookup: &LookupConfig{Method: "GET", URI: "/charges/{idempotency.job_id}"}}
				p.handler = caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
					looked++
					w.WriteHeader(http.StatusNotFound)
					return nil
				})
				obs, err := newMetrics(prometheus.NewRegistry(), "s")
				if err != nil {
					t.Fatal(err)
				}
				l := &blackHole{Ledger: mem, hole: hole}
				rc := &reconciler{ledger: l, providers: []*Provider{p}, every: 10 * time.Second, timeout: time.Second,
					max: 1 << 20, found: func(int, http.Header, []byte) *ledger.Response { return nil }, metrics: obs, logger: zap.NewNop()}
				if hole == "job" {
					rc.job(context.Background(), p, &ledger.Job{ID: r.Job.ID}) // a listing without attempts
				} else {
					rc.round(context.Background())
				}
				j, err := mem.Job(context.Background(), r.Job.ID)
				if err != nil {
					t.Fatal(err)
				}
				want, wantLooked := ledger.JobUnknown, 0
				switch hole {
				case "":
					want, wantLooked = ledger.JobFailed, 1
				case "settle":
					wantLooked = 1
				}
				if j.State != want || looked != wantLooked {
					t.Errorf("job %s after %d lookups, want %s after %d", j.State, looked, want, wantLooked)
				}
			})
		})
	}
}
