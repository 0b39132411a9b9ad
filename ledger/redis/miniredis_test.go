package redis

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// These tests run the scripts against miniredis, an in-process Redis with
// a Lua interpreter: no server needed. miniredis reads TIME from the wall
// clock (or SetTime), and with ClockTTL its keys expire by that clock too.

func openMini(t *testing.T, m *miniredis.Miniredis, prefix string) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Open(ctx, "redis://"+m.Addr()+"/0", Options{Prefix: prefix})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// newMini starts a miniredis whose keys expire by its clock: for tests
// that set the clock (SetTime), so that it stands still during a script.
func newMini(t *testing.T) *miniredis.Miniredis {
	m := miniredis.RunT(t)
	m.ClockTTL(true)
	return m
}

// TestMiniredisConformance runs the whole conformance suite: leases and
// expiry pass by miniredis's wall clock, waiters are woken through its
// pub/sub. Its keys do not expire by TTL here: on the wall clock miniredis
// would expire a key between two commands of one script, which Redis never
// does (expiry stands still while a script runs). The scripts' own expiry
// checks make expired jobs absent all the same.
func TestMiniredisConformance(t *testing.T) {
	m := miniredis.RunT(t)
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			return openMini(t, m, "t:"+ledger.NewID()+":")
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return openMini(t, m, l.(*Ledger).Prefix())
		},
	})
}

// params returns the parameters of a new request for (owner, key), with
// new ids: a repeat of its call reuses them.
func params(owner, key string) ledger.ReserveParams {
	return ledger.ReserveParams{
		JobID: ledger.NewID(), OwnerHash: []byte(owner), KeyHash: []byte(key), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{ID: ledger.NewID(), Provider: "p", Lease: time.Minute},
	}
}

// again returns p for another request of the same identity: new ids.
func again(p ledger.ReserveParams) ledger.ReserveParams {
	p.JobID, p.Attempt.ID = ledger.NewID(), ledger.NewID()
	return p
}

// TestServerClock moves miniredis's clock (TIME, and with ClockTTL the keys'
// expiry): deadlines and retention follow the server's clock, not the
// gateway's, and the sweeper records and removes by it.
func TestServerClock(t *testing.T) {
	ctx := context.Background()
	m := newMini(t)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start)
	l := openMini(t, m, "clock:")
	p := params("o", "k")
	r, err := l.Reserve(ctx, p)
	if err != nil || r.Outcome != ledger.Created {
		t.Fatal(r.Outcome, err)
	}
	if !r.Now.Equal(start) || !r.Attempt.Deadline.Equal(start.Add(time.Minute)) {
		t.Errorf("now %v deadline %v, want the server's clock %v plus the lease", r.Now, r.Attempt.Deadline, start)
	}
	m.SetTime(start.Add(59 * time.Second))
	if r, _ := l.Reserve(ctx, again(p)); r.Outcome != ledger.InFlight {
		t.Errorf("before the deadline: %v, want in_flight", r.Outcome)
	}
	m.SetTime(start.Add(time.Minute))
	j, err := l.Job(ctx, r.Job.ID)
	if err != nil || j.State != ledger.JobUnknown || j.Attempts[0].State != ledger.AttemptUnknown {
		t.Fatalf("read at the deadline: %+v %v, want the lease applied", j, err)
	}
	page, err := l.Jobs(ctx, ledger.JobQuery{State: ledger.JobUnknown})
	if err != nil || len(page.Jobs) != 1 {
		t.Errorf("listing unknown jobs: %d %v", len(page.Jobs), err)
	}
	st, err := l.Sweep(ctx, 10)
	if err != nil || st.Unknown != 1 {
		t.Errorf("sweep: %+v %v, want 1 lease recorded", st, err)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200}); err != nil || c.Won {
		t.Errorf("a result at the deadline won: %v %v", c.Won, err)
	}

	q := params("o", "k2")
	rq, _ := l.Reserve(ctx, q)
	if c, err := l.Complete(ctx, rq.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	if ttl := m.TTL(jobKey(l.Prefix(), rq.Job.ID)); ttl <= 59*time.Minute || ttl > time.Hour+time.Second {
		t.Errorf("completed job's TTL = %v, want its retention", ttl)
	}
	m.SetTime(start.Add(time.Minute + time.Hour - time.Microsecond))
	if r2, _ := l.Reserve(ctx, again(q)); r2.Outcome != ledger.Done || r2.Job.ID != rq.Job.ID {
		t.Errorf("within retention: %v", r2.Outcome)
	}
	m.SetTime(start.Add(time.Minute + time.Hour))
	if _, err := l.Job(ctx, rq.Job.ID); err != ledger.ErrNotFound {
		t.Errorf("expired job still readable: %v", err)
	}
	st, err = l.Sweep(ctx, 10)
	if err != nil || st.Removed != 1 {
		t.Errorf("sweep: %+v %v, want 1 job removed", st, err)
	}
	if m.Exists(identKey(l.Prefix(), identity([]byte("o"), []byte("k2")))) {
		t.Errorf("the sweeper left the expired job's identity key")
	}
	if r2, _ := l.Reserve(ctx, again(q)); r2.Outcome != ledger.Created || r2.Job.ID == rq.Job.ID {
		t.Errorf("after retention: %v %s", r2.Outcome, r2.Job.ID)
	}
}

