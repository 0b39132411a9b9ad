package caddymodule

import (
	"net/http"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// adminStoragePath answers what the open ledgers kept on the gateway's
// disk take there, and how well their caches serve reads.
const adminStoragePath = "/idempotency/storage"

// storageJSON is one ledger in the answer of GET /idempotency/storage.
type storageJSON struct {
	Ledger       string  `json:"ledger"` // its module
	DiskBytes    int64   `json:"disk_bytes"`
	CacheBytes   int64   `json:"cache_bytes"`
	CacheSize    int64   `json:"cache_size"`
	CacheHits    uint64  `json:"cache_hits"`
	CacheMisses  uint64  `json:"cache_misses"`
	CacheHitRate float64 `json:"cache_hit_rate"`
	Syncs        uint64  `json:"syncs"`
}

// handleStorage serves GET /idempotency/storage: {"ledgers": [...]}, one
// entry per open ledger that reports its storage (the file ledger), in no
// order.
func (a *adminAPI) handleStorage(w http.ResponseWriter, r *http.Request) error {
	if !allowMethod(w, r, http.MethodGet) {
		return nil
	}
	ls, release := holdOpenLedgers(func(err error) { a.log().Error("closing ledger", zap.Error(err)) })
	defer release()
	out := struct {
		Ledgers []storageJSON `json:"ledgers"`
	}{Ledgers: []storageJSON{}}
	for _, s := range ls {
		rep, ok := s.Ledger.(ledger.StorageReporter)
		if !ok {
			continue
		}
		st, err := rep.Storage()
		if err != nil {
			a.unavailable(w, err, "")
			return nil
		}
		out.Ledgers = append(out.Ledgers, storageJSON{Ledger: s.kind, DiskBytes: st.DiskBytes, CacheBytes: st.CacheBytes,
			CacheSize: st.CacheSize, CacheHits: st.CacheHits, CacheMisses: st.CacheMisses, CacheHitRate: st.HitRate(),
			Syncs: st.Syncs})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
