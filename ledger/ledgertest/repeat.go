package ledgertest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// repeated is a Ledger that applies every transition twice, as a gateway
// does when a reply is lost: one call after the other, or both at once. It
// fails the test when the two disagree, and returns the first's answer, so
// the whole suite holds every backend to idempotent transitions.
type repeated struct {
	ledger.Ledger
	t          *testing.T
	concurrent bool
}

// twice runs call twice and checks that both answers say the same.
func twice[T any](r *repeated, op string, call func() (T, error), same func(a, b T) string) (T, error) {
	var (
		v1, v2 T
		e1, e2 error
	)
	if r.concurrent {
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			v2, e2 = call()
		}()
		v1, e1 = call()
		wg.Wait()
	} else {
		v1, e1 = call()
		v2, e2 = call()
	}
	if k1, k2 := errKind(e1), errKind(e2); k1 != k2 {
		r.t.Errorf("%s applied twice: errors %v and %v", op, e1, e2)
	} else if e1 == nil {
		if diff := same(v1, v2); diff != "" {
			r.t.Errorf("%s applied twice answered differently: %s", op, diff)
		}
	}
	return v1, e1
}

// errKind names an error by the sentinel it wraps: repeats must agree on it.
func errKind(err error) string {
	for _, s := range []error{ledger.ErrNotFound, ledger.ErrStale, ledger.ErrBlocked, ledger.ErrCompleted} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "other"
	}
	return ""
}

func attemptSummary(a *ledger.Attempt) string {
	if a == nil {
		return "none"
	}
	return fmt.Sprintf("attempt %s #%d on %s, %s, version %d, deadline %s",
		a.ID, a.Number, a.Provider, a.State, a.JobVersion, a.Deadline.UTC().Format("15:04:05.000000"))
}

func jobSummary(j *ledger.Job) string {
	if j == nil {
		return "no job"
	}
	return fmt.Sprintf("job %s %s version %d completed by %q", j.ID, j.State, j.Version, j.CompletedBy)
}

func diff(what, a, b string) string {
	if a == b {
		return ""
	}
	return what + ": " + a + " / " + b
}

func (r *repeated) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	return twice(r, "Reserve", func() (ledger.Reservation, error) { return r.Ledger.Reserve(ctx, p) },
		func(a, b ledger.Reservation) string {
			if a.Outcome != b.Outcome {
				return fmt.Sprintf("outcome %v / %v", a.Outcome, b.Outcome)
			}
			if d := diff("job", a.Job.ID, b.Job.ID); d != "" {
				return d
			}
			if a.Outcome != ledger.Created && a.Outcome != ledger.Reopened {
				return "" // a read: the blocking attempt may have moved on
			}
			if a.Job.Version != b.Job.Version {
				return fmt.Sprintf("job version %d / %d", a.Job.Version, b.Job.Version)
			}
			return diff("attempt", attemptSummary(a.Attempt), attemptSummary(b.Attempt))
		})
}

func (r *repeated) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return twice(r, "Hedge", func() (ledger.Attempt, error) { return r.Ledger.Hedge(ctx, ref, next) },
		func(a, b ledger.Attempt) string { return diff("attempt", attemptSummary(&a), attemptSummary(&b)) })
}

func (r *repeated) Resend(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return twice(r, "Resend", func() (ledger.Attempt, error) { return r.Ledger.Resend(ctx, ref, next) },
		func(a, b ledger.Attempt) string { return diff("attempt", attemptSummary(&a), attemptSummary(&b)) })
}

func (r *repeated) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	return twice(r, "ClaimLookup", func() (*ledger.Job, error) { return r.Ledger.ClaimLookup(ctx, ref, holder, lease) },
		func(a, b *ledger.Job) string { return diff("job", jobSummary(a), jobSummary(b)) })
}

func (r *repeated) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, res ledger.LookupResult) (*ledger.Job, error) {
	return twice(r, "SettleLookup", func() (*ledger.Job, error) { return r.Ledger.SettleLookup(ctx, ref, holder, res) },
		func(a, b *ledger.Job) string { return diff("job", jobSummary(a), jobSummary(b)) })
}