// TestReplaceInPlace: an expired job that nobody swept is replaced by the
// next reservation of its key, which removes the old job's keys and index
// entries.
func TestReplaceInPlace(t *testing.T) {
	ctx := context.Background()
	m := newMini(t)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start)
	l := openMini(t, m, "replace:")
	p := params("o", "k")
	r, _ := l.Reserve(ctx, p)
	if _, err := l.Fail(ctx, r.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	m.SetTime(start.Add(2 * time.Hour))
	p.Fingerprint = []byte("another request")
	r2, err := l.Reserve(ctx, again(p))
	if err != nil || r2.Outcome != ledger.Created || r2.Job.ID == r.Job.ID {
		t.Fatalf("reserve after expiry: %v %v", r2.Outcome, err)
	}
	for _, k := range []string{jobKey(l.Prefix(), r.Job.ID), attemptsKey(l.Prefix(), r.Job.ID)} {
		if m.Exists(k) {
			t.Errorf("%s survived the replacement", k)
		}
	}
	if ids, _ := m.ZMembers(idxKey(l.Prefix())); len(ids) != 1 || ids[0] != r2.Job.ID {
		t.Errorf("index = %v, want only the new job", ids)
	}
	if ms, _ := m.ZMembers(expiryKey(l.Prefix())); len(ms) != 0 {
		t.Errorf("expiry index = %v, want empty", ms)
	}
	if st, err := l.Sweep(ctx, 10); err != nil || st != (ledger.SweepStats{}) {
		t.Errorf("sweep after replacement: %+v %v", st, err)
	}
	if got, _ := m.Get(identKey(l.Prefix(), identity([]byte("o"), []byte("k")))); got != r2.Job.ID {
		t.Errorf("identity names %q, want the new job", got)
	}
}

// TestReopenKeepsJob: re-opening a failed job removes its expiry.
func TestReopenKeepsJob(t *testing.T) {
	ctx := context.Background()
	m := newMini(t)
	l := openMini(t, m, "reopen:")
	p := params("o", "k")
	r, _ := l.Reserve(ctx, p)
	if _, err := l.Fail(ctx, r.Attempt.Ref(), "503", nil); err != nil {
		t.Fatal(err)
	}
	if m.TTL(jobKey(l.Prefix(), r.Job.ID)) == 0 {
		t.Errorf("failed job has no TTL")
	}
	re, err := l.Reserve(ctx, again(p))
	if err != nil || re.Outcome != ledger.Reopened {
		t.Fatal(re.Outcome, err)
	}
	for _, k := range []string{jobKey(l.Prefix(), r.Job.ID), attemptsKey(l.Prefix(), r.Job.ID)} {
		if ttl := m.TTL(k); ttl != 0 {
			t.Errorf("%s keeps TTL %v after the re-open", k, ttl)
		}
	}
	if ms, _ := m.ZMembers(expiryKey(l.Prefix())); len(ms) != 0 {
		t.Errorf("expiry index = %v after the re-open", ms)
	}
	j, err := l.Job(ctx, r.Job.ID)
	if err != nil || !j.ExpiresAt.IsZero() || !j.CompletedAt.IsZero() || j.State != ledger.JobPending {
		t.Errorf("re-opened job = %+v %v", j, err)
	}
}

