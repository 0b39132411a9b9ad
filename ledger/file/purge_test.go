package file

import (
	"path/filepath"
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

var harness = ledgertest.Harness{
	New: func(t *testing.T) ledger.Ledger {
		l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	},
	// One process holds the file: a peer is the same ledger.
	Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
}

func TestFilePurge(t *testing.T) { ledgertest.RunPurge(t, harness) }

// The operator's view of a file ledger: the bytes of its files.
func TestFileSealed(t *testing.T) {
	ledgertest.RunSealed(t, harness, func(t *testing.T, l ledger.Ledger) []byte {
		return ledgertest.DirBytes(t, l.(*Ledger).Path())
	})
}
