package main

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
	"github.com/onejob/onejob/ledger"
)

// Windows of the unknown checks. The ledger's clock and the driver's are
// the same machine's, but a busy machine schedules late: a second of slack.
const (
	slack = time.Second
	// reserveBound bounds a reservation with its repeats (the gateway's
	// ledgerTimeout): an attempt starts at most this long after the
	// request that reserved it.
	reserveBound = 15 * time.Second
	// acceptSlack: a connection reset on accept comes after its attempt
	// started (the gateway dials once the ledger answered), give or take
	// the moment the ledger's transaction took its time.
	acceptSlack = 250 * time.Millisecond
)

// unknowns: an unknown attempt the upstream never got was cut by a killed
// instance or reset on accept, else the gateway knew it never sent it;
// and every unknown job is counted by the fault that produced it: the
// fault of its last unknown (or lost) attempt.
func (c *checker) unknowns() {
	for _, j := range c.sortedJobs() {
		id, known := c.identOf[j.ID]
		cause := ""
		for i, at := range j.Attempts {
			// A job is unknown through an unknown attempt, or a lost one
			// while no attempt won (its result came too late).
			if at.State != "unknown" && at.State != "lost" {
				continue
			}
			if as := c.byAttempt[attemptKey(j.ID, at.Number)]; len(as) > 0 {
				cause = c.arrivedCause(as[0])
				continue
			}
			if at.State == "lost" {
				continue // reported by the attempt checks: a result never answered
			}
			var prev *adminAttempt
			if i > 0 {
				prev = &j.Attempts[i-1]
			}
			var insts []int
			if known {
				insts = c.instancesAt(id, at, prev)
			}
			cause = c.unarrivedCause(at, insts, c.slotOf(j))
			if cause != "" {
				c.r.UnarrivedUnknown[cause]++
				continue
			}
			cause = "never sent"
			c.r.NeverSent++
			start, _ := at.times()
			c.r.violate("job %s: attempt %d is unknown, but it never reached the upstream and no instance that ran it (%v) was killed: "+
				"the gateway knew it never sent it %s; faults near: %s",
				j.ID, at.Number, insts, c.describe(j.ID), c.faultsNear(insts, start.Add(-slack), start.Add(c.ev.AttemptDeadline+slack)))
		}
		if j.State == "unknown" {
			if cause == "" {
				cause = "no unknown attempt"
			}
			c.r.UnknownByCause[cause]++
		}
	}
}

// arrivedCause names the fault that made an attempt that reached the
// upstream unknown (or lost while nothing won).
func (c *checker) arrivedCause(a *arrival) string {
	switch a.Behaviour {
	case resetBeforeRead, resetAfterRead, stall, cutShort:
		return "upstream: " + a.Behaviour.String()
	}
	var insts []int // the instance that ran it: the one its request went to
	if e := c.byRequest[a.Request]; e != nil {
		insts = []int{e.Instance}
	}
	from, to := a.Start.Add(-slack), a.Start.Add(c.ev.AttemptDeadline+slack)
	if c.killed(insts, from, to) {
		return "gateway killed"
	}
	if a.Behaviour == lateBody {
		return "upstream: " + a.Behaviour.String() // its result races the deadline
	}
	// An answer the gateway could not record: the ledger failed it when
	// the answer came (a.End), or else while the attempt ran.
	for _, w := range [][2]time.Time{{a.End.Add(-acceptSlack), a.End.Add(slack)}, {from, to}} {
		if e := c.linkFault(insts, w[0], w[1]); e != nil {
			return linkFaultName(*e)
		}
		if cause := c.ledgerDown(c.slotOf(c.ev.Jobs[a.JobID]), w[0], w[1]); cause != "" {
			return cause
		}
	}
	if a.Behaviour == answerSlow {
		return "upstream: " + a.Behaviour.String()
	}
	return "no fault found"
}

// unarrivedCause says why an unknown attempt that never reached the
// upstream may have been sent after all, run by one of insts; "" when
// nothing does.
func (c *checker) unarrivedCause(at adminAttempt, insts []int, slot int) string {
	start, finished := at.times()
	if start.IsZero() {
		return ""
	}
	end := start.Add(c.ev.AttemptDeadline + slack)
	if c.killed(insts, start.Add(-slack), end) {
		return "gateway killed"
	}
	// A connection reset on accept: the gateway saw the connection break
	// after it wrote the request. It recorded that itself, unless the
	// ledger link failed meanwhile and the lease ran out; when it recorded
	// the broken connection, the reset came first (after a timeout, the
	// attempt may still have been dialing).
	reason := deref(at.Error)
	leaseExpired := reason == ledger.ReasonLeaseExpired
	if !finished.IsZero() && !leaseExpired && !strings.HasPrefix(reason, "attempt_timeout") && finished.Add(acceptSlack).Before(end) {
		end = finished.Add(acceptSlack)
	}
	for _, r := range c.ev.AcceptResets {
		if r.Provider != at.Provider || r.At.Before(start.Add(-acceptSlack)) || r.At.After(end) {
			continue
		}
		if !leaseExpired {
			return "upstream: reset on accept"
		}
		// The lease ran out instead of the gateway recording the broken
		// connection: the ledger did not answer it right after the reset
		// (its link cut, replies delayed, or the ledger restarting).
		if c.unanswered(insts, slot, r.At, r.At.Add(slack)) {
			return "upstream: reset on accept"
		}
	}
	return ""
}

