package ledger

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestSubscriberUp: a subscription nothing started yet reads as up; one
// whose connection fails reads as down until a session is confirmed again.
func TestSubscriberUp(t *testing.T) {
	fail := make(chan bool, 1)
	fail <- true
	s := NewSubscriber(func(ctx context.Context, ready func(), _ func(string)) error {
		select {
		case f := <-fail:
			if f {
				return errors.New("connection refused")
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		ready()
		<-ctx.Done()
		return ctx.Err()
	}, nil)
	defer s.Close()
	if !s.Up() {
		t.Fatal("an idle subscriber reads as down")
	}
	_, cancel, _, _, err := s.Register("job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	waitFor(t, "the failed session reads as down", func() bool { return !s.Up() })
	fail <- false
	waitFor(t, "the next session reads as up", s.Up)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestCountsMerge(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	a := NewCounts(t0.Add(time.Hour))
	a.Add(&Job{State: JobUnknown, CreatedAt: t0.Add(10 * time.Minute)})
	a.Add(&Job{State: JobCompleted, CreatedAt: t0})
	b := NewCounts(t0.Add(2 * time.Hour))
	b.Add(&Job{State: JobUnknown, CreatedAt: t0.Add(5 * time.Minute)})
	b.Add(&Job{State: JobUnknown, CreatedAt: t0.Add(20 * time.Minute)})
	b.Partial = true

	var sum Counts
	sum.Merge(a)
	sum.Merge(b)
	if sum.ByState[JobUnknown] != 3 || sum.ByState[JobCompleted] != 1 || sum.ByState[JobPending] != 0 {
		t.Errorf("sum by state: %v", sum.ByState)
	}
	if !sum.OldestUnknown.Equal(t0.Add(5*time.Minute)) || !sum.Now.Equal(t0.Add(time.Hour)) || !sum.Partial {
		t.Errorf("sum: %+v", sum)
	}
	if got := sum.OldestUnknownAge(); got != 55*time.Minute {
		t.Errorf("oldest unknown age %v, want 55m", got)
	}
	if a.ByState[JobUnknown] != 1 {
		t.Errorf("merging changed the first count: %v", a.ByState)
	}
}
