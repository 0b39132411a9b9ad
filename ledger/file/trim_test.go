package file

import (
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"
)

// TestIdleLedgerDoesNotTrim: C's allocator is trimmed after the ledger
// was used, not every second of a ledger left idle (the simulation's
// schedules spend ten virtual minutes idle each, and spent most of their
// CPU in trims).
func TestIdleLedgerDoesNotTrim(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		if n := l.trims.Load(); n > 1 {
			t.Fatalf("%d trims in 10 idle minutes, want at most 1", n)
		}
		if _, err := l.Storage(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * trimEvery)
		synctest.Wait()
		if n := l.trims.Load(); n == 0 {
			t.Fatal("no trim after the ledger was used")
		}
	})
}
