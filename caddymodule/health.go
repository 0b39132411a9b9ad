package caddymodule

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// What an operator watches of each open ledger: its jobs by state (the
// unknown ones above all, which only a person or reconciliation settles),
// whether its change listener is connected, whether its sweeper keeps up,
// and how many reads its waiters made. The metrics read it at every scrape and the jobs page through
// GET /idempotency/counts; counting may scan the ledger, so it runs at most
// once every countEvery per open ledger, however many scrapes and pages ask.

// countEvery is how long a ledger's count is reused; healthNow is the
// clock it is judged by (and the sweeper's lag).
var (
	countEvery = 5 * time.Second
	healthNow  = time.Now
)

// countTimeout bounds one count, so that a scrape or a page never waits
// longer for a ledger that does not answer.
const countTimeout = 5 * time.Second

// health is the health state kept beside one open ledger.
type health struct {
	// kind names the ledger's module (the pool key up to its first NUL:
	// "postgres", "redis", "file", "memory"): the metrics' bounded label,
	// never the store's address.
	kind    string
	started time.Time
	sweptAt atomic.Int64 // Unix nanoseconds of the last whole sweep; 0: none yet

	countMu  sync.Mutex
	counted  time.Time // by healthNow; zero: never
	count    ledger.Counts
	countErr error
}

func newHealth(key string) health {
	kind, _, _ := strings.Cut(key, "\x00")
	return health{kind: kind, started: healthNow()}
}

// swept records that the sweeper completed a pass.
func (h *health) swept() { h.sweptAt.Store(healthNow().UnixNano()) }

// sweepLag is how long ago the sweeper last completed a pass (or, before
// its first, how long ago the ledger was opened).
func (h *health) sweepLag() time.Duration {
	last := h.started
	if n := h.sweptAt.Load(); n != 0 {
		last = time.Unix(0, n)
	}
	return max(healthNow().Sub(last), 0)
}

// counts returns the ledger's jobs by state, counted at most once every
// countEvery (a failure too is kept that long, so that a ledger that does
// not answer is not asked at every scrape), with the time it was counted;
// ok is false when the ledger cannot count (it is no ledger.Counter).
func (s *shared) counts(ctx context.Context) (c ledger.Counts, at time.Time, ok bool, err error) {
	counter, ok := s.Ledger.(ledger.Counter)
	if !ok {
		return ledger.Counts{}, time.Time{}, false, nil
	}
	h := &s.health
	h.countMu.Lock()
	defer h.countMu.Unlock()
	if h.counted.IsZero() || healthNow().Sub(h.counted) >= countEvery {
		cctx, cancel := context.WithTimeout(ctx, countTimeout)
		h.count, h.countErr = counter.Counts(cctx)
		cancel()
		h.counted = healthNow()
	}
	return h.count.Clone(), h.counted, true, h.countErr
}

// oldestUnknownAge is the age of the oldest unknown job now: its age by
// the ledger's clock at the count, plus the time since the count.
func oldestUnknownAge(c ledger.Counts, at time.Time) time.Duration {
	if c.OldestUnknown.IsZero() {
		return 0
	}
	return c.OldestUnknownAge() + max(healthNow().Sub(at), 0)
}

// holdOpenLedgers returns every ledger open in this process, each held
// until release is called, so that a config unloaded meanwhile cannot close
// one under its caller; failed hears the errors of the releases.
func holdOpenLedgers(failed func(error)) (ls []*shared, release func()) {
	var keys []any
	ledgers.Range(func(key, _ any) bool {
		keys = append(keys, key)
		return true
	})
	held := make([]any, 0, len(keys))
	for _, key := range keys {
		// The ledger may have closed since Range: then take nothing.
		v, _, err := ledgers.LoadOrNew(key, func() (caddy.Destructor, error) {
			return nil, errLedgerClosed
		})
		if err != nil {
			continue
		}
		held = append(held, key)
		if s, ok := v.(*shared); ok {
			ls = append(ls, s)
		}
	}
	return ls, func() {
		for _, key := range held {
			if _, err := ledgers.Delete(key); err != nil {
				failed(err)
			}
		}
	}
}

// ledgerCollector exports the health of the open ledgers at each scrape,
// by ledger module: several open stores of one module (two PostgreSQL
// databases) add up their jobs and show the worst of their health.
type ledgerCollector struct {
	jobs, oldestUnknown, listenerUp, sweepLag, waitReads *prometheus.Desc
}

