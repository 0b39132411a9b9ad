package ledgertest

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/onejob/onejob/ledger"
)

func testList(t *testing.T, h Harness) {
	l := h.New(t)
	var ids []string
	for i := range 5 {
		p := params(long)
		if i == 4 {
			p.Attempt.Provider = "special"
		}
		r := reserve(t, l, p, ledger.Created)
		ids = append(ids, r.Job.ID)
		if i%2 == 0 {
			complete(t, l, r.Attempt, "x", true)
		}
	}
	var got []string
	cursor := ""
	for pages := 0; ; pages++ {
		page, err := l.Jobs(ctx(t), ledger.JobQuery{Limit: 2, Before: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(page.Jobs) > 2 {
			t.Fatalf("page of %d jobs, limit 2", len(page.Jobs))
		}
		for _, j := range page.Jobs {
			got = append(got, j.ID)
		}
		if page.Next == "" || pages > 5 {
			break
		}
		cursor = page.Next
	}
	want := []string{ids[4], ids[3], ids[2], ids[1], ids[0]}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("listing = %v, want newest first %v", got, want)
	}
	page, err := l.Jobs(ctx(t), ledger.JobQuery{State: ledger.JobCompleted})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Jobs) != 3 || page.Next != "" {
		t.Errorf("completed jobs: %d (next %q), want 3", len(page.Jobs), page.Next)
	}
	for _, j := range page.Jobs {
		if j.State != ledger.JobCompleted {
			t.Errorf("state filter let %s through", j.State)
		}
	}
	page, err = l.Jobs(ctx(t), ledger.JobQuery{Provider: "special"})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Jobs) != 1 || page.Jobs[0].ID != ids[4] {
		t.Errorf("provider filter = %d jobs", len(page.Jobs))
	}
}

func testSweep(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	q := params(long)
	q.Retention = short
	rq := reserve(t, l, q, ledger.Created)
	complete(t, l, rq.Attempt, "x", true)
	keep := reserve(t, l, params(long), ledger.Created)

	total := ledger.SweepStats{}
	eventually(t, "a sweep records the lease and removes the expired job", func() bool {
		st, err := l.Sweep(ctx(t), 100)
		if err != nil {
			t.Fatal(err)
		}
		total.Unknown += st.Unknown
		total.Removed += st.Removed
		return total.Unknown >= 1 && total.Removed >= 1
	})
	if total.Unknown != 1 || total.Removed != 1 {
		t.Errorf("sweeps recorded %+v, want 1 unknown and 1 removed", total)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)
	if _, err := l.Job(ctx(t), rq.Job.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("expired job still there: %v", err)
	}
	wantState(t, job(t, l, keep.Job.ID), ledger.JobPending, ledger.AttemptStarting)
}

func testNotFound(t *testing.T, h Harness) {
	l := h.New(t)
	id := ledger.NewID()
	if _, err := l.Job(ctx(t), id); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Job: %v", err)
	}
	if _, err := l.Resolve(ctx(t), id, ledger.Resolution{Cancel: true}); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Resolve: %v", err)
	}
	if _, err := l.Wait(ctx(t), id); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Wait: %v", err)
	}
	ref := ledger.AttemptRef{JobID: id, AttemptID: ledger.NewID(), Version: 1}
	if _, err := l.Complete(ctx(t), ref, response("x")); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Complete: %v", err)
	}
	if _, err := l.Job(ctx(t), "not-a-uuid"); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Job(not-a-uuid): %v", err)
	}
}

func find(t *testing.T, l ledger.Ledger, p ledger.ReserveParams) *ledger.Job {
	t.Helper()
	j, err := l.Find(ctx(t), p.OwnerHash, p.KeyHash)
	if err != nil {
		t.Fatalf("Find: %v", err)
	}
	if j.ReadAt.IsZero() {
		t.Errorf("Find: no ReadAt")
	}
	return j
}

func wantNotFound(t *testing.T, l ledger.Ledger, owner, key []byte, what string) {
	t.Helper()
	if j, err := l.Find(ctx(t), owner, key); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("Find %s = %+v, %v; want ErrNotFound", what, j, err)
	}
}

