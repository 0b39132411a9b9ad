package ledgertest

import (
	"errors"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

func testLateResultWins(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	j := job(t, l, r.Job.ID)
	if j.Version != r.Job.Version {
		t.Fatalf("MarkUnknown changed version %d -> %d", r.Job.Version, j.Version)
	}
	complete(t, l, r.Attempt, "late", true)
	j = job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptSucceeded)
	if string(j.Response.Body) != "late" {
		t.Errorf("body = %q", j.Response.Body)
	}
	// A winner is never overwritten by marking unknown or failed.
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "again"); err == nil {
		t.Errorf("MarkUnknown of a succeeded attempt was accepted")
	}
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "again", nil); err == nil {
		t.Errorf("Fail of a succeeded attempt was accepted")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobCompleted, ledger.AttemptSucceeded)
}

func testResultAfterCancel(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	j, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Cancel: true})
	if err != nil {
		t.Fatal(err)
	}
	if j.State != ledger.JobFailed || j.Version != r.Job.Version+1 {
		t.Errorf("cancelled job = %+v, want failed with version+1", j)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptCancelled)
	c := complete(t, l, r.Attempt, "too late", false)
	if c.Job.Response != nil {
		t.Errorf("loser sees response %+v after a cancel", c.Job.Response)
	}
	// The operator's decision stands: the late result is dropped and the
	// attempt stays cancelled, so it never blocks the job again.
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptCancelled)
	// The retry re-opens the job with attempt 2 and a new version; attempt
	// 1 still cannot win.
	re := reserve(t, l, p, ledger.Reopened)
	if re.Attempt.Number != 2 || re.Job.Version != r.Job.Version+2 {
		t.Errorf("re-open: attempt %d version %d", re.Attempt.Number, re.Job.Version)
	}
	complete(t, l, r.Attempt, "later still", false)
	complete(t, l, re.Attempt, "fresh", true)
	if got := reserve(t, l, p, ledger.Done).Job.Response.Body; string(got) != "fresh" {
		t.Errorf("replay = %q", got)
	}
}

// testStaleVersion: the CAS matches the version the attempt read; a result
// presented with any other version loses, even from a running attempt.
func testStaleVersion(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	for _, v := range []int64{r.Attempt.JobVersion - 1, r.Attempt.JobVersion + 1} {
		ref := r.Attempt.Ref()
		ref.Version = v
		c, err := l.Complete(ctx(t), ref, response("stale"))
		if err != nil {
			t.Fatal(err)
		}
		if c.Won {
			t.Fatalf("a result with version %d won a job at version %d", v, r.Job.Version)
		}
	}
	j := job(t, l, r.Job.ID)
	if j.CompletedBy != "" || j.Response != nil {
		t.Errorf("stale result stored: %+v", j.Response)
	}
}

func testResultAfterDeadline(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the ledger's clock passes the attempt deadline", func() bool {
		u := reserve(t, l, p, ledger.Unknown)
		return !u.Now.Before(u.Attempt.Deadline)
	})
	c := complete(t, l, r.Attempt, "after the deadline", false)
	if c.Job.Response != nil {
		t.Errorf("loser sees response %+v", c.Job.Response)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptLost)
}

