package file

import (
	"context"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/record"
)

// Counts implements ledger.Counter: it reads every job of the file in one
// read transaction, which does not block writers. The file ledger serves
// one process on one machine, and the gateway counts at most every few
// seconds; a job's JSON is decoded as Jobs decodes it.
func (l *Ledger) Counts(_ context.Context) (ledger.Counts, error) {
	now := l.now()
	c := ledger.NewCounts(now)
	err := l.db.View(func(tx *bolt.Tx) error {
		return wrap(tx).jobs.ForEach(func(k, v []byte) error {
			j, err := record.Decode(v)
			if err != nil {
				return fmt.Errorf("file ledger: job %s: %w", k, err)
			}
			if j.Expired(now) {
				return nil
			}
			fsm.ApplyLeases(j, now)
			c.Add(j)
			return nil
		})
	})
	if err != nil {
		return ledger.Counts{}, err
	}
	return c, nil
}

// Interface guards
var _ ledger.Counter = (*Ledger)(nil)