// sameJob reports how got (from Find) differs from want (from Job).
func sameJob(got, want *ledger.Job) string {
	var d []string
	check := func(what string, ok bool, g, w any) {
		if !ok {
			d = append(d, fmt.Sprintf("%s %v, want %v", what, g, w))
		}
	}
	check("id", got.ID == want.ID, got.ID, want.ID)
	check("owner", bytes.Equal(got.OwnerHash, want.OwnerHash), got.OwnerHash, want.OwnerHash)
	check("key", bytes.Equal(got.KeyHash, want.KeyHash), got.KeyHash, want.KeyHash)
	check("fingerprint", bytes.Equal(got.Fingerprint, want.Fingerprint) && got.FingerprintVersion == want.FingerprintVersion &&
		got.FingerprintScheme == want.FingerprintScheme,
		fmt.Sprintf("%x v%d %q", got.Fingerprint, got.FingerprintVersion, got.FingerprintScheme),
		fmt.Sprintf("%x v%d %q", want.Fingerprint, want.FingerprintVersion, want.FingerprintScheme))
	check("state", got.State == want.State, got.State, want.State)
	check("version", got.Version == want.Version, got.Version, want.Version)
	check("completed by", got.CompletedBy == want.CompletedBy, got.CompletedBy, want.CompletedBy)
	check("retention", got.Retention == want.Retention, got.Retention, want.Retention)
	check("created", got.CreatedAt.Equal(want.CreatedAt), got.CreatedAt, want.CreatedAt)
	check("completed", got.CompletedAt.Equal(want.CompletedAt), got.CompletedAt, want.CompletedAt)
	check("expires", got.ExpiresAt.Equal(want.ExpiresAt), got.ExpiresAt, want.ExpiresAt)
	switch {
	case (got.Response == nil) != (want.Response == nil):
		d = append(d, fmt.Sprintf("response %+v, want %+v", got.Response, want.Response))
	case got.Response != nil:
		g, w := got.Response, want.Response
		check("response", g.Status == w.Status && bytes.Equal(g.Body, w.Body) && g.Size == w.Size && g.Stored == w.Stored &&
			fmt.Sprint(g.Header) == fmt.Sprint(w.Header), *g, *w)
	}
	if len(got.Attempts) != len(want.Attempts) {
		return strings.Join(append(d, fmt.Sprintf("%d attempts, want %d", len(got.Attempts), len(want.Attempts))), "; ")
	}
	for i := range got.Attempts {
		g, w := got.Attempts[i], want.Attempts[i]
		ok := g.ID == w.ID && g.JobID == w.JobID && g.Number == w.Number && g.Provider == w.Provider &&
			g.State == w.State && g.JobVersion == w.JobVersion && g.Error == w.Error &&
			g.StartedAt.Equal(w.StartedAt) && g.Deadline.Equal(w.Deadline) && g.FinishedAt.Equal(w.FinishedAt)
		check(fmt.Sprintf("attempt %d", i+1), ok, g, w)
	}
	return strings.Join(d, "; ")
}

