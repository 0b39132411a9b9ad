package main

import (
	"encoding/hex"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/proxy"
)

// The checks, over what the upstream, the ledger and the clients saw.
//
// An arrival is a request the upstream's handler received; it carries the
// job id and attempt number the gateway sends upstream. An execution is an
// arrival whose handler reached its side effect: every behaviour but the
// 503 refusal and the reset before the body was read. The checks:
//
//   - every job belongs to one owner and key a client sent (by the stored
//     hashes), one job per owner and key, and ends completed, failed or
//     unknown, none pending and no attempt starting;
//   - every arrival is a recorded attempt of the job for its own owner and
//     key, on the provider it reached, and no attempt arrives twice; an
//     attempt recorded without an arrival (refused, reset before it was
//     read, its instance killed first) is fine;
//   - an attempt recorded failed never executed, and one recorded never
//     sent never arrived; one that succeeded or lost was answered; a job's
//     next attempt starts only after the previous one failed, and a job is
//     executed at most once (no hedging in the soak); its arrivals never
//     overlap in time; an intent (owner and key) is executed at most once,
//     whichever of its jobs ran it (a job the ledger lost, and the one a
//     retry created in its place);
//   - a completed job's stored status and size are its winning attempt's
//     answer; only a stream cut short after it won goes unstored;
//   - every answer a client got was for its own owner and key, names the
//     job of that owner and key, and a result is the job's one result, the
//     upstream's bytes, marked Idempotent-Replayed exactly when another
//     request's attempt produced it; a result the ledger could not record
//     reached a client first-hand only, and its job is unknown;
//   - after the run, a retry of a completed job replays the stored answer
//     byte for byte, of an unknown one gets 409 without Retry-After, and
//     neither reaches the upstream;
//   - an answer is marked Idempotent-Replayed exactly when another
//     request's attempt produced it: the gateway passes each client
//     request's X-Chaos-Request upstream, so the arrival an answer's body
//     names (its Seq) tells which request started the attempt (and its
//     Idempotency-Job-Id and Idempotency-Attempt, which job and attempt);
//     wrongly marked and wrongly unmarked answers are counted;
//   - an attempt is unknown only when it may have reached a provider: one
//     the upstream never got is unknown legitimately only if its gateway
//     instance was killed while it ran, or the upstream reset a connection
//     on accept on its provider while it ran (the gateway may have written
//     the request into it: nobody can prove it was not sent). Any other
//     unknown attempt that never arrived is one the gateway knew it never
//     sent: a violation. Which instance ran an attempt is read from the
//     clients' record: the instances the requests of its key were sent to
//     while it started;
//   - as figures: every unknown job, by the fault that produced it (an
//     upstream behaviour, a killed instance, a fault on its instance's
//     ledger link, a ledger restart, or on a cluster a fault on its slot's
//     master, while its attempt ran).
//
// evidence is everything a run saw, gathered once every deadline passed.
type evidence struct {
	Hasher    proxy.Hasher // as the gateways hash owners and keys
	Providers []string
	IDs       []identity           // every identity the clients could use
	Arrivals  []arrival            // the upstream's record
	Exchanges []exchange           // the clients' record
	Jobs      map[string]*adminJob // the ledger, by job id
	Replays   map[identity]exchange
	// ArrivalsAfter is the upstream's arrival count after the replays:
	// a replay of a finished job never reaches the upstream.
	ArrivalsAfter int

	// The run's settings and faults, to tell a legitimate unknown from
	// one the gateway should have avoided, and to say which fault
	// produced each.
	AttemptTimeout  time.Duration
	AttemptDeadline time.Duration
	Kills           []killEvent
	Restarts        []restartEvent
	Links           []linkEvent // ledger-link faults, by instance
	AcceptResets    []acceptReset
	// Cluster is set on Redis Cluster: its faults (masters killed, slots
	// migrated), each touching the jobs of its slots only.
	Cluster   []clusterEvent
	OnCluster bool
}

