package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestMetricsReuse: provisioning twice on one registry (two handlers, or a
// reload) reuses the registered collectors, and both observers count into
// the same series.
func TestMetricsReuse(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m1, err := newMetrics(reg, "srv0")
	if err != nil {
		t.Fatal(err)
	}
	m2, err := newMetrics(reg, "srv0")
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	if m1.requests != m2.requests || m1.attempts != m2.attempts || m1.racesLost != m2.racesLost ||
		m1.inFlight != m2.inFlight || m1.ledgerOps != m2.ledgerOps {
		t.Fatal("the second newMetrics did not reuse the registered collectors")
	}

	m1.Request("new")
	m2.Request("new")
	m2.Request("replayed")
	m1.Attempt("primary", "succeeded")
	m2.Attempt("primary", "lost")
	m2.RaceLost()
	m1.InFlight(1)
	m2.InFlight(1)
	m1.InFlight(-1)
	m1.LedgerOp("reserve", 2*time.Millisecond)
	m2.LedgerOp("reserve", 3*time.Millisecond)
	m2.LedgerOp("complete", time.Millisecond)

	if got := testutil.ToFloat64(m1.requests.WithLabelValues("new")); got != 2 {
		t.Errorf("requests{outcome=new} = %v, want 2", got)
	}
	if got := testutil.ToFloat64(m1.requests.WithLabelValues("replayed")); got != 1 {
		t.Errorf("requests{outcome=replayed} = %v, want 1", got)
	}

	want := `
# HELP caddy_idempotency_attempts_total Finished attempts by handler scope, provider and result: succeeded, lost, failed, unknown.
# TYPE caddy_idempotency_attempts_total counter
caddy_idempotency_attempts_total{provider="primary",result="lost",scope="srv0"} 1
caddy_idempotency_attempts_total{provider="primary",result="succeeded",scope="srv0"} 1
# HELP caddy_idempotency_in_flight Attempts running now.
# TYPE caddy_idempotency_in_flight gauge
caddy_idempotency_in_flight 1
# HELP caddy_idempotency_races_lost_total Results discarded because another result had already won the job.
# TYPE caddy_idempotency_races_lost_total counter
caddy_idempotency_races_lost_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"caddy_idempotency_attempts_total", "caddy_idempotency_in_flight", "caddy_idempotency_races_lost_total"); err != nil {
		t.Error(err)
	}

	// One histogram series per operation (all of them from the start),
	// with every observation counted.
	if n := testutil.CollectAndCount(m1.ledgerOps); n != len(ledgerOpNames) {
		t.Errorf("ledger_seconds has %d series, want %d (%v)", n, len(ledgerOpNames), ledgerOpNames)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
		if mf.GetName() != "caddy_idempotency_ledger_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			op := m.GetLabel()[0].GetValue()
			want := map[string]uint64{"reserve": 2, "complete": 1}[op]
			if got := m.GetHistogram().GetSampleCount(); got != want {
				t.Errorf("ledger_seconds{operation=%q} count = %d, want %d", op, got, want)
			}
		}
	}
	for _, n := range []string{
		"caddy_idempotency_requests_total", "caddy_idempotency_attempts_total",
		"caddy_idempotency_races_lost_total", "caddy_idempotency_in_flight",
		"caddy_idempotency_ledger_seconds",
	} {
		if !names[n] {
			t.Errorf("metric %s is not gathered", n)
		}
	}

	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}

// TestMetricsConflict: a different collector already holding one of the
// names is an error, not a silent reuse.
func TestMetricsConflict(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "caddy_idempotency_races_lost_total",
		Help: "Something else.",
	}))
	if _, err := newMetrics(reg, "srv0"); err == nil {
		t.Fatal("newMetrics reused a conflicting collector")
	}
}
