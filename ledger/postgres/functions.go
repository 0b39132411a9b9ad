package postgres

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
)

// The functions of the ledger are versioned apart from its tables. A
// gateway upgraded in a rolling deployment shares the tables with gateways
// of the previous release, which keep calling the functions they know: a
// function's result columns cannot change in place (CREATE OR REPLACE
// refuses), and old callers must not run new rules they were not written
// for. So every version of functions.sql lives in its own schema,
// "<schema>_fn<functionsVersion>", created once (recorded in the table
// schema_functions) under the migration lock, and this release's
// connections set search_path to that schema and then the ledger's. The
// functions of the first releases stay where migrations 0001 and 0002 put
// them, in the ledger's schema, for the gateways that call them there.
//
// Editing functions.sql means a new functionsVersion (TestFunctionsVersion
// holds the two together) and the schema name in
// integration/bench/ledger.pgbench.

// functionsVersion is the version of functions.sql.
const functionsVersion = 12

// maxIdentifier is the length of PostgreSQL's longest identifier, in bytes
// (NAMEDATALEN - 1).
const maxIdentifier = 63

//go:embed functions.sql
var functionsFile string

// functionsTemplate is functions.sql with Go's names in it: the reasons
// the ledger records itself and the operator's provider, as literals.
var functionsTemplate = strings.NewReplacer(
	"{{ReasonLeaseExpired}}", quoteLiteral(ledger.ReasonLeaseExpired),
	"{{ReasonLateDeadline}}", quoteLiteral(ledger.ReasonLateDeadline),
	"{{ReasonLateSettled}}", quoteLiteral(ledger.ReasonLateSettled),
	"{{ReasonResolved}}", quoteLiteral(ledger.ReasonResolved),
	"{{AdminProvider}}", quoteLiteral(ledger.AdminProvider),
).Replace(functionsFile)

// functionsChecksum identifies functions.sql with Go's names in it, as
// recorded with its version: a ledger refuses another text under the same
// version.
var functionsChecksum = func() string {
	sum := sha256.Sum256([]byte(functionsTemplate))
	return hex.EncodeToString(sum[:])
}()

// functionsSchema returns the schema of the current functions of the
// ledger in schema.
func functionsSchema(schema string) string {
	return schema + "_fn" + strconv.Itoa(functionsVersion)
}

// channelOf returns the notification channel of the ledger in schema,
// shared by every release: the functions of the first releases named it
// after current_schema(), the ledger's schema.
func channelOf(schema string) string { return schema + ".jobs" }

// functionsSQL returns functions.sql for the ledger in schema: {{fn}} is
// the functions' schema, {{channel}} the notification channel as a string
// literal.
func functionsSQL(schema string) string {
	return strings.NewReplacer(
		"{{fn}}", pgx.Identifier{functionsSchema(schema)}.Sanitize(),
		"{{channel}}", quoteLiteral(channelOf(schema)),
	).Replace(functionsTemplate)
}

func quoteLiteral(s string) string {
	return "'" + strings.ReplaceAll(s, "'", "''") + "'"
}

// functionsMarker is the comment on a functions' schema: it tells ours from
// a schema that only happens to have its name.
func functionsMarker(schema string) string {
	return fmt.Sprintf("onejob ledger functions, version %d, of schema %s", functionsVersion, schema)
}

// applyFunctions creates the current functions of the ledger in schema
// unless schema_functions records them. tx holds the migration lock.
func applyFunctions(ctx context.Context, tx pgx.Tx, schema string) error {
	ident := pgx.Identifier{schema}.Sanitize()
	fn := functionsSchema(schema)
	fnIdent := pgx.Identifier{fn}.Sanitize()
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+ident+`.schema_functions (
		version integer PRIMARY KEY,
		schema_name text NOT NULL,
		checksum text NOT NULL,
		applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("postgres ledger: functions: %w", err)
	}
	var sum string
	err := tx.QueryRow(ctx, `SELECT checksum FROM `+ident+`.schema_functions WHERE version = $1`, functionsVersion).Scan(&sum)
	switch {
	case err == nil && sum == functionsChecksum:
		return nil
	case err == nil:
		return fmt.Errorf("postgres ledger: functions version %d in schema %s differ from this gateway's: functions.sql changed without a new version",
			functionsVersion, fn)
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("postgres ledger: functions: %w", err)
	}
	// Not recorded. A schema of that name is either left from a ledger
	// schema dropped and created again (our marker: replace it) or not ours.
	var comment *string
	err = tx.QueryRow(ctx, `SELECT obj_description(oid, 'pg_namespace') FROM pg_namespace WHERE nspname = $1`, fn).Scan(&comment)
	switch {
	case err == nil && comment != nil && *comment == functionsMarker(schema):
		if _, err := tx.Exec(ctx, "DROP SCHEMA "+fnIdent+" CASCADE"); err != nil {
			return fmt.Errorf("postgres ledger: functions: %w", err)
		}
	case err == nil:
		return fmt.Errorf("postgres ledger: schema %s exists and does not hold this ledger's functions", fn)
	case !errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("postgres ledger: functions: %w", err)
	}
	for _, q := range []string{
		"CREATE SCHEMA " + fnIdent,
		"COMMENT ON SCHEMA " + fnIdent + " IS " + quoteLiteral(functionsMarker(schema)),
		// Types (jobs, attempts) resolve to the ledger's tables.
		"SET LOCAL search_path TO " + fnIdent + ", " + ident,
		functionsSQL(schema),
		"SET LOCAL search_path TO " + ident,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			return fmt.Errorf("postgres ledger: functions version %d: %w", functionsVersion, err)
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO `+ident+`.schema_functions (version, schema_name, checksum) VALUES ($1, $2, $3)`,
		functionsVersion, fn, functionsChecksum); err != nil {
		return fmt.Errorf("postgres ledger: functions: %w", err)
	}
	return nil
}
