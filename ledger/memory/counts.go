package memory

import (
	"context"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// Counts implements ledger.Counter: it walks every job in memory under
// the ledger's lock, as Jobs does.
func (l *Ledger) Counts(_ context.Context) (ledger.Counts, error) {
	now := l.now()
	c := ledger.NewCounts(now)
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.byID {
		if e.job.Expired(now) {
			continue
		}
		fsm.ApplyLeases(e.job, now)
		c.Add(e.job)
	}
	return c, nil
}

// Interface guards
var _ ledger.Counter = (*Ledger)(nil)
