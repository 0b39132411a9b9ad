package memory

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestMemoryConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			l := New()
			t.Cleanup(func() { l.Close() })
			return l
		},
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}

// clock is a manual clock for deterministic lease and retention tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestInjectedClock(t *testing.T) {
	ctx := context.Background()
	c := &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l := New(WithClock(c.now))
	p := ledger.ReserveParams{
		OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute},
	}
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil || r.Outcome != ledger.Created {
		t.Fatal(r.Outcome, err)
	}
	if !r.Attempt.Deadline.Equal(c.now().Add(time.Minute)) {
		t.Errorf("deadline %v, want the clock plus the lease", r.Attempt.Deadline)
	}
	c.advance(59 * time.Second)
	if r, _ := l.Reserve(ctx, p.WithNewIDs()); r.Outcome != ledger.InFlight {
		t.Errorf("before the deadline: %v, want in_flight", r.Outcome)
	}
	c.advance(time.Second)
	if r, _ := l.Reserve(ctx, p.WithNewIDs()); r.Outcome != ledger.Unknown {
		t.Errorf("at the deadline: %v, want unknown", r.Outcome)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200}); err != nil || c.Won {
		t.Errorf("a result at the deadline won: %v %v", c.Won, err)
	}

	q := p
	q.KeyHash = []byte("k2")
	r, _ = l.Reserve(ctx, q.WithNewIDs())
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Stored: true}); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	c.advance(time.Hour - time.Nanosecond)
	if r2, _ := l.Reserve(ctx, q.WithNewIDs()); r2.Outcome != ledger.Done || r2.Job.ID != r.Job.ID {
		t.Errorf("within retention: %v", r2.Outcome)
	}
	c.advance(time.Nanosecond)
	if _, err := l.Job(ctx, r.Job.ID); err != ledger.ErrNotFound {
		t.Errorf("expired job still readable: %v", err)
	}
	if r2, _ := l.Reserve(ctx, q.WithNewIDs()); r2.Outcome != ledger.Created || r2.Job.ID == r.Job.ID {
		t.Errorf("after retention: %v %s", r2.Outcome, r2.Job.ID)
	}
}

// held reports how the ledger holds the job: packed (its record) or as
// itself.
func held(l *Ledger, jobID string) (packed bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID.get(&l.slab, jobID)
	return e.job == nil && len(e.packed) > 0
}

// A job is held as its record once it settles, not before (an attempt in
// flight could still see its lease run out), and reads, replays and
// transitions find it as it was.
func TestSettledJobsPacked(t *testing.T) {
	ctx := context.Background()
	l := New()
	p := ledger.ReserveParams{
		OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute},
	}
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	hedge, err := l.Hedge(ctx, r.Attempt.Ref(), ledger.NextAttempt{ID: "hedge-1", Provider: "q", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if held(l, r.Job.ID) {
		t.Fatal("a job in flight is packed")
	}
	answer := ledger.Response{Status: 201, Header: map[string][]string{"X": {"1"}}, Body: []byte("done"), Size: 4, Stored: true}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), answer); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	if held(l, r.Job.ID) {
		t.Error("a completed job whose hedge is still starting is packed")
	}
	if c, err := l.Complete(ctx, hedge.Ref(), ledger.Response{Status: 200, Stored: true}); err != nil || c.Won {
		t.Fatal("the hedge's late answer:", c.Won, err)
	}
	if !held(l, r.Job.ID) {
		t.Fatal("a settled job is held as itself")
	}
	for range 2 { // the first replay decodes it, the second finds it among the recent ones
		again, err := l.Reserve(ctx, p.WithNewIDs())
		if err != nil || again.Outcome != ledger.Done || again.Job.ID != r.Job.ID || string(again.Job.Response.Body) != "done" ||
			again.Job.Response.Header["X"][0] != "1" {
			t.Fatalf("replay: %v %+v", err, again)
		}
	}
	j, err := l.Job(ctx, r.Job.ID)
	if err != nil || j.State != ledger.JobCompleted || len(j.Attempts) != 2 || j.Attempts[1].State != ledger.AttemptLost {
		t.Fatalf("read: %v %+v", err, j)
	}
	j.Response.Body[0] = 'X' // a read is the caller's copy
	if j, _ := l.Find(ctx, p.OwnerHash, p.KeyHash); string(j.Response.Body) != "done" {
		t.Errorf("a reader's change reached the ledger: %q", j.Response.Body)
	}
}

// BenchmarkHeldJobsGC measures what the jobs a ledger holds cost the
// garbage collector: a collection with 200,000 completed jobs held, and
// the heap objects each job keeps (objects/job).
//
//	go test -run '^$' -bench HeldJobsGC ./ledger/memory
func BenchmarkHeldJobsGC(b *testing.B) {
	const n = 200_000
	ctx := context.Background()
	l := New()
	fp, owner := sha256.Sum256([]byte("fingerprint")), sha256.Sum256([]byte("owner"))
	answer := ledger.Response{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"ch_123","status":"succeeded","amount":4200,"currency":"eur"}`), Size: 66, Stored: true}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range n {
		key := sha256.Sum256(binary.BigEndian.AppendUint64(nil, uint64(i)))
		r, err := l.Reserve(ctx, ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: owner[:], KeyHash: key[:],
			Fingerprint: fp[:], FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("p", time.Minute)})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := l.Complete(ctx, r.Attempt.Ref(), answer); err != nil {
			b.Fatal(err)
		}
	}
	var held runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&held)
	for b.Loop() {
		runtime.GC()
	}
	b.ReportMetric(float64(held.HeapObjects-before.HeapObjects)/n, "objects/job")
	runtime.KeepAlive(l)
}
