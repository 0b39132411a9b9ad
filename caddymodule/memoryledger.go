package caddymodule

import (
	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// MemoryLedger keeps jobs in process memory: for tests and demos. Jobs
// survive config reloads but not a restart.
type MemoryLedger struct {
	LedgerHolder
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
	ctx.Logger().Warn("idempotency ledger is in memory: nothing survives a restart")
	return m.Open(ctx, "memory", func() (ledger.Ledger, error) { return memory.New(), nil })
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger memory
func (m *MemoryLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "ledger memory")
}