func (r *repeated) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	return twice(r, "Complete", func() (ledger.Completion, error) { return r.Ledger.Complete(ctx, ref, resp) },
		func(a, b ledger.Completion) string {
			if a.Won != b.Won {
				return fmt.Sprintf("won %v / %v", a.Won, b.Won)
			}
			return diff("job", jobSummary(a.Job), jobSummary(b.Job))
		})
}

func (r *repeated) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	_, err := twice(r, "SaveBody", func() (struct{}, error) {
		return struct{}{}, r.Ledger.SaveBody(ctx, ref, body, size, stored)
	}, func(struct{}, struct{}) string { return "" })
	return err
}

func (r *repeated) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	return twice(r, "Fail", func() (*ledger.Attempt, error) { return r.Ledger.Fail(ctx, ref, reason, next) },
		func(a, b *ledger.Attempt) string { return diff("next attempt", attemptSummary(a), attemptSummary(b)) })
}

func (r *repeated) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	_, err := twice(r, "Unsent", func() (struct{}, error) { return struct{}{}, r.Ledger.Unsent(ctx, ref) },
		func(struct{}, struct{}) string { return "" })
	return err
}

func (r *repeated) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	_, err := twice(r, "MarkUnknown", func() (struct{}, error) { return struct{}{}, r.Ledger.MarkUnknown(ctx, ref, reason) },
		func(struct{}, struct{}) string { return "" })
	return err
}

func (r *repeated) Resolve(ctx context.Context, jobID string, res ledger.Resolution) (*ledger.Job, error) {
	return twice(r, "Resolve", func() (*ledger.Job, error) { return r.Ledger.Resolve(ctx, jobID, res) },
		func(a, b *ledger.Job) string { return diff("job", jobSummary(a), jobSummary(b)) })
}

// repeating returns h with every ledger it opens wrapped in repeated.
func repeating(h Harness, concurrent bool) Harness {
	wrap := func(t *testing.T, l ledger.Ledger) ledger.Ledger {
		return &repeated{Ledger: l, t: t, concurrent: concurrent}
	}
	return Harness{
		New: func(t *testing.T) ledger.Ledger { return wrap(t, h.New(t)) },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			if r, ok := l.(*repeated); ok {
				l = r.Ledger
			}
			return wrap(t, h.Peer(t, l))
		},
	}
}

func ptr[T any](v T) *T { return &v }

