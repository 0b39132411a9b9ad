package redis

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestMiniredisCounts(t *testing.T) {
	m := miniredis.RunT(t)
	ledgertest.RunCounts(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger { return openMini(t, m, "t:"+ledger.NewID()+":") },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return openMini(t, m, l.(*Ledger).Prefix())
		},
	})
}

// TestCountsWalkInSteps: a ledger larger than one call's budget is counted
// over several calls; until the first walk ends the count is partial, then
// each answer is the latest complete walk.
func TestCountsWalkInSteps(t *testing.T) {
	budget, batch := countBudget, countBatch
	countBudget, countBatch = 3, 2
	t.Cleanup(func() { countBudget, countBatch = budget, batch })

	m := miniredis.RunT(t)
	l := openMini(t, m, "t:"+ledger.NewID()+":")
	ctx := context.Background()
	reserveN := func(n int) {
		t.Helper()
		for range n {
			p := params(ledger.NewID(), "k")
			p.Attempt.Lease = time.Hour
			if _, err := l.Reserve(ctx, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	count := func() ledger.Counts {
		t.Helper()
		c, err := l.Counts(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	reserveN(5)
	// Two batches of two: four jobs, the walk not done.
	if c := count(); !c.Partial || c.ByState[ledger.JobPending] != 4 {
		t.Fatalf("first call: %+v, want a partial count of 4", c)
	}
	// The fifth job ends the walk.
	if c := count(); c.Partial || c.ByState[ledger.JobPending] != 5 {
		t.Fatalf("second call: %+v, want 5 counted whole", c)
	}
	reserveN(1)
	// A new walk has read four of six: the answer is still the last one.
	if c := count(); c.Partial || c.ByState[ledger.JobPending] != 5 {
		t.Fatalf("third call: %+v, want the last complete count, 5", c)
	}
	if c := count(); c.Partial || c.ByState[ledger.JobPending] != 6 {
		t.Fatalf("fourth call: %+v, want 6", c)
	}
}
