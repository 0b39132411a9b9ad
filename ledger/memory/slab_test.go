package memory

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// colliding returns a ledger whose identities and ids all hash alike: one
// of each in the hashed map, the rest in the clash map.
func colliding(t *testing.T) ledger.Ledger {
	l := New()
	same := func(string) uint64 { return 7 }
	l.byKey.hash, l.byID.hash = same, same
	t.Cleanup(func() { l.Close() })
	return l
}

// The whole suite passes when every name clashes with another's hash.
func TestMemoryHashesCollide(t *testing.T) {
	h := ledgertest.Harness{New: colliding, Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l }}
	ledgertest.Run(t, h)
	ledgertest.RunPurge(t, h)
	ledgertest.RunCounts(t, h)
}

// A removed job's place goes to the next new job, which is found by its
// own identity and id; the removed one by neither. Identities and ids too
// long for an entry's text are held all the same.
func TestPlacesReused(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(WithClock(c.now))
	params := func(key string) ledger.ReserveParams {
		return ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte(key), Fingerprint: []byte("f"),
			FingerprintVersion: 1, Retention: time.Minute, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Second}}.WithNewIDs()
	}
	long := strings.Repeat("k", 200)
	var done []string
	for _, key := range []string{"a", long} {
		r, err := l.Reserve(ctx, params(key))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte(key), Size: int64(len(key)), Stored: true}); err != nil {
			t.Fatal(err)
		}
		done = append(done, r.Job.ID)
	}
	c.advance(2 * time.Minute)
	if st, err := l.Sweep(ctx, 100); err != nil || st.Removed != 2 {
		t.Fatalf("sweep: %+v %v", st, err)
	}
	if l.slab.next != 2 || len(l.slab.free) != 2 {
		t.Fatalf("after the sweep: %d places, %d free; want 2, 2", l.slab.next, len(l.slab.free))
	}
	for _, key := range []string{long, "b"} {
		r, err := l.Reserve(ctx, params(key))
		if err != nil || r.Outcome != ledger.Created {
			t.Fatalf("%.8s: %v %v", key, r.Outcome, err)
		}
		if j, err := l.Find(ctx, []byte("o"), []byte(key)); err != nil || j.ID != r.Job.ID {
			t.Fatalf("find %.8s: %v", key, err)
		}
		if j, err := l.Job(ctx, r.Job.ID); err != nil || string(j.KeyHash) != key {
			t.Fatalf("job %.8s: %v", key, err)
		}
	}
	if l.slab.next != 2 || len(l.slab.free) != 0 || l.Len() != 2 {
		t.Fatalf("%d places, %d free, %d jobs; want 2, 0, 2", l.slab.next, len(l.slab.free), l.Len())
	}
	for _, id := range done {
		if _, err := l.Job(ctx, id); err != ledger.ErrNotFound {
			t.Errorf("removed job %s: %v", id, err)
		}
	}
}

// A job whose expiry came back to an earlier value (failed, re-opened,
// failed again at the same time) has that expiry twice in the index: the
// sweep removes it once, and frees its place once.
func TestExpiryTwiceRemovedOnce(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(WithClock(c.now))
	p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"),
		FingerprintVersion: 1, Retention: time.Minute, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Second}}
	for range 2 {
		r, err := l.Reserve(ctx, p.WithNewIDs())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Fail(ctx, r.Attempt.Ref(), "refused", nil); err != nil {
			t.Fatal(err)
		}
	}
	c.advance(2 * time.Minute)
	if st, err := l.Sweep(ctx, 100); err != nil || st.Removed != 1 {
		t.Fatalf("sweep: %+v %v", st, err)
	}
	var ids []string
	for _, key := range []string{"x", "y"} {
		q := p
		q.KeyHash = []byte(key)
		r, err := l.Reserve(ctx, q.WithNewIDs())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Job.ID)
	}
	for _, id := range ids {
		if _, err := l.Job(ctx, id); err != nil {
			t.Errorf("job %s: %v", id, err)
		}
	}
	if l.Len() != 2 || l.slab.next != 2 {
		t.Errorf("%d jobs in %d places; want 2 in 2", l.Len(), l.slab.next)
	}
}

