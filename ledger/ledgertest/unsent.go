package ledgertest

import (
	"errors"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// testUnsent: an attempt the gateway never sent is failed, not unknown,
// and a retry may run the request.
func testUnsent(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.Unsent(ctx(t), r.Attempt.Ref()); err != nil {
		t.Fatal(err)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobFailed, ledger.AttemptFailed)
	if a := attempt(t, j, 1); a.Error != ledger.ReasonUnsent {
		t.Errorf("unsent attempt's error = %q", a.Error)
	}
	if err := l.Unsent(ctx(t), r.Attempt.Ref()); err != nil {
		t.Errorf("repeated Unsent: %v", err)
	}
	reserve(t, l, p, ledger.Reopened)
	// Beside a running hedge the job stays pending.
	q := params(long)
	rq := reserve(t, l, q, ledger.Created)
	hedge, err := l.Hedge(ctx(t), rq.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unsent(ctx(t), hedge.Ref()); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, rq.Job.ID), ledger.JobPending, ledger.AttemptStarting, ledger.AttemptFailed)
}

// testUnsentAfterLease: the proof that an attempt was never sent settles
// it even after its lease made it unknown.
func testUnsentAfterLease(t *testing.T, h Harness) {
	l := h.New(t)
	r := reserve(t, l, params(short), ledger.Created)
	eventually(t, "the lease runs out", func() bool { return job(t, l, r.Job.ID).State == ledger.JobUnknown })
	if err := l.Unsent(ctx(t), r.Attempt.Ref()); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptFailed)
}

// testUnsentTouched: the proof that an attempt was never sent settles it
// whatever made it unknown: its attempt_timeout may end before the dial
// fails, and the gateway's own mark comes first. An attempt that won is
// not the never-sent attempt; one the lease made unknown is, whatever
// happened to the job since: a re-send that completed the job leaves the
// job completed, and the never-sent attempt failed.
func testUnsentTouched(t *testing.T, h Harness) {
	l := h.New(t)
	r := reserve(t, l, params(short), ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the deadline passes", func() bool { return !job(t, l, r.Job.ID).ReadAt.Before(r.Attempt.Deadline) })
	if err := l.Unsent(ctx(t), r.Attempt.Ref()); err != nil {
		t.Errorf("Unsent of an attempt that timed out before its dial failed: %v", err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptFailed)
	// A completed job is never touched.
	q := reserve(t, l, params(long), ledger.Created)
	complete(t, l, q.Attempt, "done", true)
	if err := l.Unsent(ctx(t), q.Attempt.Ref()); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("Unsent of the winner: err = %v, want ErrStale", err)
	}

	u := reserve(t, l, params(short), ledger.Created)
	eventually(t, "the lease runs out", func() bool { return job(t, l, u.Job.ID).State == ledger.JobUnknown })
	rs, err := l.Resend(ctx(t), u.Attempt.Ref(), next("primary", long))
	if err != nil {
		t.Fatal(err)
	}
	complete(t, l, &rs, "deduplicated", true)
	if err := l.Unsent(ctx(t), u.Attempt.Ref()); err != nil {
		t.Fatalf("Unsent of a never-sent attempt a re-send reconciled: %v", err)
	}
	j := job(t, l, u.Job.ID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptFailed, ledger.AttemptSucceeded)
	if a := attempt(t, j, 1); a.Error != ledger.ReasonUnsent {
		t.Errorf("the never-sent attempt's error is %q, want %q", a.Error, ledger.ReasonUnsent)
	}
}
