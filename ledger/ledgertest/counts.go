package ledgertest

import (
	"fmt"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// RunCounts checks a backend's ledger.Counter (and ledger.Listener, when
// it has one): jobs are counted by state as Jobs lists them, a lease that
// ran out counts as unknown, an expired job not at all, and the oldest
// unknown job is dated by its creation. Every backend of this module runs
// it beside Run.
func RunCounts(t *testing.T, h Harness) {
	t.Run("CountsByState", func(t *testing.T) { testCounts(t, h) })
}

// counts returns l's counts, failing the test if l cannot count.
func counts(t *testing.T, l ledger.Ledger) ledger.Counts {
	t.Helper()
	c, ok := l.(ledger.Counter)
	if !ok {
		t.Fatalf("%T does not implement ledger.Counter", l)
	}
	n, err := c.Counts(ctx(t))
	if err != nil {
		t.Fatalf("Counts: %v", err)
	}
	if n.Now.IsZero() {
		t.Fatalf("Counts: no time for the count")
	}
	if len(n.ByState) != len(ledger.JobStates) {
		t.Fatalf("Counts: %v, want every state", n.ByState)
	}
	return n
}

func byState(c ledger.Counts) string {
	return fmt.Sprintf("unknown=%d pending=%d failed=%d completed=%d",
		c.ByState[ledger.JobUnknown], c.ByState[ledger.JobPending], c.ByState[ledger.JobFailed], c.ByState[ledger.JobCompleted])
}

func testCounts(t *testing.T, h Harness) {
	l := h.New(t)
	if c := counts(t, l); byState(c) != "unknown=0 pending=0 failed=0 completed=0" || !c.OldestUnknown.IsZero() {
		t.Fatalf("an empty ledger counts %s, oldest unknown %v", byState(c), c.OldestUnknown)
	}
	if u, ok := l.(ledger.Listener); ok && !u.ListenerUp() {
		t.Errorf("the listener of a ledger nothing waited on yet reads as down")
	}

	// The oldest unknown job: its attempt timed out.
	unknown := reserve(t, l, params(long), ledger.Created)
	if err := l.MarkUnknown(ctx(t), unknown.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	// A pending job whose lease runs out: then unknown, without a sweep.
	leased := reserve(t, l, params(short), ledger.Created)
	reserve(t, l, params(long), ledger.Created) // pending
	done := reserve(t, l, params(long), ledger.Created)
	complete(t, l, done.Attempt, "done", true)
	failed := reserve(t, l, params(long), ledger.Created)
	if _, err := l.Fail(ctx(t), failed.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	// A completed job whose retention passes: not counted once expired.
	p := params(long)
	p.Retention = short
	expiring := reserve(t, l, p, ledger.Created)
	complete(t, l, expiring.Attempt, "soon gone", true)

	want := "unknown=2 pending=1 failed=1 completed=1"
	var c ledger.Counts
	eventually(t, "the lease runs out and the retention passes", func() bool {
		c = counts(t, l)
		return byState(c) == want
	})
	first := job(t, l, unknown.Job.ID)
	if !c.OldestUnknown.Equal(first.CreatedAt) {
		t.Errorf("oldest unknown job created at %v, want %v (job %s)", c.OldestUnknown, first.CreatedAt, first.ID)
	}
	if age := c.OldestUnknownAge(); age <= 0 || age > time.Minute {
		t.Errorf("oldest unknown age %v", age)
	}
	if c.Partial {
		t.Errorf("a count of six jobs is partial")
	}

	// Another instance on the same store counts the same.
	if peer := h.Peer(t, l); peer != l {
		if pc := counts(t, peer); byState(pc) != want || !pc.OldestUnknown.Equal(c.OldestUnknown) {
			t.Errorf("a peer counts %s, oldest unknown %v; want %s, %v", byState(pc), pc.OldestUnknown, want, c.OldestUnknown)
		}
	}

	// An operator cancels the oldest unknown job: it is failed now, and
	// the next unknown job is the oldest.
	if _, err := l.Resolve(ctx(t), unknown.Job.ID, ledger.Resolution{Cancel: true}); err != nil {
		t.Fatal(err)
	}
	c = counts(t, l)
	if got := byState(c); got != "unknown=1 pending=1 failed=2 completed=1" {
		t.Errorf("after the cancel: %s", got)
	}
	if second := job(t, l, leased.Job.ID); !c.OldestUnknown.Equal(second.CreatedAt) {
		t.Errorf("after the cancel, oldest unknown created at %v, want %v", c.OldestUnknown, second.CreatedAt)
	}
}
