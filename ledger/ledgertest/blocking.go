package ledgertest

import (
	"errors"
	"testing"

	"github.com/onejob/onejob/ledger"
)

func testBlockedWhileStarting(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	for range 3 {
		again := reserve(t, l, p, ledger.InFlight)
		if again.Attempt == nil || again.Attempt.ID != r.Attempt.ID {
			t.Fatalf("in-flight reservation names attempt %+v, want %s", again.Attempt, r.Attempt.ID)
		}
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptStarting)
}

func testBlockedWhileUnknown(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		u := reserve(t, l, p, ledger.Unknown)
		if u.Attempt == nil || u.Attempt.ID != r.Attempt.ID || !u.Attempt.Deadline.After(u.Now) {
			t.Fatalf("unknown reservation names attempt %+v at %v", u.Attempt, u.Now)
		}
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobUnknown, ledger.AttemptUnknown)
	if a := attempt(t, j, 1); a.Error != "timeout" {
		t.Errorf("attempt error = %q, want the reason given", a.Error)
	}
	// A definitive failure of another path must not start one either.
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "late", ptr(next("x", long))); err == nil {
		t.Errorf("Fail with next on an unknown attempt succeeded")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)
}

func testFailoverBlockedByHedge(t *testing.T, h Harness) {
	l := h.New(t)
	r := reserve(t, l, params(long), ledger.Created)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	if hedge.Number != 2 || hedge.JobVersion != r.Attempt.JobVersion {
		t.Errorf("hedge attempt = %+v; want number 2 at the same version", hedge)
	}
	_, err = l.Fail(ctx(t), r.Attempt.Ref(), "503", ptr(next("third", long)))
	if !errors.Is(err, ledger.ErrBlocked) {
		t.Fatalf("failover while a hedge runs: err = %v, want ErrBlocked", err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptFailed, ledger.AttemptStarting)
	// The hedge failing too, with nothing left, fails the job.
	if _, err := l.Fail(ctx(t), hedge.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptFailed, ledger.AttemptFailed)
}

func testHedgeReverseOrder(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	// The hedge started second and finishes first: it wins.
	complete(t, l, &hedge, "from the hedge", true)
	// The first attempt finishes second: it loses, whatever its rank.
	c := complete(t, l, r.Attempt, "from the primary", false)
	if c.Job.Response == nil || string(c.Job.Response.Body) != "from the hedge" {
		t.Errorf("loser sees response %+v, want the winner's", c.Job.Response)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptLost, ledger.AttemptSucceeded)
	if j.CompletedBy != hedge.ID || string(j.Response.Body) != "from the hedge" {
		t.Errorf("job completed by %s with %q, want the hedge's answer", j.CompletedBy, j.Response.Body)
	}
	rr := reserve(t, l, p, ledger.Done)
	if string(rr.Job.Response.Body) != "from the hedge" {
		t.Errorf("replay shows %q, a lost attempt's result", rr.Job.Response.Body)
	}
	// A hedge of a settled job is refused.
	if _, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("x", long)); err == nil {
		t.Errorf("Hedge of a completed job succeeded")
	}
}

func testFailover(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	next, err := l.Fail(ctx(t), r.Attempt.Ref(), "connect_error", ptr(next("fallback", long)))
	if err != nil {
		t.Fatal(err)
	}
	if next == nil || next.Number != 2 || next.Provider != "fallback" || next.State != ledger.AttemptStarting || next.JobID != r.Job.ID {
		t.Fatalf("failover attempt = %+v", next)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptFailed, ledger.AttemptStarting)
	reserve(t, l, p, ledger.InFlight)
	if _, err := l.Fail(ctx(t), next.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobFailed, ledger.AttemptFailed, ledger.AttemptFailed)
	if a := attempt(t, j, 1); a.Error != "connect_error" || a.FinishedAt.IsZero() {
		t.Errorf("attempt 1 = %+v", a)
	}
	if j.Version != r.Job.Version {
		t.Errorf("failing changed version %d -> %d", r.Job.Version, j.Version)
	}
	// Failing again is a repeat: it changes nothing.
	if a, err := l.Fail(ctx(t), next.Ref(), "again", nil); err != nil || a != nil {
		t.Errorf("repeated Fail = %+v, %v; want nothing", a, err)
	}
	if a := attempt(t, job(t, l, r.Job.ID), 2); a.Error != "503" || a.State != ledger.AttemptFailed {
		t.Errorf("attempt 2 after a repeated Fail = %+v", a)
	}
	re := reserve(t, l, p, ledger.Reopened)
	if re.Attempt.Number != 3 || re.Job.ID != r.Job.ID || re.Job.Version != r.Job.Version+1 {
		t.Errorf("re-open = attempt %+v job version %d", re.Attempt, re.Job.Version)
	}
}

// testUnbeatenLostBlocks: a hedged attempt whose result came after its
// deadline acted; when the other attempt then fails definitively, the job
// is unknown, never failed, and no retry runs it again.
func testUnbeatenLostBlocks(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "attempt 1's deadline passes", func() bool {
		return attempt(t, job(t, l, r.Job.ID), 1).State == ledger.AttemptUnknown
	})
	complete(t, l, r.Attempt, "too late", false)
	if _, err := l.Fail(ctx(t), hedge.Ref(), "503", ptr(next("third", long))); !errors.Is(err, ledger.ErrBlocked) {
		t.Errorf("failover past an unbeaten lost attempt: err = %v, want ErrBlocked", err)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobUnknown, ledger.AttemptLost, ledger.AttemptFailed)
	reserve(t, l, p, ledger.Unknown)
}

// testCancelledNeverBlocks: after an operator's cancel, the cancelled
// attempt's late result does not block the retry's attempts.
func testCancelledNeverBlocks(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if _, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Cancel: true}); err != nil {
		t.Fatal(err)
	}
	complete(t, l, r.Attempt, "late", false)
	re := reserve(t, l, p, ledger.Reopened)
	if _, err := l.Fail(ctx(t), re.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptCancelled, ledger.AttemptFailed)
	reserve(t, l, p, ledger.Reopened)
}
