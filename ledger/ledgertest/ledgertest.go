// Package ledgertest is the conformance suite every Ledger backend passes:
// the breakpoints of an idempotency design (concurrent reservations,
// fingerprint mismatches, blocked attempts, reverse-order races, late
// results, leases and expiry) asserted once, against each backend.
package ledgertest

import (
	"context"
	"crypto/rand"
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
