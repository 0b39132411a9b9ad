package memory

import (
	"context"
	"strings"

	"github.com/onejob/onejob/ledger"
)

// Purge implements ledger.Purger.
func (l *Ledger) Purge(_ context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var (
		st     ledger.PurgeStats
		change uint64 // the last change journaled
	)
	now := l.now()
	l.mu.Lock()
	prefix := identity(ownerHash, nil) // the owner's part of every key
	for e := range l.byID.all(&l.slab) {
		if !strings.HasPrefix(e.key(), prefix) {
			continue
		}
		j, err := l.current(e, now)
		if err != nil {
			l.mu.Unlock()
			return st, err
		}
		change = max(change, e.change)
		if ledger.Purgeable(j, now) {
			change = max(change, l.remove(e))
			st.Removed++
		} else {
			st.Kept++
		}
	}
	l.mu.Unlock()
	return st, l.sync(change)
}

var _ ledger.Purger = (*Ledger)(nil)
