package memory

import (
	"context"

	"github.com/onejob/onejob/ledger"
)

// Counts implements ledger.Counter: it walks every job in memory under
// the ledger's lock. A settled job is counted without decoding it: it is
// completed, and stays so.
func (l *Ledger) Counts(_ context.Context) (ledger.Counts, error) {
	now := l.now()
	c := ledger.NewCounts(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	for e := range l.byID.all(&l.slab) {
		if e.expired(now) {
			continue
		}
		if e.job == nil {
			c.ByState[ledger.JobCompleted]++
			continue
		}
		j, err := l.current(e, now)
		if err != nil {
			return ledger.Counts{}, err
		}
		c.Add(j)
	}
	return c, nil
}

// Interface guards
var _ ledger.Counter = (*Ledger)(nil)
