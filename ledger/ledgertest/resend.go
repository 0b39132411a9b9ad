package ledgertest

import (
	"errors"
	"slices"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// testResend: a re-send reconciles an unknown attempt: it starts only
// while nothing is starting and no result won, one at a time, makes the job
// pending again, and its answer settles the job by the usual CAS; a failed
// re-send leaves the job unknown, blocked by the attempt it reconciled.
func testResend(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)

	// Attempt 1 is still starting: nothing to reconcile yet.
	if _, err := l.Resend(ctx(t), r.Attempt.Ref(), next("primary", long)); !errors.Is(err, ledger.ErrStale) {
		t.Fatalf("Resend beside a starting attempt: %v, want ErrStale", err)
	}
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "connection reset"); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)

	first, err := l.Resend(ctx(t), r.Attempt.Ref(), next("primary", long))
	if err != nil {
		t.Fatal(err)
	}
	if !first.Resend || first.Number != 2 || first.State != ledger.AttemptStarting || first.Provider != "primary" ||
		first.JobVersion != r.Attempt.JobVersion {
		t.Errorf("re-send: %s, resend %v", attemptSummary(&first), first.Resend)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobPending, ledger.AttemptUnknown, ledger.AttemptStarting)
	if a := attempt(t, j, 2); !a.Resend || attempt(t, j, 1).Resend {
		t.Errorf("stored resend flags: attempt 1 %v, attempt 2 %v", attempt(t, j, 1).Resend, a.Resend)
	}
	// One re-send at a time; a duplicate meanwhile is in flight.
	if _, err := l.Resend(ctx(t), r.Attempt.Ref(), next("primary", long)); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a second re-send while one runs: %v, want ErrStale", err)
	}
	reserve(t, l, p.WithNewIDs(), ledger.InFlight)

	// The provider said the original is still in progress: the re-send
	// failed, the job is unknown again, and another re-send may start.
	if _, err := l.Fail(ctx(t), first.Ref(), "409 in progress", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown, ledger.AttemptFailed)
	reserve(t, l, p.WithNewIDs(), ledger.Unknown)

	second, err := l.Resend(ctx(t), r.Attempt.Ref(), next("primary", long))
	if err != nil {
		t.Fatal(err)
	}
	c := complete(t, l, &second, "deduplicated answer", true)
	if c.Job.CompletedBy != second.ID {
		t.Errorf("completed by %s, want the re-send %s", c.Job.CompletedBy, second.ID)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobCompleted, ledger.AttemptUnknown, ledger.AttemptFailed, ledger.AttemptSucceeded)
	// The original's late answer loses; nothing more is re-sent.
	complete(t, l, r.Attempt, "the original's answer", false)
	if _, err := l.Resend(ctx(t), r.Attempt.Ref(), next("primary", long)); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("Resend after the job completed: %v, want ErrStale", err)
	}
}

// testResendAfterOperator: an operator's cancel (which moves the version)
// stands: no re-send reconciles an attempt from before it.
func testResendAfterOperator(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "connection reset"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Cancel: true, AttemptID: ledger.NewID()}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Resend(ctx(t), r.Attempt.Ref(), next("primary", long)); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("Resend after a cancel: %v, want ErrStale", err)
	}
	if _, err := l.Resend(ctx(t), ledger.AttemptRef{JobID: r.Job.ID, AttemptID: ledger.NewID(), Version: r.Attempt.JobVersion},
		next("primary", long)); !errors.Is(err, ledger.ErrNotFound) && !errors.Is(err, ledger.ErrStale) {
		t.Errorf("Resend of an attempt the job does not have: %v", err)
	}
}

// testAttemptScopes: every attempt records the handler scope it started
// under, however it started (a reservation, a re-opening, a failover, a
// hedge, a re-send), and every read returns it.
func testAttemptScopes(t *testing.T, h Harness) {
	l := h.New(t)
	scoped := func(provider, scope string) ledger.NextAttempt {
		n := next(provider, long)
		n.Scope = scope
		return n
	}
	p := params(long)
	p.Attempt = scoped("api", "site")
	r := reserve(t, l, p, ledger.Created)
	fo, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", ptr(scoped("fallback", "site")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Fail(ctx(t), fo.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	p = p.WithNewIDs()
	p.Attempt = scoped("api", "site#2")
	re := reserve(t, l, p, ledger.Reopened)
	hedge, err := l.Hedge(ctx(t), re.Attempt.Ref(), scoped("hedge", "site#2"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Fail(ctx(t), hedge.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	if err := l.MarkUnknown(ctx(t), re.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	rs, err := l.Resend(ctx(t), re.Attempt.Ref(), scoped("api", "site#2"))
	if err != nil {
		t.Fatal(err)
	}
	for what, got := range map[string]string{"reserve": r.Attempt.Scope, "failover": fo.Scope,
		"re-open": re.Attempt.Scope, "hedge": hedge.Scope, "re-send": rs.Scope} {
		if want := map[bool]string{true: "site", false: "site#2"}[what == "reserve" || what == "failover"]; got != want {
			t.Errorf("the %s's attempt has scope %q, want %q", what, got, want)
		}
	}

	want := []string{"site", "site", "site#2", "site#2", "site#2"}
	scopes := func(j *ledger.Job) []string {
		s := make([]string, len(j.Attempts))
		for i := range j.Attempts {
			s[i] = j.Attempts[i].Scope
		}
		return s
	}
	found := find(t, l, p)
	page, err := l.Jobs(ctx(t), ledger.JobQuery{Provider: "hedge"})
	if err != nil || len(page.Jobs) != 1 {
		t.Fatalf("Jobs: %d jobs, %v", len(page.Jobs), err)
	}
	for what, j := range map[string]*ledger.Job{"Job": job(t, l, r.Job.ID), "Find": found, "Jobs": page.Jobs[0]} {
		if got := scopes(j); !slices.Equal(got, want) {
			t.Errorf("%s: the attempts' scopes are %q, want %q", what, got, want)
		}
	}
}
