// Package postgres is a Ledger on PostgreSQL, for many gateway instances
// sharing one database. Uniqueness of (owner, key) is a UNIQUE constraint,
// each transition is one function call (one round trip, one transaction),
// deadlines are judged by the server's clock, and waiters are woken through
// LISTEN/NOTIFY on one connection per Ledger.
//
// The tables live in the ledger's schema and change only by migrations
// (migrations/*.sql), which a gateway of an earlier release refuses to run
// beside, and by expansions (expansions/*.sql), which only add what earlier
// releases can ignore (a column with a default) and so leave them running
// and starting during a rolling upgrade. The functions live in a schema of their own per
// version of functions.sql, "<schema>_fn<N>", which this release's
// connections put first in their search_path: gateways of different
// releases share the tables, each calling its own functions, during a
// rolling upgrade (see functions.go).
package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/notify"
)

// DefaultSchema is the schema the ledger's tables live in.
const DefaultSchema = "onejob"

// Options configure a Ledger.
type Options struct {
	// Schema holds the ledger's tables and functions; default "onejob".
	// Gateways that share a ledger use the same schema.
	Schema string
	// Tracer, if set, traces every query (for counting round trips).
	Tracer pgx.QueryTracer
}

// Ledger is a PostgreSQL ledger.
type Ledger struct {
	pool    *pgxpool.Pool
	schema  string
	fn      string // the schema of the current functions
	channel string
	listen  *notify.Subscriber
	replays *near.Cache // completed jobs read lately
}

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// Open connects to the database at dsn (a PostgreSQL URL or key=value
// string), applies the ledger's migrations under an advisory lock, and
// returns the ledger.
func Open(ctx context.Context, dsn string, opts Options) (*Ledger, error) {
	schema := opts.Schema
	if schema == "" {
		schema = DefaultSchema
	}
	if !schemaName.MatchString(schema) {
		return nil, fmt.Errorf("postgres ledger: invalid schema name %q", schema)
	}
	fn := functionsSchema(schema)
	if len(fn) > maxIdentifier {
		return nil, fmt.Errorf("postgres ledger: schema name %q is too long: its functions' schema %q exceeds PostgreSQL's %d bytes",
			schema, fn, maxIdentifier)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres ledger: %w", err)
	}
	// The current functions first, then the tables (and the functions of
	// earlier releases, which this gateway never calls).
	cfg.ConnConfig.RuntimeParams["search_path"] = fn + ", " + schema
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "onejob"
	}
	if opts.Tracer != nil {
		cfg.ConnConfig.Tracer = opts.Tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres ledger: %w", err)
	}
	if err := migrate(ctx, pool, schema); err != nil {
		pool.Close()
		return nil, err
	}
	l := &Ledger{pool: pool, schema: schema, fn: fn, channel: channelOf(schema), replays: near.New(10000, 64<<20)}
	lcfg := cfg.ConnConfig.Copy()
	lcfg.Tracer = nil
	lcfg.RuntimeParams["application_name"] = "onejob-listener"
	l.listen = newListener(lcfg, l.channel)
	l.replays.Follow(l.listen)
	return l, nil
}

// Pool returns the ledger's connection pool.
func (l *Ledger) Pool() *pgxpool.Pool { return l.pool }

// Schema returns the schema the ledger's tables live in.
func (l *Ledger) Schema() string { return l.schema }

// FunctionsSchema returns the schema of the functions this gateway calls.
func (l *Ledger) FunctionsSchema() string { return l.fn }

// Close stops the listener and closes the pool.
func (l *Ledger) Close() error {
	l.listen.Close()
	l.pool.Close()
	return nil
}

//go:embed migrations/*.sql expansions/*.sql
var migrations embed.FS

type migration struct {
	version int
	name    string
	sql     string
}

// loadMigrations reads the numbered files of dir (migrations or
// expansions), in order.
func loadMigrations(dir string) ([]migration, error) {
	files, err := fs.Glob(migrations, dir+"/*.sql")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, f := range files {
		base := strings.TrimPrefix(f, dir+"/")
		num, _, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number", f)
		}
		b, err := migrations.ReadFile(f)
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{version: v, name: base, sql: string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	for i, m := range ms {
		if m.version != i+1 {
			return nil, fmt.Errorf("migration %s: expected version %d", m.name, i+1)
		}
	}
	return ms, nil
}

// migrationLock seeds the advisory lock key under which a schema's
// migrations run, so that gateways starting together apply each migration
// once; the key is the schema's name hashed with it, so that gateways on
// other schemas (other ledgers in the same database) do not wait.
const migrationLock = 0x6f6e656a6f62 // "onejob"

// migrate applies the missing migrations and expansions and then, unless
// they are there already, the current functions, in one transaction,
// holding an advisory lock.
func migrate(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	ms, err := loadMigrations("migrations")
	if err != nil {
		return fmt.Errorf("postgres ledger: %w", err)
	}
	es, err := loadMigrations("expansions")
	if err != nil {
		return fmt.Errorf("postgres ledger: %w", err)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtextextended($1, $2))", schema, int64(migrationLock)); err != nil {
			return fmt.Errorf("postgres ledger: migration lock: %w", err)
		}
		ident := pgx.Identifier{schema}.Sanitize()
		if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+ident); err != nil {
			return fmt.Errorf("postgres ledger: %w", err)
		}
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+ident); err != nil {
			return fmt.Errorf("postgres ledger: %w", err)
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
			version integer PRIMARY KEY,
			name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("postgres ledger: %w", err)
		}
		var current int
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_migrations").Scan(&current); err != nil {
			return fmt.Errorf("postgres ledger: %w", err)
		}
		if current > len(ms) {
			return fmt.Errorf("postgres ledger: schema %s is at version %d, newer than this gateway knows (%d)", schema, current, len(ms))
		}
		if err := applyMissing(ctx, tx, "schema_migrations", ms[current:]); err != nil {
			return err
		}
		// Expansions are recorded apart: a gateway of an earlier release
		// reads only schema_migrations, and starts.
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_expansions (
			version integer PRIMARY KEY,
			name text NOT NULL,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return fmt.Errorf("postgres ledger: %w", err)
		}
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM schema_expansions").Scan(&current); err != nil {
			return fmt.Errorf("postgres ledger: %w", err)
		}
		if current > len(es) {
			current = len(es) // a later release's expansions: this one needs none of them
		}
		if err := applyMissing(ctx, tx, "schema_expansions", es[current:]); err != nil {
			return err
		}
		return applyFunctions(ctx, tx, schema)
	})
}

// applyMissing runs ms in order and records each in table.
func applyMissing(ctx context.Context, tx pgx.Tx, table string, ms []migration) error {
	for _, m := range ms {
		if _, err := tx.Exec(ctx, m.sql); err != nil {
			return fmt.Errorf("postgres ledger: %s %s: %w", table, m.name, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+table+" (version, name) VALUES ($1, $2)", m.version, m.name); err != nil {
			return fmt.Errorf("postgres ledger: %s %s: %w", table, m.name, err)
		}
	}
	return nil
}

// errUnexpected reports an outcome a function should never return.
func errUnexpected(fn, outcome string) error {
	return fsm.UnexpectedOutcome("postgres ledger", fn, outcome)
}
