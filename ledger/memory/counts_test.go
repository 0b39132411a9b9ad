package memory

import (
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestMemoryCounts(t *testing.T) {
	ledgertest.RunCounts(t, ledgertest.Harness{
		New:  func(*testing.T) ledger.Ledger { return New() },
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}