// checker holds the indexes the checks share.
type checker struct {
	ev *evidence
	r  *report

	jobOf     map[identity]*adminJob
	identOf   map[string]identity   // job id → identity
	byAttempt map[string][]*arrival // "job#n" → arrivals of that attempt
	byJob     map[string][]*arrival // job id → arrivals
	bySeq     map[uint64]*arrival   // arrival by its sequence number
	winner    map[string]*arrival   // job id → the winning attempt's arrival
	results   map[string]map[uint64]bool
	idsByHash map[string]identity
	byRequest map[uint64]*exchange     // a client request by its X-Chaos-Request
	requests  map[identity][]*exchange // the requests of an identity
}

// check runs every check of the soak over the evidence.
func check(ev *evidence) *report {
	c := &checker{
		ev: ev,
		r: &report{
			JobsByState:      map[string]int{},
			AttemptsByState:  map[string]int{},
			UnknownByCause:   map[string]int{},
			UnarrivedUnknown: map[string]int{},
		},
		jobOf:     map[identity]*adminJob{},
		identOf:   map[string]identity{},
		byAttempt: map[string][]*arrival{},
		byJob:     map[string][]*arrival{},
		bySeq:     map[uint64]*arrival{},
		winner:    map[string]*arrival{},
		results:   map[string]map[uint64]bool{},
		idsByHash: map[string]identity{},
		byRequest: map[uint64]*exchange{},
		requests:  map[identity][]*exchange{},
	}
	for i := range ev.Exchanges {
		e := &ev.Exchanges[i]
		c.byRequest[e.Request] = e
		c.requests[e.ID] = append(c.requests[e.ID], e)
	}
	c.identify()
	c.arrivals()
	for _, j := range c.sortedJobs() {
		c.job(j)
	}
	c.attempts()
	c.sequences()
	c.duplicates()
	c.overlaps()
	c.winners()
	c.exchanges()
	c.replays()
	c.unknowns()
	return c.r
}

func attemptKey(jobID string, n int) string { return fmt.Sprintf("%s#%d", jobID, n) }

func (c *checker) sortedJobs() []*adminJob {
	jobs := make([]*adminJob, 0, len(c.ev.Jobs))
	for _, j := range c.ev.Jobs {
		jobs = append(jobs, j)
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].ID < jobs[b].ID })
	return jobs
}

// identify: every job belongs to one identity the clients used, one job
// per identity.
func (c *checker) identify() {
	for _, id := range c.ev.IDs {
		h := hex.EncodeToString(c.ev.Hasher.Owner("Bearer "+id.Owner)) + "/" + hex.EncodeToString(c.ev.Hasher.Key(id.Key))
		c.idsByHash[h] = id
	}
	for _, j := range c.sortedJobs() {
		id, ok := c.idsByHash[j.OwnerHash+"/"+j.KeyHash]
		if !ok {
			c.r.violate("job %s: its owner and key hashes match no owner and key a client sent", j.ID)
		} else {
			if other := c.jobOf[id]; other != nil {
				c.r.violate("%s has two jobs: %s and %s", id, other.ID, j.ID)
			}
			c.jobOf[id] = j
			c.identOf[j.ID] = id
		}
	}
}