// unanswered reports whether the ledger could leave a call of one of insts
// (any, when empty) about a job in slot (any, when -1) made between from
// and to without an answer: its server restarting, a fault on the
// cluster's node that served the slot, or the instance's ledger link cut
// or delaying the replies of new calls.
func (c *checker) unanswered(insts []int, slot int, from, to time.Time) bool {
	if c.ledgerDown(slot, from, to) != "" {
		return true
	}
	for _, e := range c.ev.Links {
		if e.Link == "cache" || (len(insts) > 0 && !slices.Contains(insts, e.Gateway)) {
			continue
		}
		s, t := e.span()
		switch e.Kind {
		case faultproxy.KindDelay:
			t = t.Add(-e.Delay) // the window: a call made later is answered in time
		case faultproxy.KindCut:
		default:
			continue
		}
		if !t.Before(from) && !s.After(to) {
			return true
		}
	}
	return false
}

// instancesAt returns the instances that may have run attempt at: those
// the requests of its identity were sent to while it was created. The
// first attempt of a run is reserved by a request that is still open; a
// next one is created by the run of an earlier attempt, after it started.
func (c *checker) instancesAt(id identity, at adminAttempt, prev *adminAttempt) []int {
	start, _ := at.times()
	from := start
	if prev != nil {
		if s, _ := prev.times(); !s.IsZero() {
			from = s
		}
	}
	seen := map[int]bool{}
	var out []int
	for _, e := range c.requests[id] {
		if e.Start.After(start.Add(slack)) || e.Start.Before(from.Add(-reserveBound-slack)) || e.End.Before(from.Add(-slack)) {
			continue
		}
		if !seen[e.Instance] {
			seen[e.Instance] = true
			out = append(out, e.Instance)
		}
	}
	sort.Ints(out)
	return out
}

// killed reports whether one of insts (any, when insts is empty: the
// instance is not known) was killed between from and to.
func (c *checker) killed(insts []int, from, to time.Time) bool {
	for _, k := range c.ev.Kills {
		if (len(insts) == 0 || slices.Contains(insts, k.Gateway)) && !k.At.Before(from) && !k.At.After(to) {
			return true
		}
	}
	return false
}

// linkFault returns a fault on the links of one of insts (any, when insts
// is empty) between from and to, a ledger's before a cache's.
func (c *checker) linkFault(insts []int, from, to time.Time) *linkEvent {
	var found *linkEvent
	for i := range c.ev.Links {
		e := &c.ev.Links[i]
		s, t := e.span()
		if (len(insts) > 0 && !slices.Contains(insts, e.Gateway)) || t.Before(from) || s.After(to) {
			continue
		}
		if found == nil || (found.Link == "cache" && e.Link != "cache") {
			found = e
		}
	}
	return found
}

// ledgerDown names what may have kept the ledger from answering a call
// about a job in slot (any, when -1) between from and to: its server
// restarting, or on a cluster the master of the slot killed (until the
// cluster was whole again) or the slot migrating; "" when nothing did.
func (c *checker) ledgerDown(slot int, from, to time.Time) string {
	for _, r := range c.ev.Restarts {
		if !r.End.Before(from) && !r.At.After(to) {
			return "ledger restart"
		}
	}
	for _, e := range c.ev.Cluster {
		if !e.End.Before(from) && !e.At.After(to) && (slot < 0 || e.holds(slot)) {
			return "cluster: " + e.Kind
		}
	}
	return ""
}

// slotOf returns the cluster slot of job j, or -1 when the ledger is no
// cluster or the job is not known.
func (c *checker) slotOf(j *adminJob) int {
	if !c.ev.OnCluster || j == nil {
		return -1
	}
	return bucketSlot(j.OwnerHash, j.KeyHash)
}

// linkFaultName names a link fault for the figures: its kind, on a
// ledger's link or a cache's.
func linkFaultName(e linkEvent) string {
	if e.Link == "cache" {
		return "cache link: " + kindName(e.Kind)
	}
	return "ledger link: " + kindName(e.Kind)
}

// faultsNear lists the faults of insts (all, when empty) between from and
// to, for a violation's report.
func (c *checker) faultsNear(insts []int, from, to time.Time) string {
	var parts []string
	for _, k := range c.ev.Kills {
		if !k.At.Before(from.Add(-10*time.Second)) && !k.At.After(to) {
			parts = append(parts, fmt.Sprintf("gateway %d killed %s", k.Gateway, k.At.Format("15:04:05.000")))
		}
	}
	for _, e := range c.ev.Links {
		s, t := e.span()
		if (len(insts) == 0 || slices.Contains(insts, e.Gateway)) && !t.Before(from) && !s.After(to) {
			parts = append(parts, fmt.Sprintf("gateway %d's %s: %s", e.Gateway, e.Link, e.Event))
		}
	}
	for _, r := range c.ev.Restarts {
		if !r.End.Before(from) && !r.At.After(to) {
			parts = append(parts, "ledger restart "+r.At.Format("15:04:05.000"))
		}
	}
	for _, e := range c.ev.Cluster {
		if !e.End.Before(from) && !e.At.After(to) {
			parts = append(parts, e.String())
		}
	}
	for _, r := range c.ev.AcceptResets {
		if !r.At.Before(from) && !r.At.After(to) {
			parts = append(parts, fmt.Sprintf("%s reset on accept %s", r.Provider, r.At.Format("15:04:05.000")))
		}
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "; ")
}
