package memory

import (
	"bytes"
	"context"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// Purge implements ledger.Purger.
func (l *Ledger) Purge(_ context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var st ledger.PurgeStats
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.byID {
		if !bytes.Equal(e.job.OwnerHash, ownerHash) {
			continue
		}
		if fsm.ApplyLeases(e.job, now) > 0 {
			e.notify()
		}
		if ledger.Purgeable(e.job) {
			l.remove(e)
			st.Removed++
		} else {
			st.Kept++
		}
	}
	return st, nil
}

var _ ledger.Purger = (*Ledger)(nil)
