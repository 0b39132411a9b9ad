package redis

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/memory"
)

// TestScriptsFollowFSM runs random sequences of transitions — new
// requests, repeats with the same ids, stale versions, failovers, hedges,
// never-sent attempts, late results, resolutions, leases running out and
// jobs expiring — against the scripts on miniredis and against the memory
// ledger, which applies ledger/internal/fsm, on one clock. Every answer and
// every job must be the same: the Lua rules are the fsm's rules.
func TestScriptsFollowFSM(t *testing.T) {
	seeds, steps := 60, 50
	if testing.Short() {
		seeds = 10
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runDifferential(t, uint64(seed), steps) })
	}
}

type differential struct {
	t     *testing.T
	rng   *rand.Rand
	clock time.Time
	m     interface{ SetTime(time.Time) }
	mem   *memory.Ledger
	red   *Ledger
	log   []string

	calls    []ledger.ReserveParams // every reservation made, for repeats
	jobs     []string
	attempts []ledger.AttemptRef
	nexts    []ledger.NextAttempt // attempts offered to Fail and Hedge, for repeats
	admins   []string             // admin attempt ids offered to Resolve
	claims   []claim              // lookups claimed, for their settlements
}

// claim is a lookup claimed by holder.
type claim struct {
	ref    ledger.AttemptRef
	holder string
}