// describe sums up a job for a violation: its state and attempts in the
// ledger, and its arrivals at the upstream.
func (c *checker) describe(id string) string {
	var parts []string
	if j := c.ev.Jobs[id]; j != nil {
		parts = append(parts, fmt.Sprintf("ledger: %s v%d completed_by %s", j.State, j.Version, deref(j.CompletedBy)))
		for _, a := range j.Attempts {
			s := fmt.Sprintf("attempt %d %s %s", a.Number, a.Provider, a.State)
			if a.Error != nil {
				s += " (" + *a.Error + ")"
			}
			parts = append(parts, s)
		}
	}
	as := slices.Clone(c.byJob[id])
	sort.Slice(as, func(a, b int) bool { return as[a].Start.Before(as[b].Start) })
	for _, a := range as {
		parts = append(parts, fmt.Sprintf("upstream: attempt %d %s %s..%s status %d",
			a.Attempt, a.Behaviour, a.Start.Format("15:04:05.000"), a.End.Format("15:04:05.000"), a.Status))
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

// job: a job is in a final state, its attempts well formed, one result at
// most.
func (c *checker) job(j *adminJob) {
	r := c.r
	r.JobsByState[j.State]++
	switch j.State {
	case "completed", "failed", "unknown":
	default:
		r.violate("job %s is %s after every deadline passed %s", j.ID, j.State, c.describe(j.ID))
	}
	if len(j.Attempts) == 0 {
		r.violate("job %s has no attempt", j.ID)
	}
	succeeded := 0
	for i, a := range j.Attempts {
		r.AttemptsByState[a.State]++
		if a.Number != i+1 {
			r.violate("job %s: attempt %d is listed in position %d", j.ID, a.Number, i+1)
		}
		if !slices.Contains(c.ev.Providers, a.Provider) {
			r.violate("job %s: attempt %d on provider %q, which is not configured", j.ID, a.Number, a.Provider)
		}
		switch a.State {
		case "starting":
			r.violate("job %s: attempt %d still starting after its deadline %s", j.ID, a.Number, c.describe(j.ID))
		case "cancelled":
			r.violate("job %s: attempt %d cancelled, but no operator resolved anything", j.ID, a.Number)
		case "failed":
			if deref(a.Error) == ledger.ReasonUnsent {
				r.Unsent++
			}
		case "succeeded":
			succeeded++
			if j.CompletedBy == nil || *j.CompletedBy != a.ID {
				r.violate("job %s: attempt %d succeeded but the job is completed by %v", j.ID, a.Number, deref(j.CompletedBy))
			}
		}
	}
	if j.State == "completed" {
		if succeeded != 1 || j.CompletedBy == nil || j.Response == nil {
			r.violate("job %s is completed with %d succeeded attempts, response %v %s",
				j.ID, succeeded, j.Response != nil, c.describe(j.ID))
		}
	} else if succeeded != 0 || j.CompletedBy != nil {
		r.violate("job %s is %s, but has %d succeeded attempts %s", j.ID, j.State, succeeded, c.describe(j.ID))
	}
}

func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

func (c *checker) attemptOf(j *adminJob, n int) *adminAttempt {
	for i := range j.Attempts {
		if j.Attempts[i].Number == n {
			return &j.Attempts[i]
		}
	}
	return nil
}

// arrivals: everything that reached the upstream was a recorded attempt of
// the job for that owner and key, sent once; a failed attempt never acted.
func (c *checker) arrivals() {
	r := c.r
	for i := range c.ev.Arrivals {
		a := &c.ev.Arrivals[i]
		r.Arrivals++
		if a.Executed {
			r.Executions++
		}
		c.bySeq[a.Seq] = a
		if a.Header != "" {
			r.violate("the upstream got a request for %s/%s with %s", a.Owner, a.Key, a.Header)
			continue
		}
		j := c.ev.Jobs[a.JobID]
		if j == nil {
			r.violate("the upstream got attempt %d of job %s (%s/%s), which the ledger does not have", a.Attempt, a.JobID, a.Owner, a.Key)
			continue
		}
		if id, ok := c.identOf[j.ID]; ok && id != (identity{Owner: a.Owner, Key: a.Key}) {
			r.violate("job %s belongs to %s, but the upstream got it for %s/%s", j.ID, id, a.Owner, a.Key)
		}
		c.byJob[j.ID] = append(c.byJob[j.ID], a)
		k := attemptKey(j.ID, a.Attempt)
		c.byAttempt[k] = append(c.byAttempt[k], a)
		at := c.attemptOf(j, a.Attempt)
		if at == nil {
			r.violate("the upstream got attempt %d of job %s, which the ledger does not record", a.Attempt, j.ID)
			continue
		}
		if at.Provider != a.Provider {
			r.violate("job %s: attempt %d is recorded on %s, but reached %s", j.ID, a.Attempt, at.Provider, a.Provider)
		}
		if at.State == "failed" && deref(at.Error) == ledger.ReasonUnsent {
			r.violate("job %s: attempt %d is recorded never sent, but it reached the upstream (%s) %s",
				j.ID, a.Attempt, a.Behaviour, c.describe(j.ID))
		} else if at.State == "failed" && a.Executed {
			r.violate("job %s: attempt %d is recorded failed (%s), but the upstream acted on it (%s)",
				j.ID, a.Attempt, deref(at.Error), a.Behaviour)
		}
	}
	keys := make([]string, 0, len(c.byAttempt))
	for k := range c.byAttempt {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if as := c.byAttempt[k]; len(as) > 1 {
			var how []string
			for _, a := range as {
				how = append(how, fmt.Sprintf("%s at %s", a.Behaviour, a.Start.Format("15:04:05.000")))
			}
			r.violate("attempt %s reached the upstream %d times: %s", k, len(as), strings.Join(how, ", "))
		}
	}
}

// attempts: an attempt that produced a result (succeeded or lost) was
// answered by the upstream; attempts that never arrived are counted.
func (c *checker) attempts() {
	for _, j := range c.sortedJobs() {
		for _, at := range j.Attempts {
			as := c.byAttempt[attemptKey(j.ID, at.Number)]
			if len(as) == 0 {
				c.r.NeverReached++
			}
			if at.State != "succeeded" && at.State != "lost" {
				continue
			}
			answered := false
			for _, a := range as {
				answered = answered || (a.Executed && a.Status != 0)
			}
			if !answered {
				c.r.violate("job %s: attempt %d is %s, but the upstream never answered it %s", j.ID, at.Number, at.State, c.describe(j.ID))
			}
		}
	}
}

// sequences: without hedging or an operator, a job's next attempt starts
// only once the previous one failed definitively, and an intent is
// executed at most once.
func (c *checker) sequences() {
	for _, j := range c.sortedJobs() {
		for i, at := range j.Attempts[:max(0, len(j.Attempts)-1)] {
			if at.State != "failed" {
				c.r.violate("job %s: attempt %d started after attempt %d ended %s %s",
					j.ID, j.Attempts[i+1].Number, at.Number, at.State, c.describe(j.ID))
			}
		}
		var executed []string
		for _, a := range c.byJob[j.ID] {
			if a.Executed {
				executed = append(executed, fmt.Sprintf("attempt %d (%s)", a.Attempt, a.Behaviour))
			}
		}
		if len(executed) > 1 {
			c.r.violate("job %s was executed %d times: %s %s", j.ID, len(executed), strings.Join(executed, ", "), c.describe(j.ID))
		}
	}
}

// duplicates: an intent is executed at most once, whichever jobs its
// executions came from: a job the ledger lost, and a new one for the same
// owner and key, are two executions of one intent.
func (c *checker) duplicates() {
	byID := map[identity][]*arrival{}
	for i := range c.ev.Arrivals {
		a := &c.ev.Arrivals[i]
		if a.Executed && a.Header == "" {
			id := identity{Owner: a.Owner, Key: a.Key}
			byID[id] = append(byID[id], a)
		}
	}
	ids := make([]identity, 0, len(byID))
	for id := range byID {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a].String() < ids[b].String() })
	for _, id := range ids {
		as := byID[id]
		if len(as) < 2 {
			continue
		}
		c.r.Duplicates = append(c.r.Duplicates, id)
		sort.Slice(as, func(a, b int) bool { return as[a].Start.Before(as[b].Start) })
		jobs := map[string]bool{}
		var how []string
		for _, a := range as {
			jobs[a.JobID] = true
			state := "not in the ledger"
			if j := c.ev.Jobs[a.JobID]; j != nil {
				state = j.State
			}
			how = append(how, fmt.Sprintf("job %s (%s) attempt %d at %s", a.JobID, state, a.Attempt, a.Start.Format("15:04:05.000")))
		}
		if len(jobs) > 1 { // one job's are reported by sequences
			c.r.violate("%s was executed %d times, in %d jobs: %s", id, len(as), len(jobs), strings.Join(how, ", "))
		}
	}
}

