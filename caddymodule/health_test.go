package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// testClock is a clock a test moves by hand.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *testClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// useClock makes clk the clock of the ledgers' health for the test.
func useClock(t *testing.T, clk *testClock) {
	old := healthNow
	healthNow = clk.now
	t.Cleanup(func() { healthNow = old })
}

// listening is a memory ledger with a change listener the test connects
// and disconnects, and a count it can make fail.
type listening struct {
	*memory.Ledger
	mu   sync.Mutex
	up   bool
	fail bool
	asks int // Counts calls
}

func (l *listening) ListenerUp() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.up
}

func (l *listening) set(up, fail bool) {
	l.mu.Lock()
	l.up, l.fail = up, fail
	l.mu.Unlock()
}

func (l *listening) Counts(ctx context.Context) (ledger.Counts, error) {
	l.mu.Lock()
	l.asks++
	fail := l.fail
	l.mu.Unlock()
	if fail {
		return ledger.Counts{}, errors.New("connection refused")
	}
	return l.Ledger.Counts(ctx)
}

// putKindLedger puts l in the process's pool as a ledger of module kind
// would be, and returns it as the pool holds it.
func putKindLedger(t *testing.T, kind string, l ledger.Ledger) *shared {
	t.Helper()
	key := kind + "\x00" + ledger.NewID()
	v, _, err := ledgers.LoadOrNew(key, func() (caddy.Destructor, error) {
		return newShared(key, l, zap.NewNop()), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := ledgers.Delete(key); err != nil {
			t.Error(err)
		}
	})
	return v.(*shared)
}

// ledgerSeries gathers reg and returns the health series of ledger module
// kind, as "name{labels} value" lines, sorted.
func ledgerSeries(t *testing.T, reg *prometheus.Registry, kind string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels, mine := "", false
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "ledger" {
					mine = lp.GetValue() == kind
					continue
				}
				labels += lp.GetName() + "=" + lp.GetValue()
			}
			if mine {
				lines = append(lines, fmt.Sprintf("%s{%s} %g", mf.GetName(), labels, m.GetGauge().GetValue()))
			}
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestLedgerHealthMetrics: the jobs of an open ledger by state, the age of
// its oldest unknown job, its listener and its sweeper's lag are exported,
// and the ledger is counted at most once every countEvery, however often
// it is scraped.
func TestLedgerHealthMetrics(t *testing.T) {
	clk := &testClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	useClock(t, clk)
	l := &listening{Ledger: memory.New(memory.WithClock(clk.now)), up: true}
	s := putKindLedger(t, "healthtest", l)
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg, "srv0"); err != nil {
		t.Fatal(err)
	}

	reserveUnknown(t, l, "order-1", "timeout")
	done := reserve(t, l, "order-2", "primary")
	complete(t, l, done.Attempt, `{"ok":true}`)
	clk.add(90 * time.Second)

	want := `caddy_idempotency_jobs{state=completed} 1
caddy_idempotency_jobs{state=failed} 0
caddy_idempotency_jobs{state=pending} 0
caddy_idempotency_jobs{state=unknown} 1
caddy_idempotency_ledger_listener_up{} 1
caddy_idempotency_ledger_sweep_lag_seconds{} 90
caddy_idempotency_oldest_unknown_seconds{} 90`
	if got := ledgerSeries(t, reg, "healthtest"); got != want {
		t.Errorf("series:\n%s\nwant:\n%s", got, want)
	}

	// Within countEvery the count is reused: a new unknown job is not seen
	// yet, and the ledger is not asked again; the ages move on.
	reserveUnknown(t, l, "order-3", "connection reset")
	s.swept()
	l.set(false, false)
	clk.add(countEvery / 2)
	want = fmt.Sprintf(`caddy_idempotency_jobs{state=completed} 1
caddy_idempotency_jobs{state=failed} 0
caddy_idempotency_jobs{state=pending} 0
caddy_idempotency_jobs{state=unknown} 1
caddy_idempotency_ledger_listener_up{} 0
caddy_idempotency_ledger_sweep_lag_seconds{} %g
caddy_idempotency_oldest_unknown_seconds{} %g`, (countEvery / 2).Seconds(), (90*time.Second + countEvery/2).Seconds())
	if got := ledgerSeries(t, reg, "healthtest"); got != want {
		t.Errorf("series within countEvery:\n%s\nwant:\n%s", got, want)
	}
	if l.asks != 1 {
		t.Errorf("the ledger was counted %d times in two scrapes within countEvery, want 1", l.asks)
	}

	clk.add(countEvery)
	if got := ledgerSeries(t, reg, "healthtest"); !strings.Contains(got, "caddy_idempotency_jobs{state=unknown} 2") {
		t.Errorf("after countEvery, the new unknown job is not counted:\n%s", got)
	}

	// A ledger that cannot count has no jobs series (their absence is the
	// alert), and keeps its health series.
	l.set(true, true)
	clk.add(countEvery)
	want = fmt.Sprintf(`caddy_idempotency_ledger_listener_up{} 1
caddy_idempotency_ledger_sweep_lag_seconds{} %g`, (countEvery/2 + 2*countEvery).Seconds())
	if got := ledgerSeries(t, reg, "healthtest"); got != want {
		t.Errorf("series of a ledger whose count fails:\n%s\nwant:\n%s", got, want)
	}
}

