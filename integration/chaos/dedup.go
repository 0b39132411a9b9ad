package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The deduplicating route: a second idempotency handler on every instance
// (path /dedup/), whose one provider keeps its own store keyed by the
// Idempotency-Key it receives (the gateway sends the job id there) and
// answers lookups of it. Its faults are the main upstream's (slow answers,
// resets after the work, stalls past the deadline); the gateway may
// re-send and look up, never fail over. Its own log counts side effects
// per intent: the soak's claim is that none has two, that none is lost,
// and that no job is left unknown once the reconcilers ran.

const (
	dedupProvider = "payments"
	dedupPath     = "/dedup/charges"
	lookupPrefix  = "/charges/by-job/"
)

// dedupBehaviour is what the deduplicating provider does with a new key.
type dedupBehaviour int

const (
	dedupFast        dedupBehaviour = iota // does the work, answers at once
	dedupSlow                              // does the work around attempt_timeout, often past it
	dedupRefuse                            // 503 without doing anything
	dedupResetBefore                       // resets before reading: nothing done
	dedupResetAfter                        // does the work, then resets
	dedupStall                             // does the work, answers past attempt_deadline
	numDedupBehaviours
)

var dedupWeights = [numDedupBehaviours]int{dedupFast: 55, dedupSlow: 15, dedupRefuse: 5, dedupResetBefore: 5, dedupResetAfter: 12, dedupStall: 8}

var dedupNames = [numDedupBehaviours]string{
	dedupFast: "answer", dedupSlow: "slow answer", dedupRefuse: "503 refusal",
	dedupResetBefore: "reset before read", dedupResetAfter: "reset after the work", dedupStall: "stall",
}

func pickDedup() dedupBehaviour { return pick[dedupBehaviour](dedupWeights[:]) }

// dedupCharge is the provider's record of one key.
type dedupCharge struct {
	id   identity
	done bool
	body []byte // the charge, once done
}

// dedupUpstream is the deduplicating provider.
type dedupUpstream struct {
	timeout, deadline time.Duration
	srv               *http.Server
	addr              string
	seq               atomic.Uint64
	running           atomic.Int64

	mu         sync.Mutex
	byKey      map[string]*dedupCharge
	executions map[identity][]uint64 // the charges made per intent: the side effects
	calls      map[string]int        // how each POST was answered
	lookups    map[int]int           // lookups by the status they got
	behaviours [numDedupBehaviours]int
}

func newDedupUpstream(timeout, deadline time.Duration) (*dedupUpstream, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	u := &dedupUpstream{
		timeout: timeout, deadline: deadline, addr: l.Addr().String(),
		byKey: map[string]*dedupCharge{}, executions: map[identity][]uint64{}, calls: map[string]int{}, lookups: map[int]int{},
	}
	u.srv = &http.Server{Handler: http.HandlerFunc(u.serve), ReadHeaderTimeout: 5 * time.Second, ErrorLog: discardLog}
	go u.srv.Serve(l)
	return u, nil
}

func (u *dedupUpstream) close() { u.srv.Close() }