// testLateResultUnknown: a result that arrives after its attempt's
// deadline, with nothing having read the job since (answer headers came in
// time, so nobody marked the attempt unknown), is dropped, and the job is
// unknown, not left pending: the provider acted.
func testLateResultUnknown(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	// Not a read of the job: any read would expire the lease first.
	time.Sleep(short + 300*time.Millisecond)
	c := complete(t, l, r.Attempt, "after the deadline", false)
	if c.Job.State == ledger.JobPending {
		t.Errorf("the loser's completion left the job pending")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptLost)
	reserve(t, l, p, ledger.Unknown)
	page, err := l.Jobs(ctx(t), ledger.JobQuery{State: ledger.JobPending, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range page.Jobs {
		if j.ID == r.Job.ID {
			t.Errorf("the job is listed as pending")
		}
	}
}

// testLateFailure: an attempt marked unknown that then reports a definitive
// failure (a late 503) before its deadline fails the job, which a retry
// re-opens; it never fails over.
func testLateFailure(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", ptr(next("b", long))); err == nil {
		t.Fatal("an unknown attempt failed over")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptFailed)
	reserve(t, l, p, ledger.Reopened)
}

func testResolveComplete(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	resp := response("operator's answer")
	j, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Response: &resp, AttemptID: ledger.NewID()})
	if err != nil {
		t.Fatal(err)
	}
	if j.State != ledger.JobCompleted || j.Version != r.Job.Version+1 {
		t.Errorf("resolved job = %+v", j)
	}
	j = job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptCancelled, ledger.AttemptSucceeded)
	if a := attempt(t, j, 2); a.Provider != ledger.AdminProvider || j.CompletedBy != a.ID {
		t.Errorf("admin attempt = %+v, completed by %s", a, j.CompletedBy)
	}
	if string(reserve(t, l, p, ledger.Done).Job.Response.Body) != "operator's answer" {
		t.Errorf("replay is not the operator's answer")
	}
	if _, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Cancel: true}); !errors.Is(err, ledger.ErrCompleted) {
		t.Errorf("cancel of a completed job: err = %v, want ErrCompleted", err)
	}
	if _, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Response: &resp, AttemptID: ledger.NewID()}); !errors.Is(err, ledger.ErrCompleted) {
		t.Errorf("complete of a completed job: err = %v, want ErrCompleted", err)
	}
	complete(t, l, r.Attempt, "late", false)
}

func testSaveBody(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	head := ledger.Response{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}}
	c, err := l.Complete(ctx(t), r.Attempt.Ref(), head)
	if err != nil || !c.Won {
		t.Fatalf("Complete headers: %v %v", c.Won, err)
	}
	if rr := reserve(t, l, p, ledger.Done); rr.Job.Response.Stored {
		t.Errorf("body counted as stored before it was saved")
	}
	if err := l.SaveBody(ctx(t), r.Attempt.Ref(), []byte("data: 1\n\n"), 9, true); err != nil {
		t.Fatal(err)
	}
	got := reserve(t, l, p, ledger.Done).Job.Response
	if !got.Stored || string(got.Body) != "data: 1\n\n" || got.Size != 9 || got.Status != 200 {
		t.Errorf("stored stream = %+v", got)
	}
	// A body that was cut short is recorded as not stored.
	q := params(long)
	rq := reserve(t, l, q, ledger.Created)
	if c, err := l.Complete(ctx(t), rq.Attempt.Ref(), head); err != nil || !c.Won {
		t.Fatal(err)
	}
	if err := l.SaveBody(ctx(t), rq.Attempt.Ref(), []byte("partial"), 1<<30, false); err != nil {
		t.Fatal(err)
	}
	got = reserve(t, l, q, ledger.Done).Job.Response
	if got.Stored || len(got.Body) != 0 || got.Size != 1<<30 {
		t.Errorf("unstored answer = %+v", got)
	}
	// Only the winner may save a body.
	hq := params(long)
	rh := reserve(t, l, hq, ledger.Created)
	hedge, err := l.Hedge(ctx(t), rh.Attempt.Ref(), next("b", long))
	if err != nil {
		t.Fatal(err)
	}
	complete(t, l, &hedge, "winner", true)
	complete(t, l, rh.Attempt, "loser", false)
	if err := l.SaveBody(ctx(t), rh.Attempt.Ref(), []byte("loser"), 5, true); err == nil {
		t.Errorf("a lost attempt saved its body")
	}
	if b := reserve(t, l, hq, ledger.Done).Job.Response.Body; string(b) != "winner" {
		t.Errorf("replay = %q", b)
	}
}
