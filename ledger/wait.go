package ledger

import (
	"context"
	"time"
)

// WaitSettled is the loop behind Ledger.Wait: it reads the job until it is
// no longer pending and a streamed answer's body is saved. read returns the job with leases applied, the ledger's
// clock at the read, and a channel that receives (or closes) on the job's
// next change; the caller subscribes before the first read. Between reads
// it also wakes when the earliest lease runs out. The job it returns has
// ReadAt set: the ledger's clock at the read, moved on by the time waited
// since (measured, not read off the local clock).
func WaitSettled(ctx context.Context, read func() (*Job, time.Time, <-chan struct{}, error)) (*Job, error) {
	for {
		j, now, changed, err := read()
		if err != nil {
			return nil, err
		}
		j.ReadAt = now
		if j.State != JobPending && !j.Streaming() {
			return j, nil
		}
		readAt := time.Now()
		var (
			timer  *time.Timer
			expire <-chan time.Time
		)
		if d, ok := nextDeadline(j); ok {
			timer = time.NewTimer(d.Sub(now))
			expire = timer.C
		}
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-changed:
		case <-expire:
		}
		if timer != nil {
			timer.Stop()
		}
		if err != nil {
			j.ReadAt = now.Add(time.Since(readAt))
			return j, err
		}
	}
}

// nextDeadline returns the earliest deadline of the job's starting attempts.
func nextDeadline(j *Job) (time.Time, bool) {
	var d time.Time
	for _, a := range j.Attempts {
		if a.State == AttemptStarting && (d.IsZero() || a.Deadline.Before(d)) {
			d = a.Deadline
		}
	}
	return d, !d.IsZero()
}

// WaitSubscribed is WaitSettled for ledgers that notify each waiter on one
// channel: it subscribes before the first read, so that no notification
// between the read and the wait is missed, and unsubscribes at the end.
func WaitSubscribed(ctx context.Context, subscribe func() (<-chan struct{}, func(), error), read func() (*Job, time.Time, error)) (*Job, error) {
	changed, unsubscribe, err := subscribe()
	if err != nil {
		return nil, err
	}
	defer unsubscribe()
	return WaitSettled(ctx, func() (*Job, time.Time, <-chan struct{}, error) {
		j, now, err := read()
		return j, now, changed, err
	})
}
