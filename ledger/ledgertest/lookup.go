package ledgertest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// unknownPastDeadline reserves a job whose attempt times out and waits until
// its attempt_deadline passed: what a reconciler's lookup may settle.
func unknownPastDeadline(t *testing.T, l ledger.Ledger) (ledger.ReserveParams, ledger.Reservation) {
	t.Helper()
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	if a := attempt(t, job(t, l, r.Job.ID), 1); a.Lookup != nil {
		t.Errorf("an attempt no lookup touched reads with a lookup record: %+v", *a.Lookup)
	}
	eventually(t, "the attempt's deadline passes", func() bool {
		j := job(t, l, r.Job.ID)
		return !j.ReadAt.IsZero() && !j.ReadAt.Before(r.Attempt.Deadline)
	})
	return p, r
}

// testLookupCompletes: a lookup is leased to one holder at a time; an
// answer it cannot judge leaves the attempt unknown until its next try is
// due; a found answer completes the job with it (lookup-complete), and a
// retry replays it.
func testLookupCompletes(t *testing.T, h Harness) {
	l := h.New(t)
	p, r := unknownPastDeadline(t, l)
	ref := r.Attempt.Ref()

	if _, err := l.ClaimLookup(ctx(t), ref, "r1", long); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ClaimLookup(ctx(t), ref, "r2", long); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a second holder's claim: %v, want ErrStale", err)
	}
	if _, err := l.SettleLookup(ctx(t), ref, "r2", ledger.LookupResult{Absent: true, Status: 404}); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("settled by a holder without the lease: %v, want ErrStale", err)
	}
	j, err := l.SettleLookup(ctx(t), ref, "r1", ledger.LookupResult{Status: 503, Retry: long})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, j, ledger.JobUnknown, ledger.AttemptUnknown)
	a1 := attempt(t, job(t, l, r.Job.ID), 1)
	lk := a1.Lookups()
	if lk.Tries != 1 || lk.LastStatus != 503 || lk.Settled || lk.LastAt.IsZero() || lk.NextAt.Sub(lk.LastAt) != long {
		t.Errorf("after a lookup answered 503: %+v", lk)
	}
	if _, err := l.ClaimLookup(ctx(t), ref, "r3", long); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a claim before the next lookup is due: %v, want ErrStale", err)
	}
	reserve(t, l, p, ledger.Unknown)

	// A lookup without a claim is refused; one claimed finds the
	// provider's answer, which completes the job.
	_, r2 := unknownPastDeadline(t, l)
	ref2 := r2.Attempt.Ref()
	if _, err := l.SettleLookup(ctx(t), ref2, "r4", ledger.LookupResult{Status: 500}); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a lookup settled without a claim: %v, want ErrStale", err)
	}
	if _, err := l.SettleLookup(ctx(t), ref2, "r4", ledger.LookupResult{Status: 200, Retry: 0}); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a lookup settled without a claim: %v, want ErrStale", err)
	}
	// Nor is one by no holder at all: it is no repeat of a recorded lookup.
	if _, err := l.SettleLookup(ctx(t), ref2, "", ledger.LookupResult{Status: 404, Absent: true}); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a lookup settled by no holder without a claim: %v, want ErrStale", err)
	}
	if _, err := l.ClaimLookup(ctx(t), ref2, "r4", long); err != nil {
		t.Fatal(err)
	}
	found := response("the provider's record")
	found.Status = 200
	j, err = l.SettleLookup(ctx(t), ref2, "r4", ledger.LookupResult{Status: 200, Found: &found})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, j, ledger.JobCompleted, ledger.AttemptSucceeded)
	if j.CompletedBy != r2.Attempt.ID || j.Version != r2.Job.Version+1 {
		t.Errorf("completed by %q at version %d, want %s at %d", j.CompletedBy, j.Version, r2.Attempt.ID, r2.Job.Version+1)
	}
	a := attempt(t, job(t, l, r2.Job.ID), 1)
	if lk := a.Lookups(); !lk.Settled || lk.Tries != 1 || lk.LastStatus != 200 || a.Reconciled(j) != "lookup" {
		t.Errorf("the settled attempt: %+v, reconciled %q", lk, a.Reconciled(j))
	}
	// Replays carry the lookup's answer.
	done := reserve(t, l, ledger.ReserveParams{OwnerHash: r2.Job.OwnerHash, KeyHash: r2.Job.KeyHash,
		Fingerprint: r2.Job.Fingerprint, FingerprintVersion: r2.Job.FingerprintVersion,
		FingerprintScheme: r2.Job.FingerprintScheme, Retention: time.Hour, Attempt: next("primary", long)}, ledger.Done)
	if done.Job.Response == nil || string(done.Job.Response.Body) != "the provider's record" || done.Job.Response.Status != 200 {
		t.Errorf("replayed answer %+v, want the lookup's", done.Job.Response)
	}
	// The attempt won through its lookup: its own late answer is a repeat
	// of the winner's and changes nothing.
	if c := complete(t, l, r2.Attempt, "late", true); string(c.Job.Response.Body) != "the provider's record" {
		t.Errorf("after the original's late answer the job holds %q", c.Job.Response.Body)
	}
	if _, err := l.ClaimLookup(ctx(t), ref2, "r5", long); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a claim on a settled attempt: %v, want ErrStale", err)
	}
}

