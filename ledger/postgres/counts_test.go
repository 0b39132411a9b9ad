//go:build integration

package postgres

import (
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestPostgresCounts(t *testing.T) {
	ledgertest.RunCounts(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger { return open(t, newSchema(t)) },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return open(t, l.(*Ledger).Schema())
		},
	})
}
