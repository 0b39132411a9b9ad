package caddymodule

import (
	"context"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/onejob/onejob/internal/tick"
	"github.com/onejob/onejob/ledger"
)

// The ledgers and the replay caches are guest modules of the handler, as
// reverse_proxy's transports are of reverse_proxy: each is a Caddy module
// in its own namespace, with its own JSON config and Caddyfile syntax, and
// the handler loads it by name. A third party adds a ledger without
// touching this package, in a package of its own:
//
//	func init() { caddy.RegisterModule(Mine{}) }
//
//	// Mine keeps jobs in ... (its JSON config, documented field by field)
//	type Mine struct {
//		// The server's address.
//		Addr string `json:"addr"`
//
//		caddymodule.LedgerHolder
//	}
//
//	func (Mine) CaddyModule() caddy.ModuleInfo {
//		return caddy.ModuleInfo{ID: "idempotency.ledgers.mine", New: func() caddy.Module { return new(Mine) }}
//	}
//
//	func (m *Mine) Provision(ctx caddy.Context) error {
//		return m.Open(ctx, "mine\x00"+m.Addr, func() (ledger.Ledger, error) { return mine.Open(m.Addr) })
//	}
//
//	// UnmarshalCaddyfile ... Syntax: ledger mine <addr>
//	func (m *Mine) UnmarshalCaddyfile(d *caddyfile.Dispenser) error { ... }
//
// Its ledger passes the conformance suite of package ledger/ledgertest.
// Then `ledger mine <addr>` in a Caddyfile and {"backend": "mine", ...} in
// JSON name it, and the admin API lists its jobs.
// The guest modules' namespaces.
const (
	ledgerNamespace = "idempotency.ledgers"
	cacheNamespace  = "idempotency.caches"
)

// LedgerModule is a ledger backend module (namespace idempotency.ledgers).
// Its ledger is shared by every config that names the same store, and
// outlives config reloads while any attempt still holds it. A module that
// embeds LedgerHolder and calls its Open in Provision is one.
type LedgerModule interface {
	// Ledger returns the provisioned ledger.
	Ledger() ledger.Ledger
	// Hold keeps the ledger open until the returned function is called.
	Hold() func()
}

// ledgers holds the open ledgers of this process, by store.
var ledgers = caddy.NewUsagePool()

// sweepEvery is how often each open ledger records expired leases and
// removes expired jobs, at most sweepBatch jobs per call.
var sweepEvery = 10 * time.Second

const sweepBatch = 1000

// shared is one open ledger in the pool, with its sweeper and what the
// ledger's health metrics read (health.go).
type shared struct {
	ledger.Ledger
	key  string // its pool key
	stop context.CancelFunc
	done chan struct{}

	health
}

// Local reports whether the pooled ledger is local (ledger.Local).
func (s *shared) Local() bool { return ledger.IsLocal(s.Ledger) }

// newShared starts the sweeper of l, the ledger the pool holds under key.
func newShared(key string, l ledger.Ledger, log *zap.Logger) *shared {
	ctx, stop := context.WithCancel(context.Background())
	s := &shared{Ledger: l, key: key, stop: stop, done: make(chan struct{}), health: newHealth(key)}
	go s.sweep(ctx, log, sweepEvery)
	return s
}

func (s *shared) sweep(ctx context.Context, log *zap.Logger, every time.Duration) {
	defer close(s.done)
	tick.Every(ctx, every, func() {
		for {
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			st, err := s.Ledger.Sweep(sctx, sweepBatch)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					log.Error("ledger sweep failed", zap.Error(err))
				}
				return
			}
			if st.Unknown > 0 || st.Removed > 0 {
				log.Info("ledger swept", zap.Int("leases_expired", st.Unknown), zap.Int("jobs_removed", st.Removed))
			}
			if st.Removed < sweepBatch {
				s.swept() // a whole pass: nothing due is left
				return
			}
		}
	})
}

// Destruct stops the sweeper and closes the ledger: the last holder is gone.
func (s *shared) Destruct() error {
	s.stop()
	<-s.done
	return s.Ledger.Close()
}

// LedgerHolder is the part of a ledger module that keeps its ledger in the
// process's pool: one open ledger per store, shared by every config and
// attempt that uses it, closed when the last of them lets go, with a
// sweeper that records expired leases and removes expired jobs. The admin
// API lists the jobs of every ledger in the pool. Embed it and call Open
// in Provision; it provides the module's Ledger, Hold and Cleanup.
type LedgerHolder struct {
	key    string
	shared *shared
}

// Open opens the ledger that open returns, or shares the one already open
// for the same store: key names the store (start it with the module's
// name, then what tells two stores apart, e.g. "postgres\x00"+dsn), and
// open runs only when no config holds that store yet. Call it once, in
// Provision.
func (h *LedgerHolder) Open(ctx caddy.Context, key string, open func() (ledger.Ledger, error)) error {
	log := ctx.Logger()
	v, _, err := ledgers.LoadOrNew(key, func() (caddy.Destructor, error) {
		l, err := open()
		if err != nil {
			return nil, err
		}
		return newShared(key, l, log), nil
	})
	if err != nil {
		return err
	}
	h.key, h.shared = key, v.(*shared)
	return nil
}

// Ledger returns the ledger Open opened.
func (h *LedgerHolder) Ledger() ledger.Ledger { return h.shared }

// poolKey names the ledger's store, for what is kept beside it (a cache).
func (h *LedgerHolder) poolKey() string { return h.key }

// Hold takes one more reference on the ledger, for an attempt that may
// outlive this config, and returns its release.
func (h *LedgerHolder) Hold() func() { return holdPooled(ledgers, h.key) }

// holdPooled takes one more reference on the pool's entry for key, which
// must exist, and returns its release: so an attempt keeps what it uses
// open across a config reload.
func holdPooled(pool *caddy.UsagePool, key string) func() {
	if _, _, err := pool.LoadOrNew(key, func() (caddy.Destructor, error) {
		return nil, fmt.Errorf("%s was closed", key)
	}); err != nil {
		return func() {}
	}
	return func() { pool.Delete(key) }
}

// Cleanup releases this config's hold on the ledger.
func (h *LedgerHolder) Cleanup() error {
	if h.key == "" {
		return nil
	}
	_, err := ledgers.Delete(h.key)
	return err
}

// Interface guards
var (
	_ caddy.Destructor   = (*shared)(nil)
	_ caddy.CleanerUpper = (*LedgerHolder)(nil)
	_ LedgerModule       = (*LedgerHolder)(nil)
)
