package memory

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestMemoryConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			l := New()
			t.Cleanup(func() { l.Close() })
			return l
		},
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}

// clock is a manual clock for deterministic lease and retention tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestInjectedClock(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(WithClock(c.now))
	p := ledger.ReserveParams{
		OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute},
	}
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil || r.Outcome != ledger.Created {
		t.Fatal(r.Outcome, err)
	}
	if !r.Attempt.Deadline.Equal(c.now().Add(time.Minute)) {
		t.Errorf("deadline %v, want the clock plus the lease", r.Attempt.Deadline)
	}
	c.advance(59 * time.Second)
	if r, _ := l.Reserve(ctx, p.WithNewIDs()); r.Outcome != ledger.InFlight {
		t.Errorf("before the deadline: %v, want in_flight", r.Outcome)
	}
	c.advance(time.Second)
	if r, _ := l.Reserve(ctx, p.WithNewIDs()); r.Outcome != ledger.Unknown {
		t.Errorf("at the deadline: %v, want unknown", r.Outcome)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200}); err != nil || c.Won {
		t.Errorf("a result at the deadline won: %v %v", c.Won, err)
	}

	q := p
	q.KeyHash = []byte("k2")
	r, _ = l.Reserve(ctx, q.WithNewIDs())
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Stored: true}); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	c.advance(time.Hour - time.Nanosecond)
	if r2, _ := l.Reserve(ctx, q.WithNewIDs()); r2.Outcome != ledger.Done || r2.Job.ID != r.Job.ID {
		t.Errorf("within retention: %v", r2.Outcome)
	}
	c.advance(time.Nanosecond)
	if _, err := l.Job(ctx, r.Job.ID); err != ledger.ErrNotFound {
		t.Errorf("expired job still readable: %v", err)
	}
	if r2, _ := l.Reserve(ctx, q.WithNewIDs()); r2.Outcome != ledger.Created || r2.Job.ID == r.Job.ID {
		t.Errorf("after retention: %v %s", r2.Outcome, r2.Job.ID)
	}
}
