// Package ledgertest is the conformance suite every Ledger backend passes:
// the breakpoints of an idempotency design (concurrent reservations,
// fingerprint mismatches, blocked attempts, reverse-order races, late
// results, leases and expiry) asserted once, against each backend.
package ledgertest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/near"
)

// Harness opens the backend under test.
type Harness struct {
	// New returns a ledger over a store no other test uses, closed by the
	// harness when the test ends.
	New func(t *testing.T) ledger.Ledger
	// Peer returns another ledger instance sharing l's store, as a second
	// gateway process would (for memory, l itself).
	Peer func(t *testing.T, l ledger.Ledger) ledger.Ledger
}

// Run runs the whole suite three times: as it is, with every transition
// applied twice one after the other, and twice at once.
func Run(t *testing.T, h Harness) {
	t.Run("Once", func(t *testing.T) { run(t, h) })
	t.Run("Twice", func(t *testing.T) { run(t, repeating(h, false)) })
	t.Run("TwiceAtOnce", func(t *testing.T) { run(t, repeating(h, true)) })
}

func run(t *testing.T, h Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"ReserveCreates", testReserveCreates},
		{"ConcurrentReserveOneJob", testConcurrentReserve},
		{"FingerprintMismatch", testMismatch},
		{"OwnersAreSeparate", testOwners},
		{"NewAttemptRefusedWhileStarting", testBlockedWhileStarting},
		{"NewAttemptRefusedWhileUnknown", testBlockedWhileUnknown},
		{"FailoverRefusedWhileHedgeRuns", testFailoverBlockedByHedge},
		{"HedgeReverseOrder", testHedgeReverseOrder},
		{"UnknownKeepsVersionLateResultWins", testLateResultWins},
		{"ResultAfterCancelLoses", testResultAfterCancel},
		{"StaleVersionLoses", testStaleVersion},
		{"ConcurrentReopenStartsOne", testConcurrentReopen},
		{"RepeatedReopenAtOnceAgrees", testRepeatedReopenAtOnce},
		{"FailoverStartsNextAttempt", testFailover},
		{"ExpiredLeaseReadsUnknown", testExpiredLease},
		{"ResultAfterDeadlineLoses", testResultAfterDeadline},
		{"LateResultLeavesJobUnknown", testLateResultUnknown},
		{"LateDefinitiveFailure", testLateFailure},
		{"ExpiredJobGivesNewID", testExpiredJob},
		{"WaiterWokenByPeer", testWaiterWokenByPeer},
		{"WaiterWokenByLeaseExpiry", testWaiterLease},
		{"ResolveComplete", testResolveComplete},
		{"SaveBodyAfterWin", testSaveBody},
		{"ListNewestFirst", testList},
		{"Sweep", testSweep},
		{"NotFound", testNotFound},
		{"RepeatsByID", testRepeatsByID},
		{"UnsentAttemptFails", testUnsent},
		{"UnsentAfterLease", testUnsentAfterLease},
		{"UnsentOnceTouched", testUnsentTouched},
		{"UnbeatenLostBlocks", testUnbeatenLostBlocks},
		{"CancelledLateResultNeverBlocks", testCancelledNeverBlocks},
		{"FindByOwnerAndKey", testFind},
		{"FindIsPerOwner", testFindPerOwner},
		{"FindExpired", testFindExpired},
		{"FindExpiredLeaseReadsUnknown", testFindLease},
		{"ResendReconcilesUnknown", testResend},
		{"ResendAfterOperator", testResendAfterOperator},
		{"AttemptsRecordTheirScope", testAttemptScopes},
		{"LookupCompletes", testLookupCompletes},
		{"LookupAbsent", testLookupAbsent},
		{"LookupAbsentThenResult", testLookupAbsentThenResult},
		{"LookupOneHolder", testLookupOneHolder},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, h) })
	}
}

const (
	long  = time.Minute
	short = 400 * time.Millisecond
)

func randBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

// params returns reservation params for a fresh (owner, key).
func params(lease time.Duration) ledger.ReserveParams {
	return ledger.ReserveParams{
		OwnerHash:          randBytes(32),
		KeyHash:            randBytes(32),
		Fingerprint:        randBytes(32),
		FingerprintVersion: 1,
		FingerprintScheme:  `{"body":"json","exclude":["/ts"]}`,
		Retention:          time.Hour,
		Attempt:            next("primary", lease),
	}
}