// testFind: Find reads the job of (owner, key) as Job does, attempts
// included, at every stage of its life.
func testFind(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	check := func(stage string) *ledger.Job {
		t.Helper()
		got := find(t, l, p)
		if d := sameJob(got, job(t, l, r.Job.ID)); d != "" {
			t.Errorf("%s: Find differs from Job: %s", stage, d)
		}
		return got
	}
	wantState(t, check("created"), ledger.JobPending, ledger.AttemptStarting)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	wantState(t, check("hedged"), ledger.JobPending, ledger.AttemptStarting, ledger.AttemptStarting)
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	complete(t, l, &hedge, "found", true)
	j := check("completed")
	wantState(t, j, ledger.JobCompleted, ledger.AttemptFailed, ledger.AttemptSucceeded)
	if j.Response == nil || string(j.Response.Body) != "found" || j.ExpiresAt.IsZero() {
		t.Errorf("completed job found with response %+v, expires %v", j.Response, j.ExpiresAt)
	}
	// A failed job, and one whose outcome is unknown.
	q := params(long)
	rq := reserve(t, l, q, ledger.Created)
	if _, err := l.Fail(ctx(t), rq.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, find(t, l, q), ledger.JobFailed, ledger.AttemptFailed)
	u := params(long)
	ru := reserve(t, l, u, ledger.Created)
	if err := l.MarkUnknown(ctx(t), ru.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	wantState(t, find(t, l, u), ledger.JobUnknown, ledger.AttemptUnknown)
}

// testFindPerOwner: the lookup is by owner and key together: another
// owner's key, another key of the owner and an unknown pair are not found,
// and two owners' jobs under one key are each found by their own owner.
func testFindPerOwner(t *testing.T, h Harness) {
	l := h.New(t)
	a := params(long)
	ra := reserve(t, l, a, ledger.Created)
	wantNotFound(t, l, randBytes(32), a.KeyHash, "another owner, same key")
	wantNotFound(t, l, a.OwnerHash, randBytes(32), "same owner, another key")
	wantNotFound(t, l, a.KeyHash, a.OwnerHash, "owner and key swapped")
	wantNotFound(t, l, randBytes(32), randBytes(32), "nobody's key")
	b := a
	b.OwnerHash = randBytes(32)
	rb := reserve(t, l, b, ledger.Created)
	complete(t, l, ra.Attempt, "A's answer", true)
	if j := find(t, l, a); j.ID != ra.Job.ID || j.State != ledger.JobCompleted {
		t.Errorf("owner A finds job %s %s, want %s completed", j.ID, j.State, ra.Job.ID)
	}
	if j := find(t, l, b); j.ID != rb.Job.ID || j.State != ledger.JobPending || j.Response != nil {
		t.Errorf("owner B finds job %s %s response %+v, want its own pending %s", j.ID, j.State, j.Response, rb.Job.ID)
	}
}

// testFindExpired: a job whose retention passed is not found, and its
// key's next job is. (The renewal is of a failed job: a completed one's
// answer may be cached for replays up to its expiry, which is not what
// this test is about.)
func testFindExpired(t *testing.T, h Harness) {
	l := h.New(t)
	expire := func(p ledger.ReserveParams, settle func(r ledger.Reservation)) ledger.Reservation {
		t.Helper()
		r := reserve(t, l, p, ledger.Created)
		settle(r)
		eventually(t, "the job expires", func() bool {
			_, err := l.Job(ctx(t), r.Job.ID)
			return errors.Is(err, ledger.ErrNotFound)
		})
		wantNotFound(t, l, p.OwnerHash, p.KeyHash, "after expiry")
		return r
	}
	p := params(long)
	p.Retention = short
	expire(p, func(r ledger.Reservation) { complete(t, l, r.Attempt, "old", true) })
	q := params(long)
	q.Retention = short
	old := expire(q, func(r ledger.Reservation) {
		if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err != nil {
			t.Fatal(err)
		}
	})
	renewed := reserve(t, l, q, ledger.Created)
	if j := find(t, l, q); j.ID != renewed.Job.ID || j.ID == old.Job.ID || len(j.Attempts) != 1 || j.State != ledger.JobPending {
		t.Errorf("after the key's renewal Find = job %s %s, %d attempts; want the new job %s",
			j.ID, j.State, len(j.Attempts), renewed.Job.ID)
	}
}

// testFindLease: a starting attempt whose lease ran out reads as unknown
// through Find itself, by the ledger's clock, with no other read or sweep.
func testFindLease(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	reserve(t, l, p, ledger.Created)
	var j *ledger.Job
	eventually(t, "Find sees the lease run out", func() bool {
		j = find(t, l, p)
		return j.State != ledger.JobPending
	})
	wantState(t, j, ledger.JobUnknown, ledger.AttemptUnknown)
	if a := attempt(t, j, 1); j.ReadAt.Before(a.Deadline) || a.Error != ledger.ReasonLeaseExpired {
		t.Errorf("unknown at %v, before the deadline %v (error %q)", j.ReadAt, a.Deadline, a.Error)
	}
}
