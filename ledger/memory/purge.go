package memory

import (
	"context"
	"strings"

	"github.com/onejob/onejob/ledger"
)

// Purge implements ledger.Purger.
func (l *Ledger) Purge(_ context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var st ledger.PurgeStats
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
		if ledger.Purgeable(j, now) {
			l.remove(e)
			st.Removed++
		} else {
			st.Kept++
		}
	}
	l.mu.Unlock()
	return st, nil
}

var _ ledger.Purger = (*Ledger)(nil)