// testLookupAbsent: no lookup before attempt_deadline; then a lookup that
// finds no trace fails the attempt and the job (lookup-fail), so a retry
// starts a new attempt.
func testLookupAbsent(t *testing.T, h Harness) {
	l := h.New(t)
	// Not before attempt_deadline: the original may still act until then.
	early := reserve(t, l, params(long), ledger.Created)
	if err := l.MarkUnknown(ctx(t), early.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ClaimLookup(ctx(t), early.Attempt.Ref(), "early", long); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("ClaimLookup before attempt_deadline: %v, want ErrStale", err)
	}
	p, r := unknownPastDeadline(t, l)
	if _, err := l.ClaimLookup(ctx(t), r.Attempt.Ref(), "r1", long); err != nil {
		t.Fatal(err)
	}
	j, err := l.SettleLookup(ctx(t), r.Attempt.Ref(), "r1", ledger.LookupResult{Status: 404, Absent: true})
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, j, ledger.JobFailed, ledger.AttemptFailed)
	if a := attempt(t, j, 1); a.Error != ledger.ReasonAbsent || a.Reconciled(j) != "lookup" {
		t.Errorf("attempt after an absent lookup: error %q, reconciled %q", a.Error, a.Reconciled(j))
	}
	reserve(t, l, p, ledger.Reopened)
}

// testLookupAbsentThenResult: a lookup answered absent and failed the job,
// then the attempt's own answer arrives after all. The answer loses, but it
// proves the provider acted: the job is unknown again, expires no more, and
// a retry is refused instead of re-opening it (SPEC section 1, rule 1).
func testLookupAbsentThenResult(t *testing.T, h Harness) {
	l := h.New(t)
	p, r := unknownPastDeadline(t, l)
	if _, err := l.ClaimLookup(ctx(t), r.Attempt.Ref(), "r1", long); err != nil {
		t.Fatal(err)
	}
	if _, err := l.SettleLookup(ctx(t), r.Attempt.Ref(), "r1", ledger.LookupResult{Status: 404, Absent: true}); err != nil {
		t.Fatal(err)
	}
	if c := complete(t, l, r.Attempt, "acted after all", false); c.Job.State != ledger.JobUnknown {
		t.Errorf("the losing completion answers with the job %s, want unknown", c.Job.State)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobUnknown, ledger.AttemptLost)
	if !j.ExpiresAt.IsZero() || !j.CompletedAt.IsZero() {
		t.Errorf("the unknown job still expires at %v (settled at %v)", j.ExpiresAt, j.CompletedAt)
	}
	reserve(t, l, p, ledger.Unknown)
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptLost)
}

// testLookupOneHolder: instances claiming the same attempt at once get it
// once; a lease that ran out lets another holder take it, and the first
// holder's late answer is refused.
func testLookupOneHolder(t *testing.T, h Harness) {
	l := h.New(t)
	peer := h.Peer(t, l)
	_, r := unknownPastDeadline(t, l)
	ref := r.Attempt.Ref()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		holds []string
	)
	for i, inst := range []ledger.Ledger{l, peer, l, peer, l, peer} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			holder := string(rune('a' + i))
			// A lease no slow machine outlasts: only one claim may win.
			if _, err := inst.ClaimLookup(ctx(t), ref, holder, long); err == nil {
				mu.Lock()
				holds = append(holds, holder)
				mu.Unlock()
			} else if !errors.Is(err, ledger.ErrStale) {
				t.Errorf("claim %s: %v", holder, err)
			}
		}()
	}
	wg.Wait()
	if len(holds) != 1 {
		t.Fatalf("holders after concurrent claims: %v, want one", holds)
	}
	// The holder finds nothing to judge; the next lookup is due at once.
	if _, err := l.SettleLookup(ctx(t), ref, holds[0], ledger.LookupResult{Status: 503}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.ClaimLookup(ctx(t), ref, "brief", short); err != nil {
		t.Fatal(err)
	}
	// Waited for by reading, not by claiming: a claim refused an instant
	// before the lease ran out and repeated an instant after would rightly
	// succeed the second time.
	eventually(t, "the brief holder's lease runs out", func() bool {
		j := job(t, peer, r.Job.ID)
		a := attempt(t, j, 1)
		return !j.ReadAt.IsZero() && !j.ReadAt.Before(a.Lookups().Until)
	})
	if _, err := peer.ClaimLookup(ctx(t), ref, "late", long); err != nil {
		t.Fatalf("a claim once the lease ran out: %v", err)
	}
	if _, err := l.SettleLookup(ctx(t), ref, "brief", ledger.LookupResult{Status: 404, Absent: true}); !errors.Is(err, ledger.ErrStale) {
		t.Errorf("a lookup settled after its lease ran out: %v, want ErrStale", err)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobUnknown, ledger.AttemptUnknown)
	if a := attempt(t, j, 1); a.Lookups().Tries != 1 || a.Lookups().Holder != "late" {
		t.Errorf("lookup record after two holders: %+v", a.Lookups())
	}
}
