// Package differential holds a ledger whose transitions are written in a
// language of their own (Lua, plpgsql) to ledger/internal/fsm: random
// sequences of calls run against it and against the memory ledger, which
// applies the fsm, and every answer and job must agree.
package differential

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// Subject is a ledger that implements the transitions in a language of
// its own (Lua, plpgsql), with its clock in the test's hands.
type Subject struct {
	// Name says what answers: "scripts", "functions".
	Name   string
	Ledger ledger.Ledger
	// SetClock sets the time every later transition and read of Ledger
	// sees. Answers from the process (replays) must be off: they count
	// down on the wall clock, which the test does not move.
	SetClock func(time.Time)
}

// Run runs random sequences of transitions — new requests,
// repeats with the same ids, stale versions, failovers, hedges,
// never-sent attempts, late results, resolutions, lookups, leases running
// out and jobs expiring — against the ledger open returns and against the
// memory ledger, which applies ledger/internal/fsm, on one clock. Every
// answer and every job must be the same: the subject's rules are the
// fsm's rules.
func Run(t *testing.T, open func(t *testing.T) Subject, seeds, steps int) {
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { runDifferential(t, open, uint64(seed), steps) })
	}
}

type differential struct {
	t     *testing.T
	rng   *rand.Rand
	clock time.Time
	mem   *memory.Ledger
	sub   Subject
	log   []string

	calls    []ledger.ReserveParams // every reservation made, for repeats
	jobs     []string
	attempts []ledger.AttemptRef
	offers   []offer // attempts offered to Fail and Hedge, for repeats
	admins   []admin // resolutions with a response, for repeats
	claims   []claim // lookups claimed, for their settlements
}

// offer is a next attempt offered to op (fail, hedge) beside ref.
type offer struct {
	op   string
	ref  ledger.AttemptRef
	next ledger.NextAttempt
}

// admin is the attempt an operator's resolution of job completed it with.
type admin struct{ job, attempt string }

// claim is a lookup claimed by holder.
type claim struct {
	ref    ledger.AttemptRef
	holder string
}