func newLedgerCollector() *ledgerCollector {
	name := func(n string) string { return prometheus.BuildFQName(metricsNamespace, metricsSubsystem, n) }
	return &ledgerCollector{
		jobs: prometheus.NewDesc(name("jobs"),
			"Jobs in the open ledgers by ledger module and state (pending, unknown, completed, failed), leases applied, "+
				"expired jobs left out; counted at most every few seconds.",
			[]string{"ledger", "state"}, nil),
		oldestUnknown: prometheus.NewDesc(name("oldest_unknown_seconds"),
			"Age of the oldest unknown job (since it was created) by ledger module; 0 when no job is unknown.",
			[]string{"ledger"}, nil),
		listenerUp: prometheus.NewDesc(name("ledger_listener_up"),
			"1 while the ledger's change listener (PostgreSQL LISTEN, Redis subscription) can wake waiters, "+
				"0 while its connection is lost, by ledger module; only for ledgers that have one.",
			[]string{"ledger"}, nil),
		sweepLag: prometheus.NewDesc(name("ledger_sweep_lag_seconds"),
			"Time since the ledger's sweeper last completed a pass (expired leases recorded, expired jobs removed), "+
				"by ledger module; it runs every 10s.",
			[]string{"ledger"}, nil),
		waitReads: prometheus.NewDesc(name("ledger_wait_reads_total"),
			"Reads of jobs the ledger made for requests waiting on a job in flight, by ledger module: the waiters of "+
				"one job on one instance share a read, so one change costs one read however many duplicates wait; "+
				"only for ledgers that share them (PostgreSQL, Redis).",
			[]string{"ledger"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ledgerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.jobs
	ch <- c.oldestUnknown
	ch <- c.listenerUp
	ch <- c.sweepLag
	ch <- c.waitReads
}

// Collect implements prometheus.Collector. A ledger whose count fails has
// no jobs series in that scrape (alert on their absence), and its health
// series all the same.
func (c *ledgerCollector) Collect(ch chan<- prometheus.Metric) {
	ls, release := holdOpenLedgers(func(error) {})
	defer release()
	type kind struct {
		counted       bool
		failed        bool
		jobs          ledger.Counts
		oldest        time.Duration
		hasListener   bool
		listenerUp    bool
		sweepLag      time.Duration
		sweepLagKnown bool
		hasWaitReads  bool
		waitReads     uint64
	}
	kinds := make(map[string]*kind)
	var order []string
	for _, s := range ls {
		k := kinds[s.kind]
		if k == nil {
			k = &kind{listenerUp: true}
			kinds[s.kind] = k
			order = append(order, s.kind)
		}
		counts, at, ok, err := s.counts(context.Background())
		switch {
		case !ok:
		case err != nil:
			k.failed = true
		default:
			k.counted = true
			k.jobs.Merge(counts)
			k.oldest = max(k.oldest, oldestUnknownAge(counts, at))
		}
		if l, ok := s.Ledger.(ledger.Listener); ok {
			k.hasListener = true
			k.listenerUp = k.listenerUp && l.ListenerUp()
		}
		if r, ok := s.Ledger.(ledger.WaitReader); ok {
			k.hasWaitReads = true
			k.waitReads += r.WaitReads()
		}
		k.sweepLag = max(k.sweepLag, s.sweepLag())
	}
	for _, name := range order {
		k := kinds[name]
		if k.counted && !k.failed {
			for _, st := range ledger.JobStates {
				ch <- prometheus.MustNewConstMetric(c.jobs, prometheus.GaugeValue, float64(k.jobs.ByState[st]), name, string(st))
			}
			ch <- prometheus.MustNewConstMetric(c.oldestUnknown, prometheus.GaugeValue, k.oldest.Seconds(), name)
		}
		if k.hasListener {
			up := 0.0
			if k.listenerUp {
				up = 1
			}
			ch <- prometheus.MustNewConstMetric(c.listenerUp, prometheus.GaugeValue, up, name)
		}
		ch <- prometheus.MustNewConstMetric(c.sweepLag, prometheus.GaugeValue, k.sweepLag.Seconds(), name)
		if k.hasWaitReads {
			ch <- prometheus.MustNewConstMetric(c.waitReads, prometheus.CounterValue, float64(k.waitReads), name)
		}
	}
}

// adminCountsPath answers the jobs of every open ledger by state.
const adminCountsPath = "/idempotency/counts"

// countsJSON is the answer of GET /idempotency/counts: the jobs of every
// open ledger that can count them, by state (the one to act on first
// first), the oldest unknown job's creation and age, and whether a count
// covers only part of its ledger so far.
type countsJSON struct {
	Counts struct {
		Unknown   int64 `json:"unknown"`
		Pending   int64 `json:"pending"`
		Failed    int64 `json:"failed"`
		Completed int64 `json:"completed"`
	} `json:"counts"`
	OldestUnknown           *string `json:"oldest_unknown"`
	OldestUnknownAgeSeconds float64 `json:"oldest_unknown_age_seconds"`
	Partial                 bool    `json:"partial"`
}

// handleCounts serves GET /idempotency/counts.
func (a *adminAPI) handleCounts(w http.ResponseWriter, r *http.Request) error {
	if !allowMethod(w, r, http.MethodGet) {
		return nil
	}
	ls, release := holdOpenLedgers(func(err error) { a.log().Error("closing ledger", zap.Error(err)) })
	defer release()
	var (
		sum    ledger.Counts
		oldest time.Duration
	)
	for _, s := range ls {
		c, at, ok, err := s.counts(r.Context())
		if err != nil {
			a.unavailable(w, err, "")
			return nil
		}
		if ok {
			sum.Merge(c)
			oldest = max(oldest, oldestUnknownAge(c, at))
		}
	}
	var out countsJSON
	out.Counts.Unknown = sum.ByState[ledger.JobUnknown]
	out.Counts.Pending = sum.ByState[ledger.JobPending]
	out.Counts.Failed = sum.ByState[ledger.JobFailed]
	out.Counts.Completed = sum.ByState[ledger.JobCompleted]
	out.OldestUnknown = timeJSON(sum.OldestUnknown)
	out.OldestUnknownAgeSeconds = oldest.Seconds()
	out.Partial = sum.Partial
	writeJSON(w, http.StatusOK, out)
	return nil
}

// Interface guards
var _ prometheus.Collector = (*ledgerCollector)(nil)