// overlaps: without hedging, a job's attempts follow one another at the
// upstream; one starts only after the previous one ended.
func (c *checker) overlaps() {
	for id, as := range c.byJob {
		sorted := slices.Clone(as)
		sort.Slice(sorted, func(a, b int) bool { return sorted[a].Start.Before(sorted[b].Start) })
		var last *arrival
		for _, a := range sorted {
			if last != nil && a.Start.Before(last.End) {
				c.r.violate("job %s: attempt %d (%s) started at the upstream %s before attempt %d (%s) ended",
					id, a.Attempt, a.Behaviour, last.End.Sub(a.Start).Round(time.Microsecond), last.Attempt, last.Behaviour)
			}
			if last == nil || a.End.After(last.End) {
				last = a
			}
		}
	}
}

// winners: a completed job's result is its winning attempt's answer, as
// the upstream wrote it; only an answer cut short goes unstored.
func (c *checker) winners() {
	for _, j := range c.sortedJobs() {
		if j.State != "completed" || j.CompletedBy == nil || j.Response == nil {
			continue
		}
		var at *adminAttempt
		for i := range j.Attempts {
			if j.Attempts[i].ID == *j.CompletedBy {
				at = &j.Attempts[i]
			}
		}
		if at == nil {
			c.r.violate("job %s is completed by %s, which is none of its attempts", j.ID, *j.CompletedBy)
			continue
		}
		as := c.byAttempt[attemptKey(j.ID, at.Number)]
		if len(as) != 1 {
			continue // reported already
		}
		w := as[0]
		c.winner[j.ID] = w
		resp := j.Response
		if resp.Status != w.Status {
			c.r.violate("job %s: stored status %d, but its winning attempt %d was answered %d", j.ID, resp.Status, at.Number, w.Status)
		}
		switch {
		case !resp.Stored:
			c.r.Unstored++
			if w.Behaviour != streamCut {
				c.r.violate("job %s: completed by attempt %d, whose answer (%s) is not stored: only a stream may win before it ends",
					j.ID, at.Number, w.Behaviour)
			}
		case !w.Answered:
			c.r.violate("job %s: an answer is stored, but the upstream never finished attempt %d's (%s)", j.ID, at.Number, w.Behaviour)
		case resp.Size != int64(w.Len):
			c.r.violate("job %s: stored size %d, but attempt %d's answer was %d bytes", j.ID, resp.Size, at.Number, w.Len)
		}
	}
}