func runDifferential(t *testing.T, open func(t *testing.T) Subject, seed uint64, steps int) {
	d := &differential{t: t, rng: rand.New(rand.NewPCG(seed, 1)), sub: open(t),
		clock: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	d.sub.SetClock(d.clock)
	d.mem = memory.New(memory.WithClock(func() time.Time { return d.clock }))
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
		d.sub.SetClock(d.clock)
		d.log = append(d.log, "clock "+d.clock.Format(time.TimeOnly))
		// The memory ledger records a lease that ran out when it is read,
		// a shared ledger when a transition or the sweeper touches the
		// job: sweep both now, so that MarkUnknown (which applies no lease
		// first, as fsm.MarkUnknown) finds the same attempt in both.
		_, ea := d.mem.Sweep(ctx, 1000)
		_, eb := d.sub.Ledger.Sweep(ctx, 1000)
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
		b, eb := d.sub.Ledger.Complete(ctx, ref, resp)
		d.check("complete", ea, eb, func() string { return fmt.Sprintf("won %v %s", a.Won, answerString(a.Job)) },
			func() string { return fmt.Sprintf("won %v %s", b.Won, answerString(b.Job)) })
	case op == 5:
		ref, next := d.offer("fail")
		if next != nil && d.pick(3) == 0 {
			next = nil
		}
		a, ea := d.mem.Fail(ctx, ref, "503", next)
		b, eb := d.sub.Ledger.Fail(ctx, ref, "503", next)
		d.check("fail", ea, eb, func() string { return attemptAnswer(a) }, func() string { return attemptAnswer(b) })
		d.addAttempt(a)
	case op == 6:
		ref := d.ref()
		ea, eb := d.mem.Unsent(ctx, ref), d.sub.Ledger.Unsent(ctx, ref)
		d.check("unsent", ea, eb, nil, nil)
	case op == 7:
		ref := d.ref()
		ea, eb := d.mem.MarkUnknown(ctx, ref, "timeout"), d.sub.Ledger.MarkUnknown(ctx, ref, "timeout")
		d.check("mark unknown", ea, eb, nil, nil)
	case op == 8:
		ref, next := d.offer("hedge")
		a, ea := d.mem.Hedge(ctx, ref, *next)
		b, eb := d.sub.Ledger.Hedge(ctx, ref, *next)
		d.check("hedge", ea, eb, func() string { return attemptAnswer(&a) }, func() string { return attemptAnswer(&b) })
		if ea == nil {
			d.addAttempt(&a)
		}
	case op == 9:
		id := d.jobs[d.pick(len(d.jobs))]
		r := ledger.Resolution{Cancel: true}
		if d.pick(2) == 0 {
			resp := ledger.Response{Status: 200, Body: []byte("by hand")}
			r = ledger.Resolution{Response: &resp, AttemptID: ledger.NewID()}
			if len(d.admins) > 0 && d.pick(2) == 0 { // a repeat of an earlier resolution
				a := d.admins[d.pick(len(d.admins))]
				id, r.AttemptID = a.job, a.attempt
			}
			d.admins = append(d.admins, admin{id, r.AttemptID})
		}
		a, ea := d.mem.Resolve(ctx, id, r)
		b, eb := d.sub.Ledger.Resolve(ctx, id, r)
		d.check(fmt.Sprintf("resolve cancel=%v", r.Cancel), ea, eb, func() string { return answerString(a) },
			func() string { return answerString(b) })
	case op == 10:
		ref := d.ref()
		body := []byte("streamed")
		ea := d.mem.SaveBody(ctx, ref, body, int64(len(body)), true)
		eb := d.sub.Ledger.SaveBody(ctx, ref, body, int64(len(body)), true)
		d.check("save body", ea, eb, nil, nil)
	case op == 11:
		ref, holder := d.unknownRef(), fmt.Sprint("r", d.pick(3))
		lease := time.Duration(1+d.pick(2)) * 30 * time.Second
		a, ea := d.mem.ClaimLookup(ctx, ref, holder, lease)
		b, eb := d.sub.Ledger.ClaimLookup(ctx, ref, holder, lease)
		d.check("claim lookup "+holder, ea, eb, func() string { return answerString(a) }, func() string { return answerString(b) })
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
		_, eb := d.sub.Ledger.Sweep(ctx, 100)
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
	b, eb := d.sub.Ledger.SettleLookup(ctx, ref, holder, r)
	d.check(fmt.Sprintf("settle lookup %s %d", holder, r.Status), ea, eb, func() string { return answerString(a) },
		func() string { return answerString(b) })
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
	b, eb := d.sub.Ledger.Reserve(ctx, p)
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

// offer returns a known attempt and a new attempt to start beside it
// with op, or a call of op made before (a repeat: the same ids, as a
// gateway repeats a call whose reply it lost).
func (d *differential) offer(op string) (ledger.AttemptRef, *ledger.NextAttempt) {
	var before []offer
	for _, o := range d.offers {
		if o.op == op {
			before = append(before, o)
		}
	}
	if len(before) > 0 && d.pick(3) == 0 {
		o := before[d.pick(len(before))]
		return o.ref, &o.next
	}
	o := offer{op: op, ref: d.ref(),
		next: ledger.NextAttempt{ID: ledger.NewID(), Provider: fmt.Sprint("p", d.pick(3)), Lease: time.Duration(1+d.pick(2)) * 30 * time.Second}}
	d.offers = append(d.offers, o)
	return o.ref, &o.next
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
		d.t.Errorf("%s: fsm says %v, %s says %v", op, ea, d.sub.Name, eb)
		return
	}
	if ea == nil && a != nil {
		if x, y := a(), b(); x != y {
			d.t.Errorf("%s answered differently:\nfsm: %s\n%s: %s", op, x, d.sub.Name, y)
		}
	}
}

// compareJobs reads every job from both ledgers.
func (d *differential) compareJobs() {
	d.t.Helper()
	for _, id := range d.jobs {
		a, ea := d.mem.Job(context.Background(), id)
		b, eb := d.sub.Ledger.Job(context.Background(), id)
		if errString(ea) != errString(eb) {
			d.t.Errorf("job %s: fsm says %v, %s says %v", id, ea, d.sub.Name, eb)
			continue
		}
		if x, y := jobString(a), jobString(b); ea == nil && x != y {
			d.t.Errorf("job differs:\nfsm: %s\n%s: %s", x, d.sub.Name, y)
		}
	}
}

func (d *differential) compareListing() {
	d.t.Helper()
	a, ea := d.mem.Jobs(context.Background(), ledger.JobQuery{Limit: ledger.MaxLimit})
	b, eb := d.sub.Ledger.Jobs(context.Background(), ledger.JobQuery{Limit: ledger.MaxLimit})
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
		d.t.Errorf("listing differs:\nfsm: %v\n%s: %v", x, d.sub.Name, y)
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
	return fmt.Sprintf("%v at %s; %s; %s", r.Outcome, r.Now.Format(time.TimeOnly), attemptAnswer(r.Attempt), answerString(r.Job))
}

// attemptAnswer is what every ledger tells of an attempt it started or
// found in the answer to a transition: enough to send it (PostgreSQL tells
// no more).
func attemptAnswer(a *ledger.Attempt) string {
	if a == nil {
		return "no attempt"
	}
	return fmt.Sprintf("attempt %d %s job %s on %s %s v%d started %s deadline %s",
		a.Number, a.ID, a.JobID, a.Provider, a.State, a.JobVersion, stamp(a.StartedAt), stamp(a.Deadline))
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

// answerString is what every ledger tells of a job in the answer to a
// transition: where it stands and its result. How much more it tells
// differs (PostgreSQL answers no attempts, nor the job's identity); the
// whole job is compared as read after every step (compareJobs).
func answerString(j *ledger.Job) string {
	if j == nil {
		return "no job"
	}
	s := fmt.Sprintf("job %s %s v%d by %q done %s expires %s", j.ID, j.State, j.Version, j.CompletedBy,
		stamp(j.CompletedAt), stamp(j.ExpiresAt))
	if r := j.Response; r != nil {
		s += fmt.Sprintf(" response %d %v size %d stored %v body %q", r.Status, r.Header, r.Size, r.Stored, r.Body)
	}
	return s
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
