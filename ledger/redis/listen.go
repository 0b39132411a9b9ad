package redis

import (
	"context"
	"time"

	"github.com/onejob/onejob/ledger"
)

// Wait implements ledger.Ledger: it subscribes before it reads, and reads
// again after each publication, resubscription, or lease deadline; the waiters of
// one job on this instance share reads (notify.Subscriber.Wait).
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	if !validID(jobID) {
		return nil, ledger.ErrNotFound
	}
	return l.listen.Wait(ctx, jobID, func(ctx context.Context) (*ledger.Job, time.Time, error) {
		return l.load(ctx, jobID)
	})
}

// WaitReads implements ledger.WaitReader.
func (l *Ledger) WaitReads() uint64 { return l.listen.WaitReads() }
