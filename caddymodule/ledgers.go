package caddymodule

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/ledger/postgres"
)

func init() {
	caddy.RegisterModule(MemoryLedger{})
	caddy.RegisterModule(FileLedger{})
	caddy.RegisterModule(PostgresLedger{})
}

// LedgerModule is a ledger backend module (namespace idempotency.ledgers).
// Its ledger is shared by every config that names the same store, and
// outlives config reloads while any attempt still holds it.
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

// shared is one open ledger in the pool, with its sweeper.
type shared struct {
	ledger.Ledger
	stop context.CancelFunc
	done chan struct{}
}

func newShared(l ledger.Ledger, log *zap.Logger) *shared {
	ctx, stop := context.WithCancel(context.Background())
	s := &shared{Ledger: l, stop: stop, done: make(chan struct{})}
	go s.sweep(ctx, log, sweepEvery)
	return s
}

func (s *shared) sweep(ctx context.Context, log *zap.Logger, every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for {
			sctx, cancel := context.WithTimeout(ctx, time.Minute)
			st, err := s.Ledger.Sweep(sctx, sweepBatch)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					log.Error("ledger sweep failed", zap.Error(err))
				}
				break
			}
			if st.Unknown > 0 || st.Removed > 0 {
				log.Info("ledger swept", zap.Int("leases_expired", st.Unknown), zap.Int("jobs_removed", st.Removed))
			}
			if st.Removed < sweepBatch {
				break
			}
		}
	}
}

// Destruct stops the sweeper and closes the ledger: the last holder is gone.
func (s *shared) Destruct() error {
	s.stop()
	<-s.done
	return s.Ledger.Close()
}

// holder is the common part of the ledger modules.
type holder struct {
	key    string
	shared *shared
}

func (h *holder) open(key string, ctor func() (ledger.Ledger, error), log *zap.Logger) error {
	v, _, err := ledgers.LoadOrNew(key, func() (caddy.Destructor, error) {
		l, err := ctor()
		if err != nil {
			return nil, err
		}
		return newShared(l, log), nil
	})
	if err != nil {
		return err
	}
	h.key, h.shared = key, v.(*shared)
	return nil
}

func (h *holder) Ledger() ledger.Ledger { return h.shared }

func (h *holder) poolKey() string { return h.key }

func (h *holder) Hold() func() { return holdPooled(ledgers, h.key) }

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
func (h *holder) Cleanup() error {
	if h.key == "" {
		return nil
	}
	_, err := ledgers.Delete(h.key)
	return err
}

// MemoryLedger keeps jobs in process memory: for tests and demos. Jobs
// survive config reloads but not a restart.
type MemoryLedger struct {
	holder
}

// CaddyModule returns the Caddy module information.
func (MemoryLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.memory",
		New: func() caddy.Module { return new(MemoryLedger) },
	}
}

// Provision opens (or shares) the process's memory ledger.
func (m *MemoryLedger) Provision(ctx caddy.Context) error {
	log := ctx.Logger()
	log.Warn("idempotency ledger is in memory: nothing survives a restart")
	return m.open("memory", func() (ledger.Ledger, error) { return memory.New(), nil }, log)
}

// FileLedger keeps jobs in one local file (bbolt): durable across restarts
// with no server to run, for one gateway on one machine. The default.
type FileLedger struct {
	// Path of the ledger file. Default: onejob/ledger.db in Caddy's data
	// directory.
	Path string `json:"path,omitempty"`

	holder
}

// CaddyModule returns the Caddy module information.
func (FileLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.file",
		New: func() caddy.Module { return new(FileLedger) },
	}
}

// Provision opens the file, or shares it with the config being replaced:
// bbolt allows one open per file, so reloads reuse the open database.
func (f *FileLedger) Provision(ctx caddy.Context) error {
	path := caddy.NewReplacer().ReplaceAll(f.Path, "")
	if path == "" {
		path = filepath.Join(caddy.AppDataDir(), "onejob", "ledger.db")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("file ledger: %w", err)
	}
	return f.open("file\x00"+abs, func() (ledger.Ledger, error) {
		return file.Open(abs, file.Options{Timeout: 10 * time.Second})
	}, ctx.Logger())
}

// PostgresLedger keeps jobs in PostgreSQL, shared by many gateway instances.
type PostgresLedger struct {
	// DSN is the PostgreSQL connection string (URL or key=value form).
	// Placeholders such as {env.DATABASE_URL} are expanded.
	DSN string `json:"dsn"`
	// Schema holds the ledger's tables; default "onejob".
	Schema string `json:"schema,omitempty"`

	holder
}

// CaddyModule returns the Caddy module information.
func (PostgresLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.postgres",
		New: func() caddy.Module { return new(PostgresLedger) },
	}
}

// Provision connects (or shares the connection pool) and migrates the schema.
func (p *PostgresLedger) Provision(ctx caddy.Context) error {
	dsn := caddy.NewReplacer().ReplaceAll(p.DSN, "")
	if dsn == "" {
		return fmt.Errorf("postgres ledger: dsn is required")
	}
	schema := p.Schema
	if schema == "" {
		schema = postgres.DefaultSchema
	}
	log := ctx.Logger()
	return p.open("postgres\x00"+dsn+"\x00"+schema, func() (ledger.Ledger, error) {
		octx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return postgres.Open(octx, dsn, postgres.Options{Schema: schema})
	}, log)
}

// Interface guards
var (
	_ caddy.Provisioner  = (*MemoryLedger)(nil)
	_ caddy.CleanerUpper = (*MemoryLedger)(nil)
	_ LedgerModule       = (*MemoryLedger)(nil)
	_ caddy.Provisioner  = (*FileLedger)(nil)
	_ caddy.CleanerUpper = (*FileLedger)(nil)
	_ LedgerModule       = (*FileLedger)(nil)
	_ caddy.Provisioner  = (*PostgresLedger)(nil)
	_ caddy.CleanerUpper = (*PostgresLedger)(nil)
	_ LedgerModule       = (*PostgresLedger)(nil)
	_ caddy.Destructor   = (*shared)(nil)
)
