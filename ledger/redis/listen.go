package redis

import (
	"context"
	"time"

	"github.com/onejob/onejob/ledger"
)

// Wait implements ledger.Ledger: it subscribes before it reads, and reads
// again after each publication, resubscription, or lease deadline.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	if !validID(jobID) {
		return nil, ledger.ErrNotFound
	}
	return ledger.WaitSubscribed(ctx,
		func() (<-chan struct{}, func(), error) { return l.listen.Subscribe(ctx, jobID) },
		func() (*ledger.Job, time.Time, error) { return l.load(ctx, jobID) })
}
