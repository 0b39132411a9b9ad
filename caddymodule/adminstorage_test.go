package caddymodule

import (
	"net/http"
	"path/filepath"
	"testing"

	"github.com/onejob/onejob/ledger/file"
	"github.com/onejob/onejob/ledger/memory"
)

// TestAdminStorage: GET /idempotency/storage answers the disk, the cache
// (a replay reads its job through it) and the log's syncs of each open
// file ledger, and nothing of a ledger that keeps nothing on the gateway's
// disk.
func TestAdminStorage(t *testing.T) {
	l, err := file.Open(filepath.Join(t.TempDir(), "ledger.db"), file.Options{CacheSize: 8 << 20})
	if err != nil {
		t.Fatal(err)
	}
	putKindLedger(t, "storagetest", l)
	putKindLedger(t, "storagetest-memory", memory.New())
	done := reserve(t, l, "a", "primary")
	complete(t, l, done.Attempt, `{"ok":true}`)
	if _, err := l.Job(t.Context(), done.Job.ID); err != nil {
		t.Fatal(err)
	}

	w := do(t, adminMux(t), http.MethodGet, "/idempotency/storage", "")
	got := decode[struct {
		Ledgers []storageJSON `json:"ledgers"`
	}](t, w, http.StatusOK)
	var mine []storageJSON
	for _, s := range got.Ledgers {
		if s.Ledger == "storagetest-memory" {
			t.Errorf("a memory ledger reports storage: %+v", s)
		}
		if s.Ledger == "storagetest" {
			mine = append(mine, s)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("storage %s: want the file ledger once", w.Body)
	}
	s := mine[0]
	if s.DiskBytes <= 0 || s.CacheSize != 8<<20 || s.CacheBytes > s.CacheSize || s.CacheHitRate < 0 || s.CacheHitRate > 1 ||
		s.Syncs < 2 { // the reservation's and the completion's, at least
		t.Errorf("storage %+v", s)
	}
	if w := do(t, adminMux(t), http.MethodPost, "/idempotency/storage", "{}"); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", w.Code)
	}
}
