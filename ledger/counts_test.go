package ledger

import (
	"testing"
	"time"
)

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