func (u *dedupUpstream) serve(w http.ResponseWriter, r *http.Request) {
	u.running.Add(1)
	defer u.running.Add(-1)
	if key, ok := strings.CutPrefix(r.URL.Path, lookupPrefix); ok && r.Method == http.MethodGet {
		u.lookup(w, key)
		return
	}
	key := r.Header.Get("Idempotency-Key")
	b := pickDedup()
	u.mu.Lock()
	u.behaviours[b]++
	c := u.byKey[key]
	switch {
	case key == "":
		u.calls["no key"]++
		u.mu.Unlock()
		w.WriteHeader(http.StatusBadRequest)
		return
	case c != nil && c.done:
		u.calls["replayed by the provider"]++
		body := c.body
		u.mu.Unlock()
		write(w, http.StatusCreated, body)
		return
	case c != nil:
		u.calls["409 in progress"]++
		u.mu.Unlock()
		w.WriteHeader(http.StatusConflict)
		return
	case b == dedupResetBefore:
		u.calls["reset before read"]++
		u.mu.Unlock()
		reset(w)
		return
	case b == dedupRefuse:
		u.calls["503 refusal"]++
		u.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	// The work: one charge for this key, recorded against its intent.
	var id identity
	raw, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	json.Unmarshal(raw, &id)
	c = &dedupCharge{id: id}
	u.byKey[key] = c
	seq := u.seq.Add(1)
	u.executions[id] = append(u.executions[id], seq)
	u.calls[dedupNames[b]]++
	u.mu.Unlock()

	body, _ := json.Marshal(answerBody{Owner: id.Owner, Key: id.Key, Job: key, Provider: dedupProvider, Seq: seq, Executed: true})
	finish := func() {
		u.mu.Lock()
		c.done, c.body = true, body
		u.mu.Unlock()
	}
	ctx := r.Context()
	switch b {
	case dedupFast:
		finish()
		write(w, http.StatusCreated, body)
	case dedupSlow:
		sleep(ctx, randDuration(u.timeout*6/10, u.timeout*5/2))
		finish()
		write(w, http.StatusCreated, body)
	case dedupResetAfter:
		finish()
		reset(w)
	case dedupStall:
		finish()
		sleep(ctx, u.deadline+time.Second)
		panic(http.ErrAbortHandler)
	}
}

// lookup answers whether the provider acted on a key: 200 with the charge,
// 404 when it never saw the key, 503 while the work runs.
func (u *dedupUpstream) lookup(w http.ResponseWriter, key string) {
	u.mu.Lock()
	c := u.byKey[key]
	status := http.StatusNotFound
	var body []byte
	switch {
	case c != nil && c.done:
		status, body = http.StatusOK, c.body
	case c != nil:
		status = http.StatusServiceUnavailable
	}
	u.lookups[status]++
	u.mu.Unlock()
	write(w, status, body)
}

func write(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(body)
}

// idle waits until no request of the provider runs, or until ctx ends.
func (u *dedupUpstream) idle(ctx context.Context) bool {
	for u.running.Load() > 0 {
		if !sleep(ctx, 50*time.Millisecond) {
			return false
		}
	}
	return true
}

// dedupRoute is the route of the deduplicating provider in an instance's
// config: its own handler, on the instance's ledger.
func dedupRoute(c gatewayConfig) string {
	if c.Dedup == "" {
		return ""
	}
	return fmt.Sprintf(`	handle %s {
		idempotency {
			%s
			scope %s
			owner {http.request.header.Authorization}
			owner_secret %s
			attempt_timeout %s
			attempt_deadline %s
			in_flight wait %s
			reconcile_every 500ms
			provider %s {
				deduplicates
				lookup GET %s{idempotency.job_id}
				reverse_proxy %s
			}
		}
	}
`, dedupPath, c.ledgerLines(), dedupProvider, c.OwnerSecret, c.AttemptTimeout, c.AttemptDeadline, c.InFlightWait,
		dedupProvider, lookupPrefix, c.Dedup)
}

// settleDedup waits until no job of the deduplicating route is unknown (the
// reconcilers' lookups settle them), at most limit.
func settleDedup(ctx context.Context, g *gateway, limit time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		var page struct {
			Jobs []adminJob `json:"jobs"`
		}
		path := "/idempotency/jobs?limit=1&state=unknown&provider=" + url.QueryEscape(dedupProvider)
		if err := getJSON(ctx, g, path, &page); err == nil && len(page.Jobs) == 0 {
			return
		}
		if !sleep(ctx, 250*time.Millisecond) {
			return
		}
	}
}

// dedupReport is what the soak saw on the deduplicating route.
type dedupReport struct {
	Jobs       map[string]int // by state
	Executions int
	Duplicates int // intents with more than one side effect
	// DuplicateIDs are those intents; CrossAnswers the answers a client
	// got that were another intent's.
	DuplicateIDs []identity
	CrossAnswers int
	Resends      int // attempts that were re-sends
	ByResend     int // jobs a re-send settled
	ByLookup     int // attempts a lookup settled
	Answers      int // 2xx answers the clients got
	Violations   []string
}

