package caddymodule

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onejob/onejob/ledger"
)

// ledgerCollector exports the health of the open ledgers at each scrape,
// by ledger module: several open stores of one module (two PostgreSQL
// databases) add up their jobs and show the worst of their health.
type ledgerCollector struct {
	jobs, oldestUnknown, listenerUp, sweepLag, waitReads *prometheus.Desc
	diskBytes, cacheBytes, cacheHits, cacheMisses, syncs *prometheus.Desc
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
		diskBytes: prometheus.NewDesc(name("ledger_disk_bytes"),
			"Bytes the ledger's files take on the gateway's disk, by ledger module; only for ledgers kept there (file).",
			[]string{"ledger"}, nil),
		cacheBytes: prometheus.NewDesc(name("ledger_cache_bytes"),
			"Memory the ledger holds, its caches and memtables, by ledger module (its bound is cache_size); only for the file ledger.",
			[]string{"ledger"}, nil),
		cacheHits: prometheus.NewDesc(name("ledger_cache_hits_total"),
			"Reads of the ledger's files its cache served, by ledger module; only for the file ledger.",
			[]string{"ledger"}, nil),
		cacheMisses: prometheus.NewDesc(name("ledger_cache_misses_total"),
			"Reads of the ledger's files that went to disk, by ledger module; only for the file ledger.",
			[]string{"ledger"}, nil),
		syncs: prometheus.NewDesc(name("ledger_syncs_total"),
			"Syncs of the ledger's log to disk (fdatasync), which concurrent transitions share, by ledger module; "+
				"only for the file ledger.",
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
	ch <- c.diskBytes
	ch <- c.cacheBytes
	ch <- c.cacheHits
	ch <- c.cacheMisses
	ch <- c.syncs
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
		hasStorage    bool
		storage       ledger.Storage
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
		if r, ok := s.Ledger.(ledger.StorageReporter); ok {
			if st, err := r.Storage(); err == nil {
				k.hasStorage = true
				k.storage.Add(st)
			}
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
		if k.hasStorage {
			ch <- prometheus.MustNewConstMetric(c.diskBytes, prometheus.GaugeValue, float64(k.storage.DiskBytes), name)
			ch <- prometheus.MustNewConstMetric(c.cacheBytes, prometheus.GaugeValue, float64(k.storage.CacheBytes), name)
			ch <- prometheus.MustNewConstMetric(c.cacheHits, prometheus.CounterValue, float64(k.storage.CacheHits), name)
			ch <- prometheus.MustNewConstMetric(c.cacheMisses, prometheus.CounterValue, float64(k.storage.CacheMisses), name)
			ch <- prometheus.MustNewConstMetric(c.syncs, prometheus.CounterValue, float64(k.storage.Syncs), name)
		}
	}
}

// Interface guards
var _ prometheus.Collector = (*ledgerCollector)(nil)
