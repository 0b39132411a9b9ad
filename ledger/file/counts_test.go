package file

import (
	"path/filepath"
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestFileCounts(t *testing.T) {
	ledgertest.RunCounts(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		},
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}
