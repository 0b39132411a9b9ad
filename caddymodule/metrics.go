package caddymodule

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onejob/onejob/proxy"
)

// metrics are the gateway's Prometheus collectors (docs/contract.md, section
// 10; the list in docs/operations.md), as one
// handler counts into them. Labels are bounded: outcomes, the scopes of the
// configured handlers, providers named in the config, attempt results,
// ledger operations, ledger modules and job states; never a key, an owner
// or a store's address.
type metrics struct {
	// scope is the handler's: the provider metrics carry it, so that
	// providers of the same name in two handlers are two series.
	scope string

	requests   *prometheus.CounterVec
	attempts   *prometheus.CounterVec
	racesLost  prometheus.Counter
	inFlight   prometheus.Gauge
	ledgerOps  *prometheus.HistogramVec
	repeats    *prometheus.CounterVec
	probeOK    *prometheus.GaugeVec
	reconciled *prometheus.CounterVec

	// The children of the labels known in advance, looked up once: a
	// lookup by label values hashes them on every request.
	requestsBy  map[string]prometheus.Counter
	ledgerOpsBy map[string]prometheus.Observer
}

var (
	requestOutcomes = []string{"new", "replayed", "waited", "conflict", "mismatch", "unknown", "rejected"}
	ledgerOpNames   = []string{"reserve", "complete", "fail", "mark_unknown", "hedge", "save_body", "unsent"}
)

const (
	metricsNamespace = "caddy"
	metricsSubsystem = "idempotency"
)

// ledgerBuckets span an in-memory operation (microseconds) to a slow
// database round trip (seconds).
var ledgerBuckets = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10}

// newMetrics registers the collectors on reg, or reuses the ones already
// registered there: every handler calls it in Provision, and several
// handlers (and the configs of a reload) share one registry. The handler's
// scope labels its provider metrics.
func newMetrics(reg prometheus.Registerer, scope string) (*metrics, error) {
	m := metrics{scope: scope}
	r := registrar{reg: reg}
	m.requests = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total",
		"Ledgered requests by outcome: new, replayed, waited, conflict, mismatch, unknown, rejected.")),
		[]string{"outcome"}))
	m.attempts = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts(opts("attempts_total",
		"Finished attempts by handler scope, provider and result: succeeded, lost, failed, unknown.")),
		[]string{"scope", "provider", "result"}))
	m.racesLost = register(&r, prometheus.NewCounter(prometheus.CounterOpts(opts("races_lost_total",
		"Results discarded because another result had already won the job."))))
	m.inFlight = register(&r, prometheus.NewGauge(prometheus.GaugeOpts(opts("in_flight",
		"Attempts running now."))))
	m.ledgerOps = register(&r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: "ledger_seconds",
		Help: "Duration of ledger operations, by operation.", Buckets: ledgerBuckets,
	}, []string{"operation"}))
	m.repeats = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts(opts("ledger_repeats_total",
		"Ledger operations sent again because their reply did not come, by operation.")),
		[]string{"operation"}))
	m.probeOK = register(&r, prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("probe_ok",
		"1 when the provider's latest probe passed the contract, 0 when it failed, by handler scope and provider.")),
		[]string{"scope", "provider"}))
	m.reconciled = register(&r, prometheus.NewCounterVec(prometheus.CounterOpts(opts("reconciled_total",
		"Lookups of unknown attempts by handler scope, provider and result: completed, failed, pending, error.")),
		[]string{"scope", "provider", "result"}))
	// The open ledgers' jobs and health (health.go), read at each scrape.
	register(&r, newLedgerCollector())
	if r.err != nil {
		return nil, r.err
	}
	m.requestsBy = make(map[string]prometheus.Counter, len(requestOutcomes))
	for _, o := range requestOutcomes {
		m.requestsBy[o] = m.requests.WithLabelValues(o)
	}
	m.ledgerOpsBy = make(map[string]prometheus.Observer, len(ledgerOpNames))
	for _, op := range ledgerOpNames {
		m.ledgerOpsBy[op] = m.ledgerOps.WithLabelValues(op)
	}
	return &m, nil
}

// Reconciled counts one lookup of an unknown attempt by its result.
func (m *metrics) Reconciled(provider, result string) {
	m.reconciled.WithLabelValues(m.scope, provider, result).Inc()
}

// Probe records a provider's latest probe result.
func (m *metrics) Probe(provider string, ok bool) {
	v := 0.0
	if ok {
		v = 1
	}
	m.probeOK.WithLabelValues(m.scope, provider).Set(v)
}

// opts names one of the gateway's metrics: caddy_idempotency_<name>.
func opts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: metricsNamespace, Subsystem: metricsSubsystem, Name: name, Help: help}
}

// registrar registers collectors on reg until one fails; err is the
// first failure.
type registrar struct {
	reg prometheus.Registerer
	err error
}

// register registers c with r (see registerOrExisting) and returns the
// collector to use; after a failure it registers nothing more.
func register[T prometheus.Collector](r *registrar, c T) T {
	if r.err != nil {
		return c
	}
	c, r.err = registerOrExisting(r.reg, c)
	return c
}

// registerOrExisting registers c on reg, or returns the equal collector
// already registered there.
func registerOrExisting[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if !errors.As(err, &are) {
		return c, fmt.Errorf("registering metrics: %w", err)
	}
	existing, ok := are.ExistingCollector.(T)
	if !ok {
		return c, fmt.Errorf("registering metrics: existing collector is a %T, not a %T", are.ExistingCollector, c)
	}
	return existing, nil
}

// Request implements proxy.Observer.
func (m *metrics) Request(outcome string) {
	if c, ok := m.requestsBy[outcome]; ok {
		c.Inc()
		return
	}
	m.requests.WithLabelValues(outcome).Inc()
}

// Attempt implements proxy.Observer.
func (m *metrics) Attempt(provider, result string) {
	m.attempts.WithLabelValues(m.scope, provider, result).Inc()
}

// RaceLost implements proxy.Observer.
func (m *metrics) RaceLost() { m.racesLost.Inc() }

// InFlight implements proxy.Observer.
func (m *metrics) InFlight(delta int) { m.inFlight.Add(float64(delta)) }

// LedgerOp implements proxy.Observer.
func (m *metrics) LedgerOp(op string, d time.Duration) {
	if o, ok := m.ledgerOpsBy[op]; ok {
		o.Observe(d.Seconds())
		return
	}
	m.ledgerOps.WithLabelValues(op).Observe(d.Seconds())
}

// LedgerRepeat implements proxy.Observer.
func (m *metrics) LedgerRepeat(op string) { m.repeats.WithLabelValues(op).Inc() }

// Interface guards
var _ proxy.Observer = (*metrics)(nil)