// exchanges: what each client got was for its own owner and key, named its
// job, and was that job's one result.
func (c *checker) exchanges() {
	r := c.r
	for i := range c.ev.Exchanges {
		e := &c.ev.Exchanges[i]
		if e.Err != "" {
			continue
		}
		if e.Up != nil && (e.Up.Owner != e.ID.Owner || e.Up.Key != e.ID.Key) {
			r.CrossAnswers++
			r.violate("%s got the answer meant for %s/%s (job %s)", e.ID, e.Up.Owner, e.Up.Key, e.Up.Job)
		}
		if e.Up == nil && e.Problem == "" {
			r.violate("%s got %d (%d bytes), neither the upstream's answer nor a problem", e.ID, e.Status, e.Len)
		}
		if e.Status == http.StatusUnprocessableEntity {
			r.violate("%s got 422 (%s) for the same body", e.ID, e.Problem)
		}
		if e.JobID == "" {
			if e.Problem != "ledger-unavailable" {
				r.violate("%s got %d (%s) without Idempotency-Job-Id", e.ID, e.Status, e.Problem)
			}
			continue
		}
		j := c.jobOf[e.ID]
		switch {
		case j == nil:
			r.violate("%s was answered for job %s, but the ledger has no job for it", e.ID, e.JobID)
			continue
		case j.ID != e.JobID:
			r.violate("%s was answered for job %s, but its job is %s", e.ID, e.JobID, j.ID)
			continue
		case e.ProblemJob != "" && e.ProblemJob != e.JobID:
			r.violate("%s: problem names job %s, header %s", e.ID, e.ProblemJob, e.JobID)
		case e.Up != nil && e.Up.Job != e.JobID:
			r.violate("%s: answer of job %s under Idempotency-Job-Id %s", e.ID, e.Up.Job, e.JobID)
		}
		if (e.Problem == "in-flight" || e.Problem == "attempt-failed") && !e.RetryAfter {
			r.violate("%s: %d %s without Retry-After", e.ID, e.Status, e.Problem)
		}
		if e.Up == nil {
			if e.Replayed {
				r.WronglyReplayed++
				r.violate("%s: a replay (%d %s) of an answer the upstream never wrote", e.ID, e.Status, e.Problem)
			}
			continue
		}
		if e.Status == http.StatusServiceUnavailable {
			if e.Replayed {
				r.WronglyReplayed++
			}
			if e.Up.Executed || e.Replayed {
				r.violate("%s: a 503 that was a result (executed %v, replayed %v)", e.ID, e.Up.Executed, e.Replayed)
			}
			continue // a refusal passed through: no result
		}
		c.result(e, j)
	}
	for id, seqs := range c.results {
		if len(seqs) > 1 {
			r.violate("job %s: clients got %d different results", id, len(seqs))
		}
	}
}

