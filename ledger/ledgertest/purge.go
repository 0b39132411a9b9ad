package ledgertest

import (
	"errors"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// RunPurge checks a ledger.Purger: a purge removes the owner's settled
// jobs and nothing else, keeps its pending and unknown ones and an answer
// still streaming (until its body is saved), and a repeat removes nothing
// more. Run it beside Run for a ledger that
// implements ledger.Purger.
func RunPurge(t *testing.T, h Harness) {
	l := h.New(t)
	pl, ok := l.(ledger.Purger)
	if !ok {
		t.Fatalf("%T does not implement ledger.Purger", l)
	}
	owner := randBytes(32)
	mine := func(lease ledger.ReserveParams) ledger.ReserveParams {
		lease.OwnerHash = owner
		return lease
	}

	// The owner's jobs: completed (and replayed once, so any cache in
	// the process holds it), failed, pending, and unknown.
	pDone := mine(params(long))
	done := reserve(t, l, pDone, ledger.Created)
	complete(t, l, done.Attempt, "private answer", true)
	if r := reserve(t, l, pDone, ledger.Done); string(r.Job.Response.Body) != "private answer" {
		t.Fatalf("replay %q", r.Job.Response.Body)
	}
	// Another instance replays one, once its notifications are up (its
	// Wait returns then), so that it keeps the answer if it can.
	peer := h.Peer(t, l)
	pShared := mine(params(long))
	shared := reserve(t, l, pShared, ledger.Created)
	complete(t, l, shared.Attempt, "answer replayed elsewhere", true)
	if _, err := peer.Wait(ctx(t), shared.Job.ID); err != nil {
		t.Fatal(err)
	}
	reserve(t, peer, pShared, ledger.Done)
	pFailed := mine(params(long))
	failed := reserve(t, l, pFailed, ledger.Created)
	if _, err := l.Fail(ctx(t), failed.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	pPending := mine(params(long))
	pending := reserve(t, l, pPending, ledger.Created)
	// An answer that won while it streams, its body not saved yet: its
	// first client still reads it.
	pStream := mine(params(long))
	stream := reserve(t, l, pStream, ledger.Created)
	if c, err := l.Complete(ctx(t), stream.Attempt.Ref(), ledger.Response{Status: 200, Size: -1}); err != nil || !c.Won {
		t.Fatalf("Complete a stream's head: %v %v", c.Won, err)
	}
	// One whose attempt's lease ran out: its gateway stopped before the
	// end, and it is settled like any.
	lapsed := reserve(t, l, mine(params(short)), ledger.Created)
	if c, err := l.Complete(ctx(t), lapsed.Attempt.Ref(), ledger.Response{Status: 200, Size: -1}); err != nil || !c.Won {
		t.Fatalf("Complete a stream's head: %v %v", c.Won, err)
	}
	pUnknown := mine(params(short))
	unknown := reserve(t, l, pUnknown, ledger.Created)
	// Another owner's job with the same key as the completed one.
	pOther := pDone
	pOther.OwnerHash = randBytes(32)
	other := reserve(t, l, pOther, ledger.Created)
	complete(t, l, other.Attempt, "other's answer", true)
	eventually(t, "the short lease reads unknown", func() bool { return job(t, l, unknown.Job.ID).State == ledger.JobUnknown })
	eventually(t, "the lapsed stream's lease runs out", func() bool { return !job(t, l, lapsed.Job.ID).ReadAt.Before(lapsed.Attempt.Deadline) })

	st, err := pl.Purge(ctx(t), owner)
	if err != nil {
		t.Fatal(err)
	}
	if st != (ledger.PurgeStats{Removed: 4, Kept: 3}) {
		t.Errorf("purge: %+v, want 4 removed and 3 kept (pending, unknown, streaming)", st)
	}
	for _, id := range []string{done.Job.ID, shared.Job.ID, failed.Job.ID, lapsed.Job.ID} {
		for _, x := range []ledger.Ledger{l, peer} {
			if _, err := x.Job(ctx(t), id); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("purged job %s: err = %v, want ErrNotFound", id, err)
			}
		}
	}
	wantNotFound(t, l, pDone.OwnerHash, pDone.KeyHash, "a purged job")
	page, err := l.Jobs(ctx(t), ledger.JobQuery{Limit: ledger.MaxLimit})
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range page.Jobs {
		if j.ID == done.Job.ID || j.ID == failed.Job.ID {
			t.Errorf("Jobs lists purged job %s", j.ID)
		}
	}
	if j := job(t, l, pending.Job.ID); j.State != ledger.JobPending {
		t.Errorf("pending job: %s", j.State)
	}
	if j := job(t, l, unknown.Job.ID); j.State != ledger.JobUnknown {
		t.Errorf("unknown job: %s", j.State)
	}
	if j := job(t, l, stream.Job.ID); j.State != ledger.JobCompleted {
		t.Errorf("streaming job: %s", j.State)
	}
	wantDone := func(p ledger.ReserveParams, what string) {
		t.Helper()
		if r := reserve(t, l, p, ledger.Done); r.Job.ID != stream.Job.ID {
			t.Errorf("%s: the key is a new intent", what)
		}
	}
	wantDone(pStream, "a purge while the answer streams")
	if r := reserve(t, l, pOther, ledger.Done); string(r.Job.Response.Body) != "other's answer" {
		t.Errorf("another owner's job: %q", r.Job.Response.Body)
	}
	// A purged key is a new intent, on this instance (whatever it held in
	// memory) as on the store.
	if r := reserve(t, l, pDone, ledger.Created); r.Job.ID == done.Job.ID {
		t.Errorf("the purged job %s came back", r.Job.ID)
	}
	reserve(t, l, pFailed, ledger.Created)
	// The other instance hears of the purge: it replays the purged answer
	// no more, and the key is a new intent there too.
	eventually(t, "the other instance forgets the purged answer", func() bool {
		r, err := peer.Reserve(ctx(t), fresh(pShared))
		if err != nil {
			t.Fatal(err)
		}
		return r.Outcome == ledger.Created
	})

	// A repeat removes nothing more; the new jobs are pending, and the
	// answer still streams.
	if st, err := pl.Purge(ctx(t), owner); err != nil || st != (ledger.PurgeStats{Removed: 0, Kept: 6}) {
		t.Errorf("repeated purge: %+v, %v; want 0 removed and 6 kept", st, err)
	}
	wantDone(pStream, "a repeated purge while the answer streams")
	// Once its body is saved, the streamed answer is settled like any.
	if err := l.SaveBody(ctx(t), stream.Attempt.Ref(), []byte("data: 1\n\n"), 9, true); err != nil {
		t.Fatal(err)
	}
	if st, err := pl.Purge(ctx(t), owner); err != nil || st != (ledger.PurgeStats{Removed: 1, Kept: 5}) {
		t.Errorf("purge after the stream ended: %+v, %v; want 1 removed and 5 kept", st, err)
	}
	if st, err := pl.Purge(ctx(t), randBytes(32)); err != nil || st != (ledger.PurgeStats{}) {
		t.Errorf("purge of an owner with no job: %+v, %v", st, err)
	}
}