func (r *dedupReport) violate(format string, args ...any) {
	r.Violations = append(r.Violations, "dedup route: "+fmt.Sprintf(format, args...))
}

// checkDedup holds the deduplicating route to its claims: one side effect
// per intent at most, every side effect in a completed (or still unknown)
// job of its intent, and every answer a client got the provider's one
// charge for that client's intent.
func checkDedup(u *dedupUpstream, jobs map[string]*adminJob, ex []exchange, ev *evidence, ids []identity) *dedupReport {
	r := &dedupReport{Jobs: map[string]int{}}
	u.mu.Lock()
	defer u.mu.Unlock()
	byHash := map[string]*adminJob{}
	for _, j := range jobs {
		r.Jobs[j.State]++
		byHash[j.OwnerHash+"/"+j.KeyHash] = j
		for _, a := range j.Attempts {
			if a.Provider != dedupProvider {
				r.violate("job %s: attempt %d went to %s", j.ID, a.Number, a.Provider)
			}
			if a.Resend {
				r.Resends++
			}
			switch deref(a.Reconciled) {
			case "resend":
				r.ByResend++
			case "lookup":
				r.ByLookup++
			}
			if a.State == "starting" {
				r.violate("job %s: attempt %d still starting after every deadline", j.ID, a.Number)
			}
		}
	}
	for _, id := range ids {
		seqs := u.executions[id]
		r.Executions += len(seqs)
		if len(seqs) > 1 {
			r.Duplicates++
			r.DuplicateIDs = append(r.DuplicateIDs, id)
			r.violate("%s was executed %d times by the provider (charges %v)", id, len(seqs), seqs)
		}
		j := byHash[fmt.Sprintf("%x/%x", ev.Hasher.Owner("Bearer "+id.Owner), ev.Hasher.Key(id.Key))]
		switch {
		case len(seqs) == 0:
		case j == nil:
			r.violate("%s was executed by the provider, but its job is lost", id)
		case j.State == "failed":
			r.violate("job %s of %s failed, but the provider executed it", j.ID, id)
		}
	}
	for _, e := range ex {
		if e.Err != "" || e.Status < 200 || e.Status > 299 {
			continue
		}
		r.Answers++
		seqs := u.executions[e.ID]
		switch {
		case e.Up == nil:
			r.violate("%s got %d with a body the provider never wrote", e.ID, e.Status)
		case e.Up.Owner != e.ID.Owner || e.Up.Key != e.ID.Key:
			r.CrossAnswers++
			r.violate("%s got the answer of %s/%s", e.ID, e.Up.Owner, e.Up.Key)
		case len(seqs) == 0 || e.Up.Seq != seqs[0]:
			r.violate("%s got charge %d, but the provider's charges for it are %v", e.ID, e.Up.Seq, seqs)
		}
	}
	return r
}

func printDedup(w io.Writer, r *dedupReport, u *dedupUpstream, cl *clients) {
	u.mu.Lock()
	calls, lookups := countList(u.calls), countList(u.lookups)
	u.mu.Unlock()
	total := 0
	for _, n := range r.Jobs {
		total += n
	}
	row := func(name string, format string, args ...any) {
		fmt.Fprintf(w, "  %-28s %s\n", name, fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(w, "\ndeduplicating route (%s, provider %s)\n", dedupPath, dedupProvider)
	row("client sessions", "%d (%d gave up)", cl.sessions.Load(), cl.gaveUp.Load())
	row("2xx answers to clients", "%d", r.Answers)
	row("jobs", "%d (%s)", total, countList(r.Jobs))
	row("provider calls", "%s", calls)
	row("side effects", "%d (%d intents with more than one)", r.Executions, r.Duplicates)
	row("re-sends", "%d (%d settled their job)", r.Resends, r.ByResend)
	row("lookups", "%s (%d settled their attempt)", lookups, r.ByLookup)
	row("unknown jobs left", "%d (target 0)", r.Jobs["unknown"])
}
