//go:build integration

package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/ledgertest/differential"
)

// TestFunctionsFollowFSM holds the plpgsql functions, on a real server,
// to ledger/internal/fsm (differential.Run), as the Lua scripts
// are: the ledger's clock (ledger_clock) reads a table the test sets.
func TestFunctionsFollowFSM(t *testing.T) {
	seeds, steps := 40, 60
	if testing.Short() {
		seeds = 5
	}
	differential.Run(t, func(t *testing.T) differential.Subject {
		schema := newSchema(t)
		l := open(t, schema)
		l.replays = near.New(0, 0)
		ctx := context.Background()
		clock := pgx.Identifier{schema, "test_clock"}.Sanitize()
		for _, q := range []string{
			`CREATE TABLE ` + clock + ` (now timestamptz NOT NULL)`,
			`INSERT INTO ` + clock + ` VALUES (clock_timestamp())`,
			`CREATE OR REPLACE FUNCTION ` + pgx.Identifier{functionsSchema(schema), "ledger_clock"}.Sanitize() +
				`() RETURNS timestamptz LANGUAGE sql VOLATILE AS $$ SELECT now FROM ` + clock + ` $$`,
		} {
			if _, err := l.pool.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		set := func(now time.Time) {
			if _, err := l.pool.Exec(ctx, `UPDATE `+clock+` SET now = $1`, now); err != nil {
				t.Fatal(err)
			}
		}
		return differential.Subject{Name: "functions", Ledger: l, SetClock: set}
	}, seeds, steps)
}