// testRepeatsByID repeats each call with the ids of the first, as a
// gateway does when a reply is lost, and checks that each answers as the
// first did: reservations, failover, hedges, completions, resolutions.
func testRepeatsByID(t *testing.T, h Harness) {
	l := h.New(t)
	p := fresh(params(long))
	r1, err := l.Reserve(ctx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := l.Reserve(ctx(t), p)
	if err != nil {
		t.Fatal(err)
	}
	if r2.Outcome != ledger.Created || r2.Job.ID != p.JobID || r2.Attempt.ID != p.Attempt.ID || r2.Attempt.Number != 1 {
		t.Fatalf("repeated reserve = %v job %s attempt %+v; want created again with the same ids", r2.Outcome, r2.Job.ID, r2.Attempt)
	}
	if !r2.Attempt.Deadline.Equal(r1.Attempt.Deadline) {
		t.Errorf("repeated reserve moved the deadline: %v -> %v", r1.Attempt.Deadline, r2.Attempt.Deadline)
	}
	fo := next("fallback", long)
	n1, err := l.Fail(ctx(t), r1.Attempt.Ref(), "503", &fo)
	if err != nil {
		t.Fatal(err)
	}
	n2, err := l.Fail(ctx(t), r1.Attempt.Ref(), "503", &fo)
	if err != nil || n2 == nil || n2.ID != fo.ID || n2.Number != n1.Number {
		t.Fatalf("repeated failover = %+v, %v; want attempt %s again", n2, err, fo.ID)
	}
	hn := next("third", long)
	h1, err := l.Hedge(ctx(t), n1.Ref(), hn)
	if err != nil {
		t.Fatal(err)
	}
	if h2, err := l.Hedge(ctx(t), n1.Ref(), hn); err != nil || h2.ID != h1.ID || h2.Number != 3 {
		t.Fatalf("repeated hedge = %+v, %v", h2, err)
	}
	c1 := complete(t, l, n1, "won", true)
	c2 := complete(t, l, n1, "won", true)
	if c2.Job.CompletedBy != n1.ID || c2.Job.Version != c1.Job.Version {
		t.Errorf("repeated completion by the winner: %+v", c2.Job)
	}
	complete(t, l, &h1, "lost", false)
	complete(t, l, &h1, "lost", false)
	j := job(t, l, p.JobID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptFailed, ledger.AttemptSucceeded, ledger.AttemptLost)
	if j.Version != c1.Job.Version || string(j.Response.Body) != "won" {
		t.Errorf("after repeats: version %d body %q", j.Version, j.Response.Body)
	}
	// Replays put a completed job among those a ledger keeps in the
	// process; a repeat of the reservation whose attempt won (its reply
	// was lost) still answers as the first call did, by that attempt.
	w := fresh(params(long))
	rw, err := l.Reserve(ctx(t), w)
	if err != nil || rw.Outcome != ledger.Created {
		t.Fatalf("reserve = %v, %v", rw.Outcome, err)
	}
	complete(t, l, rw.Attempt, "won", true)
	reserve(t, l, w, ledger.Done)
	reserve(t, l, w, ledger.Done)
	if r3, err := l.Reserve(ctx(t), w); err != nil || r3.Outcome != ledger.Created || r3.Attempt == nil ||
		r3.Attempt.ID != w.Attempt.ID || r3.Attempt.State != ledger.AttemptSucceeded {
		t.Errorf("repeated reserve after replays = %v attempt %+v, %v; want created, its attempt as it is now (succeeded)", r3.Outcome, r3.Attempt, err)
	}
	// A re-open repeated starts one attempt.
	q := fresh(params(long))
	rq := reserve(t, l, q, ledger.Created)
	if _, err := l.Fail(ctx(t), rq.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	q = fresh(q)
	o1, err := l.Reserve(ctx(t), q)
	if err != nil || o1.Outcome != ledger.Reopened {
		t.Fatalf("re-open = %v, %v", o1.Outcome, err)
	}
	o2, err := l.Reserve(ctx(t), q)
	if err != nil || o2.Outcome != ledger.Reopened || o2.Attempt.ID != q.Attempt.ID || o2.Job.Version != o1.Job.Version {
		t.Fatalf("repeated re-open = %v attempt %+v version %d, %v", o2.Outcome, o2.Attempt, o2.Job.Version, err)
	}
	wantState(t, job(t, l, rq.Job.ID), ledger.JobPending, ledger.AttemptFailed, ledger.AttemptStarting)
	// An operator's completion repeated with its attempt id.
	resp := response("by hand")
	res := ledger.Resolution{Response: &resp, AttemptID: ledger.NewID()}
	if _, err := l.Resolve(ctx(t), rq.Job.ID, res); err != nil {
		t.Fatal(err)
	}
	j2, err := l.Resolve(ctx(t), rq.Job.ID, res)
	if err != nil || j2.CompletedBy != res.AttemptID {
		t.Fatalf("repeated resolve = %+v, %v", j2, err)
	}
	if n := len(job(t, l, rq.Job.ID).Attempts); n != 3 {
		t.Errorf("repeated resolve left %d attempts, want 3", n)
	}
	// Replays of the resolved job, then a repeat of the re-open (its
	// reply lost): answered with its attempt, which did not win, so that
	// the gateway can record it never sent — not done from the jobs kept
	// in the process, which may not list it (PostgreSQL keeps them
	// without their attempts).
	reserve(t, l, fresh(q), ledger.Done)
	reserve(t, l, fresh(q), ledger.Done)
	q.Repeat = true
	if o3, err := l.Reserve(ctx(t), q); err != nil || o3.Outcome != ledger.Reopened || o3.Attempt == nil || o3.Attempt.ID != q.Attempt.ID {
		t.Errorf("repeated re-open after the job was resolved and replayed = %v attempt %+v, %v; want re-opened, its attempt", o3.Outcome, o3.Attempt, err)
	}
}
