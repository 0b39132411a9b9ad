package ledgertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

func testReserveCreates(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if r.Attempt.Number != 1 || r.Attempt.Provider != "primary" || r.Attempt.JobID != r.Job.ID {
		t.Errorf("attempt = %+v", r.Attempt)
	}
	if r.Job.State != ledger.JobPending || r.Job.CompletedBy != "" {
		t.Errorf("job = %+v", r.Job)
	}
	if d := r.Attempt.Deadline.Sub(r.Now); d < long-5*time.Second || d > long+time.Second {
		t.Errorf("attempt deadline is %v after the ledger's now, want about %v", d, long)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobPending, ledger.AttemptStarting)
	if !bytes.Equal(j.OwnerHash, p.OwnerHash) || !bytes.Equal(j.KeyHash, p.KeyHash) || !bytes.Equal(j.Fingerprint, p.Fingerprint) || j.FingerprintVersion != 1 ||
		j.FingerprintScheme != p.FingerprintScheme {
		t.Errorf("stored identity differs: %+v", j)
	}
	c := complete(t, l, r.Attempt, `{"ok":true}`, true)
	if c.Job.State != ledger.JobCompleted || c.Job.CompletedBy != r.Attempt.ID || c.Job.Version != r.Job.Version+1 {
		t.Errorf("completion job = %+v", c.Job)
	}
	again := reserve(t, l, p, ledger.Done)
	if again.Job.ID != r.Job.ID {
		t.Errorf("replay job id %s, want %s", again.Job.ID, r.Job.ID)
	}
	want := response(`{"ok":true}`)
	got := again.Job.Response
	if got == nil || got.Status != want.Status || string(got.Body) != string(want.Body) || !got.Stored || got.Size != want.Size ||
		fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
		t.Errorf("replayed response = %+v, want %+v", got, want)
	}
	j = job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptSucceeded)
	if j.CompletedAt.IsZero() || j.ExpiresAt.IsZero() {
		t.Errorf("completed job lacks completed_at or expires_at: %+v", j)
	}
}

func testConcurrentReserve(t *testing.T, h Harness) {
	l := h.New(t)
	peer := h.Peer(t, l)
	p := params(long)
	const n = 50
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		created int
		ids     = map[string]int{}
		errs    []error
	)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lg := l
			if i%2 == 1 {
				lg = peer
			}
			r, err := lg.Reserve(context.Background(), fresh(p))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			ids[r.Job.ID]++
			switch r.Outcome {
			case ledger.Created:
				created++
			case ledger.InFlight:
			default:
				errs = append(errs, fmt.Errorf("outcome %v", r.Outcome))
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("errors: %v", errs)
	}
	if created != 1 || len(ids) != 1 {
		t.Fatalf("%d reservations created jobs %v; want exactly one creation of one job", created, ids)
	}
	for id := range ids {
		wantState(t, job(t, l, id), ledger.JobPending, ledger.AttemptStarting)
	}
}

func testMismatch(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	other := p
	other.Fingerprint = randBytes(32)
	other.FingerprintScheme = "another scheme"
	m := reserve(t, l, other, ledger.Mismatch)
	if m.Job.ID != r.Job.ID || m.Attempt != nil {
		t.Errorf("mismatch reservation = %+v", m)
	}
	// The mismatch says how the job's fingerprint was made, so that the
	// caller can fingerprint its request the same way.
	if m.Job.FingerprintVersion != p.FingerprintVersion || m.Job.FingerprintScheme != p.FingerprintScheme {
		t.Errorf("mismatch reports fingerprint version %d scheme %q, want %d %q",
			m.Job.FingerprintVersion, m.Job.FingerprintScheme, p.FingerprintVersion, p.FingerprintScheme)
	}
	complete(t, l, r.Attempt, "secret answer", true)
	m = reserve(t, l, other, ledger.Mismatch)
	if m.Job.Response != nil {
		t.Errorf("mismatch returned the existing job's answer: %+v", m.Job.Response)
	}
	v2 := p
	v2.FingerprintVersion = 2
	reserve(t, l, v2, ledger.Mismatch)
	wantState(t, job(t, l, r.Job.ID), ledger.JobCompleted, ledger.AttemptSucceeded)
}

func testOwners(t *testing.T, h Harness) {
	l := h.New(t)
	a := params(long)
	b := a
	b.OwnerHash = randBytes(32)
	b.Fingerprint = randBytes(32)
	ra := reserve(t, l, a, ledger.Created)
	rb := reserve(t, l, b, ledger.Created)
	if ra.Job.ID == rb.Job.ID {
		t.Fatalf("two owners share job %s", ra.Job.ID)
	}
	complete(t, l, ra.Attempt, "A's answer", true)
	// B's job is still B's own, in flight, with B's fingerprint.
	reserve(t, l, b, ledger.InFlight)
}