// result checks one result a client got: it is the job's stored answer,
// or, when the ledger could not record it, a first-hand answer of a job
// left unknown.
func (c *checker) result(e *exchange, j *adminJob) {
	r := c.r
	r.ClientResults++
	a := c.bySeq[e.Up.Seq]
	if a == nil || a.JobID != j.ID || !a.Answered || a.Sum != e.Sum || a.Status != e.Status {
		r.violate("%s got %d with body %d bytes (attempt %d), not what the upstream answered", e.ID, e.Status, e.Len, e.Up.Attempt)
		return
	}
	if c.results[j.ID] == nil {
		c.results[j.ID] = map[uint64]bool{}
	}
	c.results[j.ID][a.Seq] = true
	// Idempotent-Replayed marks exactly the answers this request's own
	// attempt did not produce.
	if own := a.Request == e.Request; own == e.Replayed {
		if e.Replayed {
			r.WronglyReplayed++
		} else {
			r.WronglyUnmarked++
		}
		r.violate("%s: request %d got attempt %d's answer (started by request %d) with Idempotent-Replayed %v %s",
			e.ID, e.Request, a.Attempt, a.Request, e.Replayed, c.describe(j.ID))
	}
	w := c.winner[j.ID]
	switch {
	case j.State == "completed" && w != nil:
		if w.Seq != a.Seq {
			r.violate("%s got attempt %d's answer, but job %s's result is attempt %d's", e.ID, a.Attempt, j.ID, w.Attempt)
		}
	case j.State == "completed":
		// The winner's arrival is missing: reported by the job checks.
	case e.Replayed:
		r.violate("%s got a replay of attempt %d, but job %s is %s", e.ID, a.Attempt, j.ID, j.State)
	case j.State == "unknown":
		r.NotRecorded++
	default:
		r.violate("%s got attempt %d's answer first-hand, but job %s is %s", e.ID, a.Attempt, j.ID, j.State)
	}
}

// replays: once the run is over, a retry gets the stored answer, or 409
// for a job unknown for good; it never reaches the upstream.
func (c *checker) replays() {
	r := c.r
	for id, e := range c.ev.Replays {
		j := c.jobOf[id]
		if j == nil {
			continue
		}
		if e.Err != "" {
			r.violate("replay of %s (job %s): %s", id, j.ID, e.Err)
			continue
		}
		if e.JobID != j.ID {
			r.violate("replay of %s: job %q, want %s", id, e.JobID, j.ID)
		}
		switch {
		case j.State == "completed" && j.Response != nil && j.Response.Stored:
			w := c.winner[j.ID]
			if w == nil {
				continue // reported by the job checks
			}
			if !e.Replayed {
				r.WronglyUnmarked++
			}
			if !e.Replayed || e.Status != w.Status || e.Sum != w.Sum {
				r.violate("replay of %s (job %s): %d replayed=%v, %d bytes; stored %d, %d bytes",
					id, j.ID, e.Status, e.Replayed, e.Len, w.Status, w.Len)
			}
		case e.Replayed:
			r.WronglyReplayed++
			r.violate("replay of %s (job %s, %s): %d %s marked Idempotent-Replayed", id, j.ID, j.State, e.Status, e.Problem)
		case j.State == "completed":
			if e.Status != http.StatusConflict || e.Problem != "response-not-stored" {
				r.violate("replay of %s (job %s, answer not stored): %d %s", id, j.ID, e.Status, e.Problem)
			}
		case j.State == "unknown":
			if e.Status != http.StatusConflict || e.Problem != "outcome-unknown" || e.RetryAfter {
				r.violate("replay of %s (job %s, unknown): %d %s, Retry-After %v", id, j.ID, e.Status, e.Problem, e.RetryAfter)
			}
		}
	}
	if n := c.ev.ArrivalsAfter - len(c.ev.Arrivals); n != 0 {
		r.violate("the replays of finished jobs reached the upstream %d times", n)
	}
}