func runDifferential(t *testing.T, seed uint64, steps int) {
	m := newMini(t)
	d := &differential{t: t, rng: rand.New(rand.NewPCG(seed, 1)), m: m,
		clock: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	m.SetTime(d.clock)
	d.mem = memory.New(memory.WithClock(func() time.Time { return d.clock }))
	d.red = openMini(t, m, "diff:")
	// Replays answered from the process count down on the wall clock, which
	// this test does not move: leave them to the ledger.
	d.red.replays = near.New(0, 0)
	for range steps {
		d.step()
		d.compareJobs()
		if t.Failed() {
			t.Logf("seed %d, steps:\n%s", seed, strings.Join(d.log, "\n"))
			return
		}
	}
	d.compareListing()
}

func (d *differential) pick(n int) int { return d.rng.IntN(n) }

func (d *differential) step() {
	ctx := context.Background()
	switch op := d.pick(14); {
	case op < 3:
		d.reserve(ctx)
	case op == 3:
		steps := []time.Duration{time.Second, 20 * time.Second, time.Minute, 2 * time.Hour}
		d.clock = d.clock.Add(steps[d.pick(len(steps))])
		d.m.SetTime(d.clock)
		d.log = append(d.log, "clock "+d.clock.Format(time.TimeOnly))
		// The memory ledger records a lease that ran out when it is read,
		// the Redis ledger when a script or the sweeper touches the job:
		// sweep both now, so that MarkUnknown (which applies no lease
		// first, as fsm.MarkUnknown) finds the same attempt in both.
		_, ea := d.mem.Sweep(ctx, 1000)
		_, eb := d.red.Sweep(ctx, 1000)
		d.check("sweep", ea, eb, nil, nil)
	case len(d.attempts) == 0:
		d.reserve(ctx)
	case op == 4:
		ref := d.ref()
		resp := ledger.Response{Status: 200 + d.pick(3), Header: map[string][]string{"X": {"a"}},
			Body: []byte(ref.AttemptID[:8]), Size: 8, Stored: d.pick(4) > 0}
		if !resp.Stored {
			resp.Body = nil // sent before it ended: its body comes later, if at all
		}
		a, ea := d.mem.Complete(ctx, ref, resp)
		b, eb := d.red.Complete(ctx, ref, resp)
		d.check("complete", ea, eb, func() string { return fmt.Sprintf("won %v %s", a.Won, jobString(a.Job)) },
			func() string { return fmt.Sprintf("won %v %s", b.Won, jobString(b.Job)) })
	case op == 5:
		ref, next := d.ref(), d.next()
		if d.pick(3) == 0 {
			next = nil
		}
		a, ea := d.mem.Fail(ctx, ref, "503", next)
		b, eb := d.red.Fail(ctx, ref, "503", next)
		d.check("fail", ea, eb, func() string { return attemptString(a) }, func() string { return attemptString(b) })
		d.addAttempt(a)
	case op == 6:
		ref := d.ref()
		ea, eb := d.mem.Unsent(ctx, ref), d.red.Unsent(ctx, ref)
		d.check("unsent", ea, eb, nil, nil)
	case op == 7:
		ref := d.ref()
		ea, eb := d.mem.MarkUnknown(ctx, ref, "timeout"), d.red.MarkUnknown(ctx, ref, "timeout")
		d.check("mark unknown", ea, eb, nil, nil)
	case op == 8:
		ref, next := d.ref(), d.next()
		a, ea := d.mem.Hedge(ctx, ref, *next)
		b, eb := d.red.Hedge(ctx, ref, *next)
		d.check("hedge", ea, eb, func() string { return attemptString(&a) }, func() string { return attemptString(&b) })
		if ea == nil {
			d.addAttempt(&a)
		}
	case op == 9:
		id := d.jobs[d.pick(len(d.jobs))]
		r := ledger.Resolution{Cancel: true}
		if d.pick(2) == 0 {
			resp := ledger.Response{Status: 200, Body: []byte("by hand")}
			r = ledger.Resolution{Response: &resp, AttemptID: ledger.NewID()}
			if len(d.admins) > 0 && d.pick(2) == 0 {
				r.AttemptID = d.admins[d.pick(len(d.admins))]
			}
			d.admins = append(d.admins, r.AttemptID)
		}
		a, ea := d.mem.Resolve(ctx, id, r)
		b, eb := d.red.Resolve(ctx, id, r)
		d.check(fmt.Sprintf("resolve cancel=%v", r.Cancel), ea, eb, func() string { return jobString(a) },
			func() string { return jobString(b) })
	case op == 10:
		ref := d.ref()
		body := []byte("streamed")
		ea := d.mem.SaveBody(ctx, ref, body, int64(len(body)), true)
		eb := d.red.SaveBody(ctx, ref, body, int64(len(body)), true)
		d.check("save body", ea, eb, nil, nil)
	case op == 11:
		ref, holder := d.unknownRef(), fmt.Sprint("r", d.pick(3))
		lease := time.Duration(1+d.pick(2)) * 30 * time.Second
		a, ea := d.mem.ClaimLookup(ctx, ref, holder, lease)
		b, eb := d.red.ClaimLookup(ctx, ref, holder, lease)
		d.check("claim lookup "+holder, ea, eb, func() string { return jobString(a) }, func() string { return jobString(b) })
		if ea == nil {
			d.claims = append(d.claims, claim{ref, holder})
			if d.pick(2) == 0 {
				d.settleLookup(ctx, ref, holder)
			}
		}
	case op == 12:
		ref, holder := d.ref(), fmt.Sprint("r", d.pick(3))
		if len(d.claims) > 0 && d.pick(3) > 0 {
			c := d.claims[d.pick(len(d.claims))]
			ref, holder = c.ref, c.holder
		}
		d.settleLookup(ctx, ref, holder)
	default:
		_, ea := d.mem.Sweep(ctx, 100)
		_, eb := d.red.Sweep(ctx, 100)
		d.check("sweep", ea, eb, nil, nil) // the counts differ: memory's reads record leases
	}
}

// settleLookup settles a lookup with an answer found, absent, or neither.
func (d *differential) settleLookup(ctx context.Context, ref ledger.AttemptRef, holder string) {
	r := ledger.LookupResult{Status: 503, Retry: time.Minute}
	switch d.pick(3) {
	case 0:
		r = ledger.LookupResult{Status: 200, Found: &ledger.Response{Status: 201,
			Header: map[string][]string{"Y": {"b"}}, Body: []byte("looked up")}}
	case 1:
		r = ledger.LookupResult{Status: 404, Absent: true}
	}
	a, ea := d.mem.SettleLookup(ctx, ref, holder, r)
	b, eb := d.red.SettleLookup(ctx, ref, holder, r)
	d.check(fmt.Sprintf("settle lookup %s %d", holder, r.Status), ea, eb, func() string { return jobString(a) },
		func() string { return jobString(b) })
}

// reserve makes a new request, another request for a known identity, or
// a repeat of an earlier call.
func (d *differential) reserve(ctx context.Context) {
	var p ledger.ReserveParams
	switch n := len(d.calls); {
	case n == 0 || d.pick(4) == 0:
		p = ledger.ReserveParams{
			OwnerHash: []byte("owner"), KeyHash: []byte(fmt.Sprint("key", d.pick(3))),
			Fingerprint: []byte("fp"), FingerprintVersion: 1, Retention: time.Hour,
			Attempt: ledger.NextAttempt{Provider: "a", Lease: 30 * time.Second},
		}
		if d.pick(5) == 0 {
			p.Fingerprint = []byte("other request")
		}
		p.JobID, p.Attempt.ID = ledger.NewID(), ledger.NewID()
	case d.pick(2) == 0:
		p = d.calls[d.pick(n)] // a repeat
	default:
		p = d.calls[d.pick(n)]
		p.JobID, p.Attempt.ID = ledger.NewID(), ledger.NewID()
	}
	d.calls = append(d.calls, p)
	a, ea := d.mem.Reserve(ctx, p)
	b, eb := d.red.Reserve(ctx, p)
	d.check("reserve "+string(p.KeyHash), ea, eb, func() string { return reservationString(a) },
		func() string { return reservationString(b) })
	if ea == nil && a.Job != nil && a.Outcome != ledger.Mismatch {
		d.addJob(a.Job.ID)
		d.addAttempt(a.Attempt)
	}
}

func (d *differential) addJob(id string) {
	for _, j := range d.jobs {
		if j == id {
			return
		}
	}
	d.jobs = append(d.jobs, id)
}

func (d *differential) addAttempt(a *ledger.Attempt) {
	if a == nil {
		return
	}
	for _, r := range d.attempts {
		if r.AttemptID == a.ID {
			return
		}
	}
	d.attempts = append(d.attempts, a.Ref())
}

// ref returns a known attempt, sometimes with another version than the
// one it read.
func (d *differential) ref() ledger.AttemptRef {
	r := d.attempts[d.pick(len(d.attempts))]
	if d.pick(6) == 0 {
		r.Version += int64(d.pick(3)) - 1
	}
	return r
}

// unknownRef returns, mostly, an attempt the memory ledger reads as
// unknown (what a lookup may claim), else any known attempt.
func (d *differential) unknownRef() ledger.AttemptRef {
	var unknown []ledger.AttemptRef
	for _, r := range d.attempts {
		if j, err := d.mem.Job(context.Background(), r.JobID); err == nil {
			for _, a := range j.Attempts {
				if a.ID == r.AttemptID && a.State == ledger.AttemptUnknown {
					unknown = append(unknown, r)
				}
			}
		}
	}
	if len(unknown) == 0 || d.pick(4) == 0 {
		return d.ref()
	}
	return unknown[d.pick(len(unknown))]
}

// next returns a new attempt to start, or one offered before (a repeat).
func (d *differential) next() *ledger.NextAttempt {
	if len(d.nexts) > 0 && d.pick(3) == 0 {
		n := d.nexts[d.pick(len(d.nexts))]
		return &n
	}
	n := ledger.NextAttempt{ID: ledger.NewID(), Provider: fmt.Sprint("p", d.pick(3)), Lease: time.Duration(1+d.pick(2)) * 30 * time.Second}
	d.nexts = append(d.nexts, n)
	return &n
}

// check compares two answers: the same error, or the same result.
func (d *differential) check(op string, ea, eb error, a, b func() string) {
	d.t.Helper()
	line := op + ": " + errString(ea)
	if ea == nil && a != nil {
		line = op + ": " + a()
	}
	d.log = append(d.log, line)
	if errString(ea) != errString(eb) {
		d.t.Errorf("%s: fsm says %v, scripts say %v", op, ea, eb)
		return
	}
	if ea == nil && a != nil {
		if x, y := a(), b(); x != y {
			d.t.Errorf("%s answered differently:\nfsm:     %s\nscripts: %s", op, x, y)
		}
	}
}

// compareJobs reads every job from both ledgers.
func (d *differential) compareJobs() {
	d.t.Helper()
	for _, id := range d.jobs {
		a, ea := d.mem.Job(context.Background(), id)
		b, eb := d.red.Job(context.Background(), id)
		if errString(ea) != errString(eb) {
			d.t.Errorf("job %s: fsm says %v, scripts say %v", id, ea, eb)
			continue
		}
		if x, y := jobString(a), jobString(b); ea == nil && x != y {
			d.t.Errorf("job differs:\nfsm:     %s\nscripts: %s", x, y)
		}
	}
}

func (d *differential) compareListing() {
	d.t.Helper()
	a, ea := d.mem.Jobs(context.Background(), ledger.JobQuery{Limit: ledger.MaxLimit})
	b, eb := d.red.Jobs(context.Background(), ledger.JobQuery{Limit: ledger.MaxLimit})
	if ea != nil || eb != nil {
		d.t.Fatalf("listing: %v, %v", ea, eb)
	}
	var x, y []string
	for _, j := range a.Jobs {
		x = append(x, j.ID+" "+string(j.State))
	}
	for _, j := range b.Jobs {
		y = append(y, j.ID+" "+string(j.State))
	}
	if fmt.Sprint(x) != fmt.Sprint(y) {
		d.t.Errorf("listing differs:\nfsm:     %v\nscripts: %v", x, y)
	}
}

func errString(err error) string {
	for _, s := range []error{ledger.ErrNotFound, ledger.ErrStale, ledger.ErrBlocked, ledger.ErrCompleted} {
		if errors.Is(err, s) {
			return s.Error()
		}
	}
	if err != nil {
		return "other: " + err.Error()
	}
	return "ok"
}

func reservationString(r ledger.Reservation) string {
	if r.Outcome == ledger.Mismatch {
		return fmt.Sprintf("%v job %s %s", r.Outcome, r.Job.ID, r.Job.State)
	}
	return fmt.Sprintf("%v at %s; %s; %s", r.Outcome, r.Now.Format(time.TimeOnly), attemptString(r.Attempt), jobString(r.Job))
}

func attemptString(a *ledger.Attempt) string {
	if a == nil {
		return "no attempt"
	}
	s := fmt.Sprintf("attempt %d %s job %s on %s %s v%d started %s deadline %s finished %s error %q",
		a.Number, a.ID, a.JobID, a.Provider, a.State, a.JobVersion, stamp(a.StartedAt), stamp(a.Deadline), stamp(a.FinishedAt), a.Error)
	if k := a.Lookup; k != nil {
		s += fmt.Sprintf(" lookups %d last %d at %s next %s settled %v holder %q until %s",
			k.Tries, k.LastStatus, stamp(k.LastAt), stamp(k.NextAt), k.Settled, k.Holder, stamp(k.Until))
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05.000000")
}

func jobString(j *ledger.Job) string {
	if j == nil {
		return "no job"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "job %s %s v%d by %q owner %q key %q fp %q/%d retention %v created %s done %s expires %s",
		j.ID, j.State, j.Version, j.CompletedBy, j.OwnerHash, j.KeyHash, j.Fingerprint, j.FingerprintVersion,
		j.Retention, stamp(j.CreatedAt), stamp(j.CompletedAt), stamp(j.ExpiresAt))
	if r := j.Response; r != nil {
		fmt.Fprintf(&b, " response %d %v size %d stored %v body %q", r.Status, r.Header, r.Size, r.Stored, r.Body)
	}
	for i := range j.Attempts {
		b.WriteString("\n  " + attemptString(&j.Attempts[i]))
	}
	return b.String()
}
