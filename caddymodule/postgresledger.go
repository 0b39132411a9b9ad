package caddymodule

import (
	"context"
	"errors"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/postgres"
)

// PostgresLedger keeps jobs in PostgreSQL, shared by many gateway instances.
type PostgresLedger struct {
	// The PostgreSQL connection string (URL or key=value form).
	// Placeholders such as {env.DATABASE_URL} are expanded. Logs and
	// errors show it without its password.
	DSN string `json:"dsn"`
	// The schema that holds the ledger's tables, created or migrated at
	// start; default "onejob".
	Schema string `json:"schema,omitempty"`

	LedgerHolder
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
		return errors.New("postgres ledger: dsn is required")
	}
	schema := p.Schema
	if schema == "" {
		schema = postgres.DefaultSchema
	}
	return p.Open(ctx, "postgres\x00"+dsn+"\x00"+schema, dial(postgres.Redacted(dsn), func(octx context.Context) (ledger.Ledger, error) {
		return postgres.Open(octx, dsn, postgres.Options{Schema: schema})
	}))
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger postgres [<dsn> [<schema>]] {
//		dsn <dsn>
//		schema <schema>
//	}
//
// The DSN is required, on the line or in the block.
func (p *PostgresLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "ledger postgres <dsn> [<schema>]",
		setting{name: "dsn", dst: &p.DSN, required: true}, setting{name: "schema", dst: &p.Schema})
}
