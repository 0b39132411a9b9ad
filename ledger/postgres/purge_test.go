//go:build integration

package postgres

import (
	"context"
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

var harness = ledgertest.Harness{
	New: func(t *testing.T) ledger.Ledger { return open(t, newSchema(t)) },
	Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
		return open(t, l.(*Ledger).Schema())
	},
}

func TestPostgresPurge(t *testing.T) { ledgertest.RunPurge(t, harness) }

// The jobs table, read as an operator would (bytea shown in hex), holds
// no answer in clear.
func TestPostgresSealed(t *testing.T) {
	ledgertest.RunSealed(t, harness, func(t *testing.T, l ledger.Ledger) []byte {
		var rows string
		err := l.(*Ledger).Pool().QueryRow(context.Background(),
			`SELECT coalesce(string_agg(j::text, E'\n'), '') FROM jobs j`).Scan(&rows)
		if err != nil {
			t.Fatal(err)
		}
		return []byte(rows)
	})
}
