package notify

import (
	"context"
	"time"

	"github.com/onejob/onejob/ledger"
)

// WaitSettled is the loop behind Ledger.Wait: it reads the job until it is
// no longer pending and a streamed answer's body is saved. read returns the job with leases applied, the ledger's
// clock at the read, and a channel that receives (or closes) on the job's
// next change; the caller subscribes before the first read. Between reads
// it also wakes when the earliest lease runs out. The job it returns has
// ReadAt set: the ledger's clock at the read, moved on by the time waited
// since (measured, not read off the local clock).
func WaitSettled(ctx context.Context, read func() (*ledger.Job, time.Time, <-chan struct{}, error)) (*ledger.Job, error) {
	return waitSettled(ctx, func(bool) (*ledger.Job, time.Time, <-chan struct{}, error) { return read() })
}

// waitSettled is WaitSettled, telling read whether it reads because the
// earliest lease ran out (rather than for the first time or after a change).
func waitSettled(ctx context.Context, read func(expired bool) (*ledger.Job, time.Time, <-chan struct{}, error)) (*ledger.Job, error) {
	expired := false
	for {
		j, now, changed, err := read(expired)
		if err != nil {
			return nil, err
		}
		j.ReadAt = now
		if j.State != ledger.JobPending && !j.Streaming() {
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
		expired = false
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-changed:
		case <-expire:
			expired = true
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
func nextDeadline(j *ledger.Job) (time.Time, bool) {
	var d time.Time
	for _, a := range j.Attempts {
		if a.State == ledger.AttemptStarting && (d.IsZero() || a.Deadline.Before(d)) {
			d = a.Deadline
		}
	}
	return d, !d.IsZero()
}
