package notify

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onejob/onejob/ledger"
)

// sharedReads lets the waiters of one job share a read of it: a waiter that
// needs to read joins a read of the same job already in flight, if that
// read started late enough to tell it everything it needs to know, and
// starts one otherwise. It is the one place of the rule, for the
// Subscriber's waiters:
//
//   - a waiter's first read starts after its subscription was confirmed;
//   - a read after the waiter's channel woke it starts after the job's last
//     Wake and after the last SetReady, whichever woke it;
//   - a read after a lease deadline passed starts after the waiter saw it
//     pass.
//
// "After" is judged by the numbers of Waiters' events: a read is stamped
// with the number of the last event before it started, and a waiter joins
// it only when that number is at least the one of the last event it reacts
// to (Waiters.need, Waiters.stamp). A read that started earlier may have
// seen the job before the change the waiter was told of, so the waiter
// starts its own: that is the subscribe-then-read rule, kept when reads are
// shared.
//
// The read runs on its own goroutine with a context of its own, cancelled
// when every waiter that shares it has given up, so that one waiter's
// cancellation never fails the others. Each sharer gets its own copy of
// the job. A read that returned the job stays, finished, until a later
// read replaces it or the job's last waiter leaves (drop): a waiter that
// comes to it late — one of ten thousand woken by one notification, say —
// takes its result by the same rule as if it had joined in flight, rather
// than reading again.
type sharedReads struct {
	mu      sync.Mutex
	flights map[string]*flight // by job: the latest read in flight
	count   atomic.Uint64      // reads started
}

// flight is one read of a job in flight.
type flight struct {
	stamp   uint64    // the number of the last event before it started
	sharers int       // waiters waiting for it; under sharedReads.mu
	ended   time.Time // when it returned the job (zero: not yet, or an error); under sharedReads.mu
	cancel  context.CancelFunc
	done    chan struct{} // closed when the read returned

	job *ledger.Job // set before done is closed, read-only after
	now time.Time
	err error
}

// read returns the job as a read of it stamped at least need returns it:
// one in flight, or one it starts with read, stamped by stamp. ctx bounds
// the wait; the read itself ends when every sharer gave up.
func (r *sharedReads) read(ctx context.Context, jobID string, need uint64, stamp func() uint64,
	read func(context.Context) (*ledger.Job, time.Time, error)) (*ledger.Job, time.Time, error) {
	r.mu.Lock()
	f := r.flights[jobID]
	if f != nil && f.finished() && f.stamp >= need {
		r.mu.Unlock()
		// The ledger's clock, moved on by the time since the read
		// ended: the waiter's lease deadlines are timed from it.
		return f.job.Clone(), f.now.Add(time.Since(f.ended)), nil
	}
	if f == nil || f.stamp < need {
		// Stamped before it starts: every event up to the stamp came
		// before the read.
		rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		f = &flight{stamp: stamp(), cancel: cancel, done: make(chan struct{})}
		if r.flights == nil {
			r.flights = make(map[string]*flight)
		}
		r.flights[jobID] = f
		r.count.Add(1)
		go r.run(rctx, jobID, f, read)
	}
	f.sharers++
	r.mu.Unlock()

	select {
	case <-f.done:
		return f.job.Clone(), f.now, f.err
	case <-ctx.Done():
		r.mu.Lock()
		f.sharers--
		if f.sharers == 0 && !f.finished() {
			// Nobody waits for it: cancel it, and let nobody join it.
			f.cancel()
			r.forget(jobID, f)
		}
		r.mu.Unlock()
		return nil, time.Time{}, ctx.Err()
	}
}

// run makes the read of a flight and hands its result to the sharers.
func (r *sharedReads) run(ctx context.Context, jobID string, f *flight, read func(context.Context) (*ledger.Job, time.Time, error)) {
	f.job, f.now, f.err = read(ctx)
	f.cancel()
	r.mu.Lock()
	if f.err == nil {
		f.ended, f.sharers = time.Now(), 0
	} else {
		r.forget(jobID, f)
	}
	r.mu.Unlock()
	close(f.done)
}

// forget removes f from the flights, unless a later read replaced it;
// r.mu is held.
func (r *sharedReads) forget(jobID string, f *flight) {
	if r.flights[jobID] == f {
		delete(r.flights, jobID)
	}
}

// drop forgets the read of jobID kept after it ended: its job's last
// waiter left.
func (r *sharedReads) drop(jobID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.flights[jobID]; f != nil && f.finished() {
		delete(r.flights, jobID)
	}
}

// finished reports whether the read returned the job, to be kept for the
// waiters that come late; r.mu is held.
func (f *flight) finished() bool { return !f.ended.IsZero() }