// TestBinarySafe: hashes, fingerprints and bodies are arbitrary bytes.
func TestBinarySafe(t *testing.T) {
	ctx := context.Background()
	m := newMini(t)
	l := openMini(t, m, "bin:")
	p := params("\x00\xff:|o", "\x00k\n")
	p.Fingerprint = []byte{0, 1, 2, 255}
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte{0, 'a', 0xff, '\n', 0}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: body, Size: 5, Stored: true}); err != nil {
		t.Fatal(err)
	}
	d, err := l.Reserve(ctx, again(p))
	if err != nil || d.Outcome != ledger.Done || string(d.Job.Response.Body) != string(body) {
		t.Fatalf("replay: %v %+v %v", d.Outcome, d.Job.Response, err)
	}
	j, _ := l.Job(ctx, r.Job.ID)
	if string(j.OwnerHash) != string(p.OwnerHash) || string(j.KeyHash) != string(p.KeyHash) || string(j.Fingerprint) != string(p.Fingerprint) {
		t.Errorf("identity not kept byte for byte: %+v", j)
	}
}

// TestCheckDurabilityUncheckable: miniredis has no CONFIG: the check says it
// could not tell, rather than nothing.
func TestCheckDurabilityUncheckable(t *testing.T) {
	l := openMini(t, newMini(t), "dur:")
	warns := l.CheckDurability(context.Background())
	if len(warns) == 0 || !strings.Contains(warns[0], "could not check") {
		t.Errorf("warnings = %q, want one saying the settings could not be checked", warns)
	}
}

// TestListingSkipsExpired: a job that expired but is still in the index is
// not listed.
func TestListingSkipsExpired(t *testing.T) {
	ctx := context.Background()
	m := newMini(t)
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start)
	l := openMini(t, m, "list:")
	a, _ := l.Reserve(ctx, params("o", "a"))
	if _, err := l.Complete(ctx, a.Attempt.Ref(), ledger.Response{Status: 200}); err != nil {
		t.Fatal(err)
	}
	b, _ := l.Reserve(ctx, params("o", "b"))
	m.SetTime(start.Add(2 * time.Hour))
	page, err := l.Jobs(ctx, ledger.JobQuery{})
	if err != nil || len(page.Jobs) != 1 || page.Jobs[0].ID != b.Job.ID {
		t.Fatalf("listing = %+v %v, want only the live job", page, err)
	}
	if page.Jobs[0].State != ledger.JobUnknown {
		t.Errorf("listed job state %s, want its lease applied", page.Jobs[0].State)
	}
	if _, err := l.Jobs(ctx, ledger.JobQuery{Before: "not-an-id"}); err == nil {
		t.Errorf("a malformed cursor was accepted")
	}
}

// TestCreatedJobIsStored: the job a new reservation returns, which the
// ledger makes from the call's parameters rather than read back, is the
// job it stored, field for field, durations cut to whole microseconds as
// the scripts keep them.
func TestCreatedJobIsStored(t *testing.T) {
	l := openMini(t, newMini(t), "created:")
	ctx := context.Background()
	p := params("owner", "key")
	p.Fingerprint, p.FingerprintVersion, p.FingerprintScheme = []byte{0, 1, 0xff}, 3, "graphql"
	p.Retention = time.Hour + 1500*time.Nanosecond
	p.Attempt.Lease = 30*time.Second + 999*time.Nanosecond
	r, err := l.Reserve(ctx, p)
	if err != nil || r.Outcome != ledger.Created {
		t.Fatalf("Reserve = %v, %v; want created", r.Outcome, err)
	}
	stored, err := l.Job(ctx, p.JobID)
	if err != nil {
		t.Fatal(err)
	}
	stored.ReadAt = time.Time{}
	if !reflect.DeepEqual(r.Job, stored) {
		t.Errorf("Reserve returned\n%+v\nthe ledger holds\n%+v", *r.Job, *stored)
	}
	if r.Attempt == nil || !reflect.DeepEqual(*r.Attempt, stored.Attempts[0]) {
		t.Errorf("Reserve's attempt %+v, the ledger's %+v", r.Attempt, stored.Attempts[0])
	}
	if r.Job.Retention != time.Hour+time.Microsecond || !r.Attempt.Deadline.Equal(r.Now.Add(30*time.Second)) {
		t.Errorf("retention %v, deadline %v after the reservation; want 1h0m0.000001s and 30s",
			r.Job.Retention, r.Attempt.Deadline.Sub(r.Now))
	}
}