var (
	next  = ledger.NewAttempt
	fresh = ledger.ReserveParams.WithNewIDs
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

func reserve(t *testing.T, l ledger.Ledger, p ledger.ReserveParams, want ledger.Outcome) ledger.Reservation {
	t.Helper()
	r, err := l.Reserve(ctx(t), fresh(p))
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if r.Outcome != want {
		t.Fatalf("Reserve outcome = %v, want %v", r.Outcome, want)
	}
	if r.Job == nil || r.Job.ID == "" {
		t.Fatalf("Reserve returned no job")
	}
	if (want == ledger.Created || want == ledger.Reopened) && (r.Attempt == nil || r.Attempt.State != ledger.AttemptStarting) {
		t.Fatalf("Reserve %v returned attempt %+v, want a starting one", want, r.Attempt)
	}
	return r
}

func job(t *testing.T, l ledger.Ledger, id string) *ledger.Job {
	t.Helper()
	j, err := l.Job(ctx(t), id)
	if err != nil {
		t.Fatalf("Job(%s): %v", id, err)
	}
	return j
}

func response(body string) ledger.Response {
	return ledger.Response{
		Status: 201,
		Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body:   []byte(body),
		Size:   int64(len(body)),
		Stored: true,
	}
}

func complete(t *testing.T, l ledger.Ledger, a *ledger.Attempt, body string, wantWon bool) ledger.Completion {
	t.Helper()
	c, err := l.Complete(ctx(t), a.Ref(), response(body))
	if err != nil {
		t.Fatalf("Complete(attempt %d): %v", a.Number, err)
	}
	if c.Won != wantWon {
		t.Fatalf("Complete(attempt %d) won = %v, want %v", a.Number, c.Won, wantWon)
	}
	if c.Job == nil {
		t.Fatalf("Complete returned no job")
	}
	// Read at the ledger's clock, so that a repeat's reader counts the
	// time the job has left from the repeat.
	if c.Job.ReadAt.IsZero() || (!c.Job.CompletedAt.IsZero() && c.Job.ReadAt.Before(c.Job.CompletedAt)) {
		t.Errorf("Complete(attempt %d): job read at %v, completed at %v", a.Number, c.Job.ReadAt, c.Job.CompletedAt)
	}
	return c
}

func attempt(t *testing.T, j *ledger.Job, n int) ledger.Attempt {
	t.Helper()
	for _, a := range j.Attempts {
		if a.Number == n {
			return a
		}
	}
	t.Fatalf("job %s has no attempt %d (attempts %+v)", j.ID, n, j.Attempts)
	return ledger.Attempt{}
}

func wantState(t *testing.T, j *ledger.Job, js ledger.JobState, as ...ledger.AttemptState) {
	t.Helper()
	if j.State != js {
		t.Errorf("job state = %s, want %s", j.State, js)
	}
	if len(j.Attempts) != len(as) {
		t.Fatalf("job has %d attempts, want %d: %+v", len(j.Attempts), len(as), j.Attempts)
	}
	for i, s := range as {
		if a := attempt(t, j, i+1); a.State != s {
			t.Errorf("attempt %d state = %s, want %s", i+1, a.State, s)
		}
	}
}

// eventually polls cond until it holds or 10s pass: for deadlines judged by
// the ledger's own clock, which a test cannot move.
// KeepsReplays starts the notifications the in-process tier n follows
// (near.Cache.Follow) and waits until it keeps jobs: a test that counts a
// replay's round trips counts them from then.
func KeepsReplays(t *testing.T, n *near.Cache) {
	t.Helper()
	n.Get("", time.Now())
	eventually(t, "the replay tier's notifications are up", n.Up)
}

// Eventually polls cond for up to ten seconds and fails t if it never
// holds.
func Eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	eventually(t, what, cond)
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

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

func testBlockedWhileStarting(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	for range 3 {
		again := reserve(t, l, p, ledger.InFlight)
		if again.Attempt == nil || again.Attempt.ID != r.Attempt.ID {
			t.Fatalf("in-flight reservation names attempt %+v, want %s", again.Attempt, r.Attempt.ID)
		}
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptStarting)
}

func testBlockedWhileUnknown(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(ctx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		u := reserve(t, l, p, ledger.Unknown)
		if u.Attempt == nil || u.Attempt.ID != r.Attempt.ID || !u.Attempt.Deadline.After(u.Now) {
			t.Fatalf("unknown reservation names attempt %+v at %v", u.Attempt, u.Now)
		}
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobUnknown, ledger.AttemptUnknown)
	if a := attempt(t, j, 1); a.Error != "timeout" {
		t.Errorf("attempt error = %q, want the reason given", a.Error)
	}
	// A definitive failure of another path must not start one either.
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "late", ptr(next("x", long))); err == nil {
		t.Errorf("Fail with next on an unknown attempt succeeded")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)
}

