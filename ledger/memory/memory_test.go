package memory

import (
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			l := New()
			t.Cleanup(func() { l.Close() })
			return l
		},
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}