// After a burst of jobs expires, the sweep gives up the slab's chunks it
// no longer needs, moving the jobs held past them: each is still found by
// its identity and id, listed, swept when it expires, and an attempt in
// flight among them still has its lease run out.
// With every hash the same, the jobs moved keep their names too, whether
// they were in the hashed map or among the clashes.
func TestSlabShrinks(t *testing.T) {
	t.Run("Hashed", func(t *testing.T) { testSlabShrinks(t, false) })
	t.Run("Colliding", func(t *testing.T) { testSlabShrinks(t, true) })
}

func testSlabShrinks(t *testing.T, collide bool) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(WithClock(c.now))
	if collide {
		same := func(string) uint64 { return 7 }
		l.byKey.hash, l.byID.hash = same, same
	}
	params := func(key string, retention time.Duration) ledger.ReserveParams {
		return ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte(key), Fingerprint: []byte("f"),
			FingerprintVersion: 1, Retention: retention, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Hour}}.WithNewIDs()
	}
	complete := func(key string, retention time.Duration) string {
		r, err := l.Reserve(ctx, params(key, retention))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte(key), Size: int64(len(key)), Stored: true}); err != nil {
			t.Fatal(err)
		}
		return r.Job.ID
	}
	const burst = 3*chunkEntries + 10
	for i := range burst {
		complete("burst-"+strconv.Itoa(i), time.Minute)
	}
	kept := map[string]string{} // key: job id
	for i := range 5 {
		key := "kept-" + strconv.Itoa(i)
		kept[key] = complete(key, 2*time.Hour)
	}
	inFlight, err := l.Reserve(ctx, params("in-flight", time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(l.slab.chunks) != 4 {
		t.Fatalf("%d chunks for %d jobs", len(l.slab.chunks), burst+6)
	}
	c.advance(2 * time.Minute)
	if st, err := l.Sweep(ctx, 2*burst); err != nil || st.Removed != burst {
		t.Fatalf("sweep: %+v %v", st, err)
	}
	if len(l.slab.chunks) != 1 || l.slab.next != chunkEntries || l.Len() != 6 {
		t.Fatalf("after the burst expired: %d chunks, %d places, %d jobs; want 1, %d, 6", len(l.slab.chunks), l.slab.next, l.Len(), chunkEntries)
	}
	for key, id := range kept {
		j, err := l.Find(ctx, []byte("o"), []byte(key))
		if err != nil || j.ID != id || string(j.Response.Body) != key {
			t.Fatalf("find %s: %v %+v", key, err, j)
		}
		if j, err := l.Job(ctx, id); err != nil || string(j.KeyHash) != key {
			t.Fatalf("job %s: %v", key, err)
		}
		if again, err := l.Reserve(ctx, params(key, time.Hour)); err != nil || again.Outcome != ledger.Done || again.Job.ID != id {
			t.Fatalf("replay %s: %v %+v", key, err, again)
		}
	}
	if page, err := l.Jobs(ctx, ledger.JobQuery{}); err != nil || len(page.Jobs) != 6 {
		t.Fatalf("listing: %v, %d jobs", err, len(page.Jobs))
	}
	c.advance(time.Hour - time.Minute) // past the lease, before the kept jobs' retention
	if st, err := l.Sweep(ctx, 100); err != nil || st.Unknown != 1 || st.Removed != 0 {
		t.Fatalf("the lease: %+v %v", st, err)
	}
	if j, err := l.Job(ctx, inFlight.Job.ID); err != nil || j.State != ledger.JobUnknown {
		t.Fatalf("in flight: %v %+v", err, j)
	}
	c.advance(time.Hour)
	if st, err := l.Sweep(ctx, 100); err != nil || st.Removed != 5 {
		t.Fatalf("the kept jobs' expiry: %+v %v", st, err)
	}
}