func testFailoverBlockedByHedge(t *testing.T, h Harness) {
	l := h.New(t)
	r := reserve(t, l, params(long), ledger.Created)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	if hedge.Number != 2 || hedge.JobVersion != r.Attempt.JobVersion {
		t.Errorf("hedge attempt = %+v; want number 2 at the same version", hedge)
	}
	_, err = l.Fail(ctx(t), r.Attempt.Ref(), "503", ptr(next("third", long)))
	if !errors.Is(err, ledger.ErrBlocked) {
		t.Fatalf("failover while a hedge runs: err = %v, want ErrBlocked", err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptFailed, ledger.AttemptStarting)
	// The hedge failing too, with nothing left, fails the job.
	if _, err := l.Fail(ctx(t), hedge.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptFailed, ledger.AttemptFailed)
}

func testHedgeReverseOrder(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	// The hedge started second and finishes first: it wins.
	complete(t, l, &hedge, "from the hedge", true)
	// The first attempt finishes second: it loses, whatever its rank.
	c := complete(t, l, r.Attempt, "from the primary", false)
	if c.Job.Response == nil || string(c.Job.Response.Body) != "from the hedge" {
		t.Errorf("loser sees response %+v, want the winner's", c.Job.Response)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobCompleted, ledger.AttemptLost, ledger.AttemptSucceeded)
	if j.CompletedBy != hedge.ID || string(j.Response.Body) != "from the hedge" {
		t.Errorf("job completed by %s with %q, want the hedge's answer", j.CompletedBy, j.Response.Body)
	}
	rr := reserve(t, l, p, ledger.Done)
	if string(rr.Job.Response.Body) != "from the hedge" {
		t.Errorf("replay shows %q, a lost attempt's result", rr.Job.Response.Body)
	}
	// A hedge of a settled job is refused.
	if _, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("x", long)); err == nil {
		t.Errorf("Hedge of a completed job succeeded")
	}
}

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

func testFailover(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	next, err := l.Fail(ctx(t), r.Attempt.Ref(), "connect_error", ptr(next("fallback", long)))
	if err != nil {
		t.Fatal(err)
	}
	if next == nil || next.Number != 2 || next.Provider != "fallback" || next.State != ledger.AttemptStarting || next.JobID != r.Job.ID {
		t.Fatalf("failover attempt = %+v", next)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobPending, ledger.AttemptFailed, ledger.AttemptStarting)
	reserve(t, l, p, ledger.InFlight)
	if _, err := l.Fail(ctx(t), next.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobFailed, ledger.AttemptFailed, ledger.AttemptFailed)
	if a := attempt(t, j, 1); a.Error != "connect_error" || a.FinishedAt.IsZero() {
		t.Errorf("attempt 1 = %+v", a)
	}
	if j.Version != r.Job.Version {
		t.Errorf("failing changed version %d -> %d", r.Job.Version, j.Version)
	}
	// Failing again is a repeat: it changes nothing.
	if a, err := l.Fail(ctx(t), next.Ref(), "again", nil); err != nil || a != nil {
		t.Errorf("repeated Fail = %+v, %v; want nothing", a, err)
	}
	if a := attempt(t, job(t, l, r.Job.ID), 2); a.Error != "503" || a.State != ledger.AttemptFailed {
		t.Errorf("attempt 2 after a repeated Fail = %+v", a)
	}
	re := reserve(t, l, p, ledger.Reopened)
	if re.Attempt.Number != 3 || re.Job.ID != r.Job.ID || re.Job.Version != r.Job.Version+1 {
		t.Errorf("re-open = attempt %+v job version %d", re.Attempt, re.Job.Version)
	}
}