// TestAdminCounts: GET /idempotency/counts answers the jobs by state of
// every open ledger, and the oldest unknown job.
func TestAdminCounts(t *testing.T) {
	clk := &testClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	useClock(t, clk)
	first := memory.New(memory.WithClock(clk.now))
	putKindLedger(t, "countstest", first)
	reserveUnknown(t, first, "a", "timeout")
	reserve(t, first, "b", "primary") // pending: its lease lasts a minute
	clk.add(30 * time.Second)
	second := memory.New(memory.WithClock(clk.now))
	putKindLedger(t, "countstest", second)
	reserveUnknown(t, second, "c", "timeout")
	done := reserve(t, second, "d", "primary")
	complete(t, second, done.Attempt, "{}")
	clk.add(20 * time.Second)

	w := do(t, adminMux(t), http.MethodGet, "/idempotency/counts", "")
	got := decode[countsJSON](t, w, http.StatusOK)
	if c := got.Counts; c.Unknown != 2 || c.Pending != 1 || c.Failed != 0 || c.Completed != 1 {
		t.Errorf("counts %+v", c)
	}
	if got.OldestUnknown == nil || *got.OldestUnknown != "2026-03-01T12:00:00Z" || got.OldestUnknownAgeSeconds != 50 || got.Partial {
		t.Errorf("oldest unknown %v, age %v, partial %v", got.OldestUnknown, got.OldestUnknownAgeSeconds, got.Partial)
	}
	if !strings.HasPrefix(w.Body.String(), `{"counts":{"unknown":2,"pending":1,"failed":0,"completed":1},"oldest_unknown":"2026-03-01T12:00:00Z"`) {
		t.Errorf("body %s: not in the documented order", w.Body)
	}
	if w := do(t, adminMux(t), http.MethodPost, "/idempotency/counts", "{}"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", w.Code)
	}
}

// TestSweeperRecordsPass: each pass the sweeper completes resets the lag.
func TestSweeperRecordsPass(t *testing.T) {
	clk := &testClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	useClock(t, clk)
	every := sweepEvery
	sweepEvery = 5 * time.Millisecond
	t.Cleanup(func() { sweepEvery = every })

	s := putKindLedger(t, "sweeptest", memory.New(memory.WithClock(clk.now)))
	clk.add(time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for s.sweepLag() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper's lag is still %v", s.sweepLag())
		}
		time.Sleep(5 * time.Millisecond)
	}
	clk.add(time.Minute)
	if lag := s.sweepLag(); lag > time.Minute {
		t.Errorf("lag %v a minute after a pass", lag)
	}
}

// TestAlertsDocNamesMetrics: every metric docs/alerts.md names is one the
// gateway exports, and every ledger health metric is in it.
func TestAlertsDocNamesMetrics(t *testing.T) {
	raw, err := os.ReadFile("../docs/alerts.md")
	if err != nil {
		t.Fatal(err)
	}
	putKindLedger(t, "alertsdoc", &listening{Ledger: memory.New(), up: true})
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg, "srv0"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, mf := range mfs {
		exported[mf.GetName()] = true
	}
	named := map[string]bool{}
	for _, name := range regexp.MustCompile(`caddy_idempotency_[a-z_]+`).FindAllString(string(raw), -1) {
		named[name] = true
		if !exported[name] {
			t.Errorf("docs/alerts.md names %s, which the gateway does not export", name)
		}
	}
	for _, name := range []string{
		"caddy_idempotency_jobs", "caddy_idempotency_oldest_unknown_seconds",
		"caddy_idempotency_ledger_listener_up", "caddy_idempotency_ledger_sweep_lag_seconds",
	} {
		if !named[name] {
			t.Errorf("docs/alerts.md does not name %s", name)
		}
	}
}

// reading is a memory ledger whose waiters made a given number of reads.
type reading struct {
	*memory.Ledger
	reads uint64
}

func (l *reading) WaitReads() uint64 { return l.reads }

// TestLedgerWaitReadsMetric: the reads made for waiters are exported as a
// counter by ledger module, the open ledgers of one module added up.
func TestLedgerWaitReadsMetric(t *testing.T) {
	putKindLedger(t, "waitreadstest", &reading{Ledger: memory.New(), reads: 3})
	putKindLedger(t, "waitreadstest", &reading{Ledger: memory.New(), reads: 4})
	putKindLedger(t, "nowaitreadstest", memory.New())
	reg := prometheus.NewPedanticRegistry()
	if _, err := newMetrics(reg, "srv0"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "caddy_idempotency_ledger_wait_reads_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "ledger" {
					got[lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	if got["waitreadstest"] != 7 {
		t.Errorf("wait reads of the module = %g, want 7", got["waitreadstest"])
	}
	if _, ok := got["nowaitreadstest"]; ok {
		t.Error("wait reads exported for a ledger that does not count them")
	}
}