// testRepeatedReopenAtOnce sends a re-open twice at once, from two
// gateways, as a client's retry can race the gateway's own repeat: both
// answers name the same attempt and the job as that attempt left it (its
// version), round after round, so the race between reading the job and
// finding the attempt has chances to show.
func testRepeatedReopenAtOnce(t *testing.T, h Harness) {
	l := h.New(t)
	peer := h.Peer(t, l)
	for round := range 30 {
		p := params(long)
		r := reserve(t, l, p, ledger.Created)
		if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err != nil {
			t.Fatal(err)
		}
		q := fresh(p)
		var (
			wg      sync.WaitGroup
			answers [2]ledger.Reservation
			errs    [2]error
		)
		for i, lg := range []ledger.Ledger{l, peer} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i], errs[i] = lg.Reserve(ctx(t), q)
			}()
		}
		wg.Wait()
		j := job(t, l, r.Job.ID)
		for i, a := range answers {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if a.Outcome != ledger.Reopened || a.Attempt == nil || a.Attempt.ID != q.Attempt.ID || a.Job.Version != j.Version || a.Job.State != ledger.JobPending {
				t.Fatalf("round %d, answer %d: %v attempt %s, job %s version %d; want reopened by %s, job pending version %d",
					round, i, a.Outcome, attemptSummary(a.Attempt), a.Job.State, a.Job.Version, q.Attempt.ID, j.Version)
			}
		}
	}
}

func testConcurrentReopen(t *testing.T, h Harness) {
	l := h.New(t)
	peer := h.Peer(t, l)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptFailed)
	const n = 20
	var wg sync.WaitGroup
	outcomes := make([]ledger.Outcome, n)
	errs := make([]error, n)
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			lg := l
			if i%2 == 1 {
				lg = peer
			}
			rr, err := lg.Reserve(context.Background(), fresh(p))
			outcomes[i], errs[i] = rr.Outcome, err
		}()
	}
	close(start)
	wg.Wait()
	reopened := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		switch outcomes[i] {
		case ledger.Reopened:
			reopened++
		case ledger.InFlight:
		default:
			t.Errorf("outcome %v", outcomes[i])
		}
	}
	if reopened != 1 {
		t.Fatalf("%d callers re-opened the failed job, want 1", reopened)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptFailed, ledger.AttemptStarting)
}

func testExpiredJob(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	p.Retention = short
	r := reserve(t, l, p, ledger.Created)
	complete(t, l, r.Attempt, "old", true)
	// Polled with reads, not reservations: a reservation applied twice
	// around the expiry would answer done once and created once.
	eventually(t, "the job expires", func() bool {
		_, err := l.Job(ctx(t), r.Job.ID)
		return errors.Is(err, ledger.ErrNotFound)
	})
	renewed, err := l.Reserve(ctx(t), fresh(p))
	if err != nil {
		t.Fatal(err)
	}
	if renewed.Outcome != ledger.Created || renewed.Job.ID == r.Job.ID || renewed.Attempt.Number != 1 {
		t.Fatalf("after expiry: %v job %s attempt %+v; want a new job", renewed.Outcome, renewed.Job.ID, renewed.Attempt)
	}
	if _, err := l.Job(ctx(t), r.Job.ID); !errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("old job: err = %v, want ErrNotFound", err)
	}
	j := job(t, l, renewed.Job.ID)
	wantState(t, j, ledger.JobPending, ledger.AttemptStarting)
	if j.Response != nil {
		t.Errorf("new job carries the old answer")
	}
	// The old job's attempt cannot touch the new job.
	if c, err := l.Complete(ctx(t), r.Attempt.Ref(), response("ghost")); err == nil && c.Won {
		t.Errorf("old attempt won on the replacing job")
	}
	complete(t, l, renewed.Attempt, "new", true)
	// An expired failed job is replaced too, and a different fingerprint
	// is then no mismatch.
	q := params(long)
	q.Retention = short
	rq := reserve(t, l, q, ledger.Created)
	if _, err := l.Fail(ctx(t), rq.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	q.Fingerprint = randBytes(32)
	eventually(t, "the failed job expires", func() bool {
		_, err := l.Job(ctx(t), rq.Job.ID)
		return errors.Is(err, ledger.ErrNotFound)
	})
	if rr, err := l.Reserve(ctx(t), fresh(q)); err != nil || rr.Outcome != ledger.Created || rr.Job.ID == rq.Job.ID {
		t.Fatalf("after the failed job expired: %v job %s, %v; want a new job", rr.Outcome, rr.Job.ID, err)
	}
}