func testExpiredLease(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	eventually(t, "the attempt's lease runs out", func() bool {
		j := job(t, l, r.Job.ID)
		return j.State == ledger.JobUnknown && attempt(t, j, 1).State == ledger.AttemptUnknown
	})
	u := reserve(t, l, p, ledger.Unknown)
	if u.Attempt == nil || u.Attempt.Deadline.After(u.Now) {
		t.Errorf("unknown reservation: attempt %+v now %v; want a deadline passed", u.Attempt, u.Now)
	}
	// Every read agrees, without a sweep.
	page, err := l.Jobs(ctx(t), ledger.JobQuery{State: ledger.JobUnknown})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, j := range page.Jobs {
		found = found || j.ID == r.Job.ID
	}
	if !found {
		t.Errorf("listing unknown jobs misses the expired lease's job")
	}
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err == nil {
		t.Errorf("Fail after the lease ran out was accepted")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)
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

func testWaiterWokenByPeer(t *testing.T, h Harness) {
	l := h.New(t)
	peer := h.Peer(t, l)
	r := reserve(t, l, params(long), ledger.Created)
	done := make(chan *ledger.Job, 1)
	errc := make(chan error, 1)
	go func() {
		j, err := l.Wait(ctx(t), r.Job.ID)
		if err != nil {
			errc <- err
			return
		}
		done <- j
	}()
	complete(t, peer, r.Attempt, "via peer", true)
	select {
	case j := <-done:
		if j.State != ledger.JobCompleted || string(j.Response.Body) != "via peer" {
			t.Errorf("waiter got %+v", j)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(20 * time.Second):
		t.Fatal("waiter was not woken")
	}
	// A settled job returns at once.
	j, err := peer.Wait(ctx(t), r.Job.ID)
	if err != nil || j.State != ledger.JobCompleted {
		t.Errorf("Wait on a completed job = %v, %v", j, err)
	}
	// Each settling transition wakes a waiter: unknown and failed too.
	for _, settle := range []func(a *ledger.Attempt) error{
		func(a *ledger.Attempt) error { return peer.MarkUnknown(context.Background(), a.Ref(), "timeout") },
		func(a *ledger.Attempt) error {
			_, err := peer.Fail(context.Background(), a.Ref(), "503", nil)
			return err
		},
	} {
		r := reserve(t, l, params(long), ledger.Created)
		go func() {
			j, err := l.Wait(ctx(t), r.Job.ID)
			if err != nil {
				errc <- err
				return
			}
			done <- j
		}()
		if err := settle(r.Attempt); err != nil {
			t.Fatal(err)
		}
		select {
		case j := <-done:
			if j.State == ledger.JobPending {
				t.Errorf("waiter returned a pending job")
			}
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatal("waiter was not woken")
		}
	}
	// A waiter gives up with its context.
	r = reserve(t, l, params(long), ledger.Created)
	c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Wait(c, r.Job.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with an ended context: err = %v", err)
	}
}

func testWaiterLease(t *testing.T, h Harness) {
	l := h.New(t)
	r := reserve(t, l, params(short), ledger.Created)
	j, err := l.Wait(ctx(t), r.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != ledger.JobUnknown {
		t.Errorf("after the lease ran out, waiter got state %s, want unknown", j.State)
	}
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

// testUnbeatenLostBlocks: a hedged attempt whose result came after its
// deadline acted; when the other attempt then fails definitively, the job
// is unknown, never failed, and no retry runs it again.
func testUnbeatenLostBlocks(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	hedge, err := l.Hedge(ctx(t), r.Attempt.Ref(), next("fallback", long))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "attempt 1's deadline passes", func() bool {
		return attempt(t, job(t, l, r.Job.ID), 1).State == ledger.AttemptUnknown
	})
	complete(t, l, r.Attempt, "too late", false)
	if _, err := l.Fail(ctx(t), hedge.Ref(), "503", ptr(next("third", long))); !errors.Is(err, ledger.ErrBlocked) {
		t.Errorf("failover past an unbeaten lost attempt: err = %v, want ErrBlocked", err)
	}
	j := job(t, l, r.Job.ID)
	wantState(t, j, ledger.JobUnknown, ledger.AttemptLost, ledger.AttemptFailed)
	reserve(t, l, p, ledger.Unknown)
}

// testCancelledNeverBlocks: after an operator's cancel, the cancelled
// attempt's late result does not block the retry's attempts.
func testCancelledNeverBlocks(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(long)
	r := reserve(t, l, p, ledger.Created)
	if _, err := l.Resolve(ctx(t), r.Job.ID, ledger.Resolution{Cancel: true}); err != nil {
		t.Fatal(err)
	}
	complete(t, l, r.Attempt, "late", false)
	re := reserve(t, l, p, ledger.Reopened)
	if _, err := l.Fail(ctx(t), re.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobFailed, ledger.AttemptCancelled, ledger.AttemptFailed)
	reserve(t, l, p, ledger.Reopened)
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

// UnknownJob reserves a job on l whose one attempt, on provider "pay"
// under scope with a lease of a minute, timed out: the job a reconciler
// looks up once the lease ran out.
func UnknownJob(t *testing.T, l ledger.Ledger, scope string) ledger.Reservation {
	t.Helper()
	p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte(ledger.NewID()),
		Fingerprint: []byte("f"), FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("pay", time.Minute)}
	p.Attempt.Scope = scope
	r, err := l.Reserve(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.MarkUnknown(context.Background(), r.Attempt.Ref(), "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	return r
}
