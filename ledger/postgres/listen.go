package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/notify"
)

// newListener returns the one LISTEN of a Ledger, shared by all its
// waiters (notify.Subscriber): each session is a connection of its own,
// confirmed once LISTEN ran.
func newListener(cfg *pgx.ConnConfig, channel string) *notify.Subscriber {
	return notify.NewSubscriber(func(ctx context.Context, ready func(), wake func(string)) error {
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			return err
		}
		defer func() {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			conn.Close(cctx)
			cancel()
		}()
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
			return err
		}
		ready()
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return err
			}
			wake(n.Payload)
		}
	}, nil)
}

// Wait implements ledger.Ledger: it subscribes before it reads, and reads
// again after each notification, reconnect, or lease deadline; the waiters of
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
