package caddymodule

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"

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
