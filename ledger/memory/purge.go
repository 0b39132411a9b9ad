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
	defer l.mu.Unlock()
	prefix := identity(ownerHash, nil) // the owner's part of every key
	for _, e := range l.byID {
		if !strings.HasPrefix(e.key, prefix) {
			continue
		}
		j, err := e.current(now)
		if err != nil {
			return st, err
		}
		if ledger.Purgeable(j) {
			l.remove(e)
			st.Removed++
		} else {
			st.Kept++
		}
	}
	return st, nil
}

var _ ledger.Purger = (*Ledger)(nil)
