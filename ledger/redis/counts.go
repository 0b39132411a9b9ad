package redis

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
)

// The Redis ledger keeps no index by state (see the keyspace in doc.go):
// counting its jobs means reading them. So that one count costs a bounded
// amount of work on the server however large the ledger, Counts walks the
// index (walk) from the newest job to the oldest in steps: each call reads
// at most countBudget jobs (in MULTIs of countBatch, as Jobs reads them:
// fields and attempts, never bodies), goes on where the previous call
// stopped, and answers with the latest complete walk. A ledger of up to
// countBudget jobs is therefore counted whole on every call; a larger one
// is counted afresh every ceil(jobs/countBudget) calls, and until its first
// walk completes the answer is the walk so far, marked Partial. Jobs
// created after a walk passed them are counted by the next walk.
var (
	countBudget = 20000
	countBatch  = 500
)

// countWalk is the state of Counts between calls.
type countWalk struct {
	mu     sync.Mutex
	cursor string         // the last job id read; "" starts a new walk
	tally  ledger.Counts  // the walk in progress
	last   *ledger.Counts // the latest complete walk
}

// Counts implements ledger.Counter.
func (l *Ledger) Counts(ctx context.Context) (ledger.Counts, error) {
	w := &l.counts
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cursor == "" {
		w.tally = ledger.NewCounts(time.Time{})
	}
	done := false
	for read := 0; read < countBudget && !done; {
		ids, err := l.walk(ctx, w.cursor, countBatch)
		if err != nil {
			return ledger.Counts{}, fmt.Errorf("redis ledger: counts: %w", err)
		}
		jobs, err := l.loadMany(ctx, ids)
		if err != nil {
			return ledger.Counts{}, err
		}
		for _, j := range jobs {
			w.tally.Add(j)
		}
		read += len(ids)
		if len(ids) > 0 {
			w.cursor = ids[len(ids)-1].id
		}
		done = len(ids) < countBatch
	}
	now, err := l.client.Time(ctx).Result()
	if err != nil {
		return ledger.Counts{}, fmt.Errorf("redis ledger: counts: %w", err)
	}
	w.tally.Now = now
	if done {
		c := w.tally.Clone()
		w.last, w.cursor = &c, ""
		return c.Clone(), nil
	}
	if w.last != nil {
		return w.last.Clone(), nil
	}
	c := w.tally.Clone()
	c.Partial = true
	return c, nil
}

// ListenerUp implements ledger.Listener: the subscription that wakes this
// process's waiters.
func (l *Ledger) ListenerUp() bool { return l.listen.Up() }

// Interface guards
var (
	_ ledger.Counter  = (*Ledger)(nil)
	_ ledger.Listener = (*Ledger)(nil)
)
