package sim

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/proxy"
)

// The shape of every schedule: what its clients, gateways and providers
// are configured with. The durations are virtual.
const (
	gateways        = 3
	intents         = 6
	maxTries        = 5 // requests one client sends for its intent at most
	attemptTimeout  = time.Second
	attemptDeadline = 5 * time.Second
	reconcileEvery  = 15 * time.Second
	lateRetry       = 45 * time.Second // a client's last try, now and then: after lookups settled its job
	// settleTime is how long the world runs after its clients are done and
	// its links healed: past every lease and every never-sent queue's pause.
	settleTime = 10 * time.Minute
)

// pace is how a schedule's time passes. Virtual time runs in a synctest
// bubble: a schedule of minutes takes milliseconds, and nothing is ever
// late by chance. A store on a server cannot join a bubble (its clock is
// the server's, its replies come over sockets), so its schedules run in
// real time, compressed: every duration of the schedule divided by
// compress, while the gateway's own constants (its ledger-call window, its
// never-sent queue's pauses) keep theirs.
type pace struct {
	compress time.Duration // the schedule's durations are divided by it
	// transit is how long after its sending an attempt may reach its
	// provider: zero in virtual time; in real time, what a loaded machine's
	// scheduler may take between the gateway's last look at the lease and
	// the provider's first (the lease check allows it). Real time checks
	// the lease coarsely, so as never to fail by chance; virtual time
	// checks it exactly.
	transit time.Duration
	// notice is how long a purge's notice may take to reach the other
	// instances' replay memories (docs/operations.md: the channel's
	// delay): zero in virtual time, where the store is one; on a server,
	// what a loaded machine may take to deliver a PUBLISH or a NOTIFY.
	notice time.Duration
}

var (
	virtual    = pace{compress: 1}
	compressed = pace{compress: 10, transit: 500 * time.Millisecond, notice: 100 * time.Millisecond}
)

// world is one schedule: the shared store, the gateways and their links,
// the routes and their providers, and what everyone saw, for the checker.
type world struct {
	// reopening is held by a kill -9 while it closes the store and opens
	// it again, and by the world's own reads (a provider's, the
	// operator's) while they use it: they never read a store being closed
	// under them, as no operator or provider could.
	reopening sync.RWMutex

	seed   int64
	pace   pace
	start  time.Time
	offset time.Duration // the store's clock minus the gateways' (a store on a server keeps its own)
	routes []*route
	// another opens a new client of the store (store.open); perGateway:
	// each gateway has its own, as instances on a server do.
	another    func() (ledger.Ledger, error)
	perGateway bool
	mutate     func(ledger.Ledger) ledger.Ledger // how the gateways see the store (a mutant), or nil

	mu        sync.Mutex
	store     ledger.Ledger
	gateways  []*gateway // the live ones
	healed    bool
	trace     []string
	effects   map[string][]effect // intent: the attempts that acted
	received  map[string]bool     // "job/number": a provider received the attempt
	sentBy    map[string]string   // "job/number": the client request that carried it
	gave      map[string][][]byte // client request: the answers providers gave its attempts
	answers   []answer            // every client's answer
	noted     []string            // violations seen while the world ran (lease:, world:)
	jobIntent map[string]string   // job id: intent
	reserved  map[string]string   // jobs whose reservation the store acknowledged: their owner's hash
	sentFrom  map[string]string   // "job/number": the gateway that started the attempt
	acked     map[string]acked    // job: the answer whose completion the store acknowledged as the winner's
	final     []*ledger.Job       // every job, as the world ended
	gone      map[string]bool     // jobs a purge removed
	cancelled map[string]bool     // jobs an operator cancelled: what they decided stands
	purged    string              // the owner an operator purged (or is purging), if any
	purgedAt  time.Time           // when that purge returned (zero while it runs)
	holds     int                 // attempts and never-sent queues running in the gateways
}

// route is one handler on the shared store. Every route names its
// providers primary and fallback: the names are the handler's own, and
// two routes' providers of one name are different upstreams.
type route struct {
	name              string // its path and its scope
	hedged            bool   // it hedges: its providers have no side effects
	implicit          bool   // a request without a key is keyed by its fingerprint
	lookups           bool   // its providers answer lookups, which its reconcilers send
	primary, fallback *provider
}

// routeOf returns the route of intent ("route/owner/key").
func (w *world) routeOf(intent string) *route {
	name, _, _ := strings.Cut(intent, "/")
	for _, r := range w.routes {
		if r.name == name {
			return r
		}
	}
	return nil
}

// acked is a completion the store acknowledged as the winner's.
type acked struct {
	resp ledger.Response
	at   time.Time
}

// effect is one attempt that acted at a provider.
type effect struct {
	job   string
	where string // "job/number at route/provider"
}

// gateway is one instance: a middleware per route over its link, and the
// reconcilers of the routes whose providers answer lookups.
type gateway struct {
	name string
	link *link
	own  ledger.Ledger       // its own client of the store, if it has one
	mws  []*proxy.Middleware // by route
	stop context.CancelFunc  // ends its reconcilers
	done sync.WaitGroup
}

// dur returns how long d of the schedule lasts at the world's pace.
func (w *world) dur(d time.Duration) time.Duration { return d / w.pace.compress }

// hold counts what runs in a gateway, detached from its clients (an
// attempt, a never-sent queue): the world has settled when nothing does.
func (w *world) hold() (release func()) {
	w.mu.Lock()
	w.holds++
	w.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			w.holds--
			w.mu.Unlock()
		})
	}
}

// answer is what one client request got.
type answer struct {
	intent, request string
	sent            time.Time // when the client sent the request
	status          int
	job             string
	replayed        bool
	body            []byte
}

// draw returns a number fixed by the seed and parts: the same schedule
// draws the same faults and behaviours, in any process, whatever order
// its goroutines run in.
func (w *world) draw(parts ...any) uint64 {
	h := fnv.New64a()
	fmt.Fprint(h, w.seed)
	for _, p := range parts {
		fmt.Fprint(h, "\x00", p)
	}
	// FNV's low bits are weak on short inputs: mix them (splitmix64).
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func (w *world) logf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at := time.Since(w.start) * w.pace.compress // in the schedule's time, at any pace
	w.trace = append(w.trace, fmt.Sprintf("%8.3fs ", at.Seconds())+fmt.Sprintf(format, args...))
}

// --- the links --------------------------------------------------------------

var (
	errRefused   = errors.New("link: connection refused")
	errReplyLost = errors.New("link: reply lost")
	errDown      = errors.New("link: down")
	errDead      = errors.New("link: the gateway's process was killed")
)

// link is one gateway's connection to the shared store: per call it may
// refuse before the call runs, lose the reply after it ran, delay the
// reply, or go down for a while.
type link struct {
	ledger.Ledger
	w    *world
	name string

	mu    sync.Mutex
	calls map[string]int
	down  time.Time // the link is down until then
	dead  bool      // its gateway was killed: nothing it sends reaches anything
}

// kill ends the link's gateway as a kill -9 of its process does.
func (l *link) kill() {
	l.mu.Lock()
	l.dead = true
	l.mu.Unlock()
}

// started notes that the link's gateway started attempt a (if any): its
// never-sent record is this gateway's to make.
func (l *link) started(a *ledger.Attempt) {
	if a == nil || a.JobID == "" {
		return
	}
	l.w.mu.Lock()
	l.w.sentFrom[a.JobID+"/"+strconv.Itoa(a.Number)] = l.name
	l.w.mu.Unlock()
}

func (l *link) isDead() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dead
}

// do runs call across the link.
func linkDo[T any](l *link, ctx context.Context, op string, call func(context.Context) (T, error)) (T, error) {
	var zero T
	l.mu.Lock()
	n := l.calls[op]
	l.calls[op]++
	down, dead := time.Now().Before(l.down), l.dead
	l.mu.Unlock()
	if dead {
		return zero, errDead
	}
	l.w.mu.Lock()
	healed := l.w.healed
	l.w.mu.Unlock()
	if healed {
		return call(ctx)
	}
	if down {
		return zero, errDown
	}
	x := l.w.draw("link", l.name, op, n) % 1000
	switch {
	case x < 30:
		l.w.logf("%s %s #%d: refused", l.name, op, n)
		return zero, errRefused
	case x < 60:
		_, err := call(ctx)
		l.w.logf("%s %s #%d: ran (%v), reply lost", l.name, op, n, err)
		return zero, errReplyLost
	case x < 80:
		d := time.Duration(1+l.w.draw("delay", l.name, op, n)%8000) * time.Millisecond
		v, err := call(ctx)
		l.w.logf("%s %s #%d: ran (%v), reply delayed %v", l.name, op, n, err, d)
		t := time.NewTimer(l.w.dur(d))
		defer t.Stop()
		select {
		case <-t.C:
			return v, err
		case <-ctx.Done():
			return zero, ctx.Err()
		}
	case x < 85:
		d := time.Duration(1+l.w.draw("down", l.name, op, n)%30) * time.Second
		l.mu.Lock()
		l.down = time.Now().Add(l.w.dur(d))
		l.mu.Unlock()
		l.w.logf("%s %s #%d: link down for %v", l.name, op, n, d)
		return zero, errDown
	}
	return call(ctx)
}

func (l *link) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	return linkDo(l, ctx, "reserve", func(ctx context.Context) (ledger.Reservation, error) {
		r, err := l.Ledger.Reserve(ctx, p)
		if err == nil {
			l.w.mu.Lock()
			l.w.reserved[r.Job.ID] = string(p.OwnerHash)
			l.w.mu.Unlock()
			if r.Outcome == ledger.Created || r.Outcome == ledger.Reopened {
				l.started(r.Attempt)
			}
		}
		return r, err
	})
}

func (l *link) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return linkDo(l, ctx, "hedge", func(ctx context.Context) (ledger.Attempt, error) {
		a, err := l.Ledger.Hedge(ctx, ref, next)
		l.started(&a)
		return a, err
	})
}

func (l *link) Resend(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return linkDo(l, ctx, "resend", func(ctx context.Context) (ledger.Attempt, error) {
		a, err := l.Ledger.Resend(ctx, ref, next)
		l.started(&a)
		return a, err
	})
}

func (l *link) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	return linkDo(l, ctx, "complete", func(ctx context.Context) (ledger.Completion, error) {
		c, err := l.Ledger.Complete(ctx, ref, resp)
		if err == nil && c.Won {
			l.w.mu.Lock()
			l.w.acked[ref.JobID] = acked{resp: resp, at: time.Now()}
			l.w.mu.Unlock()
		}
		return c, err
	})
}

func (l *link) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	_, err := linkDo(l, ctx, "save_body", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.Ledger.SaveBody(ctx, ref, body, size, stored)
	})
	return err
}

func (l *link) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	return linkDo(l, ctx, "fail", func(ctx context.Context) (*ledger.Attempt, error) {
		a, err := l.Ledger.Fail(ctx, ref, reason, next)
		l.started(a)
		return a, err
	})
}

func (l *link) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	_, err := linkDo(l, ctx, "unsent", func(ctx context.Context) (struct{}, error) { return struct{}{}, l.Ledger.Unsent(ctx, ref) })
	return err
}

func (l *link) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	_, err := linkDo(l, ctx, "mark_unknown", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, l.Ledger.MarkUnknown(ctx, ref, reason)
	})
	return err
}

func (l *link) Job(ctx context.Context, id string) (*ledger.Job, error) {
	return linkDo(l, ctx, "job", func(ctx context.Context) (*ledger.Job, error) { return l.Ledger.Job(ctx, id) })
}

func (l *link) Find(ctx context.Context, owner, key []byte) (*ledger.Job, error) {
	return linkDo(l, ctx, "find", func(ctx context.Context) (*ledger.Job, error) { return l.Ledger.Find(ctx, owner, key) })
}

func (l *link) Wait(ctx context.Context, id string) (*ledger.Job, error) {
	return linkDo(l, ctx, "wait", func(ctx context.Context) (*ledger.Job, error) { return l.Ledger.Wait(ctx, id) })
}

func (l *link) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	return linkDo(l, ctx, "jobs", func(ctx context.Context) (ledger.JobPage, error) { return l.Ledger.Jobs(ctx, q) })
}

func (l *link) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	return linkDo(l, ctx, "claim_lookup", func(ctx context.Context) (*ledger.Job, error) {
		return l.Ledger.ClaimLookup(ctx, ref, holder, lease)
	})
}

func (l *link) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	return linkDo(l, ctx, "settle_lookup", func(ctx context.Context) (*ledger.Job, error) {
		return l.Ledger.SettleLookup(ctx, ref, holder, r)
	})
}

// Close leaves the store to the world.
func (l *link) Close() error { return nil }

// --- the providers ----------------------------------------------------------

// provider is one upstream of one route, shared by every gateway. What it
// does with attempt n of an intent is drawn from the seed.
type provider struct {
	w     *world
	route string
	name  string
	// dedup: the provider honours the job id the gateway sends (in
	// Idempotency-Key) as its own key: it acts once per job, answers a
	// job whose work runs 409, and a job done with the answer it stored.
	dedup   bool
	mu      sync.Mutex
	done    map[string][]byte // by job, when it deduplicates
	running map[string]bool
	acted   map[string][]byte // "job/number": the answer of an attempt it acted on
	looked  map[string]int    // "job/number": lookups answered
}

func newProvider(w *world, route, name string) *provider {
	return &provider{w: w, route: route, name: name, done: map[string][]byte{}, running: map[string]bool{},
		acted: map[string][]byte{}, looked: map[string]int{}}
}

// sent is the body a provider answers with: who asked, for what, which
// request carried it.
type sent struct {
	Intent   string `json:"intent"`
	Owner    string `json:"owner"`
	Request  string `json:"request"`
	Job      string `json:"job"`
	Attempt  int    `json:"attempt"`
	Provider string `json:"provider"`
}

// answer sends body with 201 to the attempt r carries, and notes it as an
// answer the attempt's client request may relay as its own.
func (p *provider) answer(rw http.ResponseWriter, r *http.Request, body []byte) error {
	req := r.Header.Get("X-Sim-Request")
	p.w.mu.Lock()
	p.w.gave[req] = append(p.w.gave[req], body)
	p.w.mu.Unlock()
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusCreated)
	_, err := rw.Write(body)
	return err
}

func (p *provider) ServeHTTP(rw http.ResponseWriter, r *http.Request) error {
	w := p.w
	job := r.Header.Get(proxy.HeaderJobID)
	n, _ := strconv.Atoi(r.Header.Get(proxy.HeaderAttempt))
	intent := r.Header.Get("X-Sim-Intent")
	attempt := job + "/" + strconv.Itoa(n)
	at := p.route + "/" + p.name
	if w.gateway(r.Header.Get("X-Sim-Gateway")) == nil { // killed: what it sends reaches no one
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("the gateway's process was killed")}
	}
	w.mu.Lock()
	w.jobIntent[job] = intent
	w.mu.Unlock()
	x := w.draw("provider", at, intent, n) % 100
	if x >= 95 { // the dial fails: the request never reaches the provider
		w.logf("%s %s: connection refused", at, attempt)
		return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
	}
	w.mu.Lock()
	w.received[attempt] = true
	w.sentBy[attempt] = r.Header.Get("X-Sim-Request")
	w.mu.Unlock()
	deadline := p.checkLease(job, n)
	if !p.started(deadline) {
		w.logf("%s %s: not started by its deadline: dropped", at, attempt)
		return errors.New("read tcp: connection reset by peer")
	}
	if p.dedup {
		p.mu.Lock()
		body, done := p.done[job]
		running := p.running[job]
		if !done && !running {
			p.running[job] = true
		}
		p.mu.Unlock()
		switch {
		case done:
			w.logf("%s %s: already done, answers as it did", at, attempt)
			return p.answer(rw, r, body)
		case running:
			w.logf("%s %s: still running (409)", at, attempt)
			rw.WriteHeader(http.StatusConflict)
			return nil
		}
		defer func() {
			p.mu.Lock()
			delete(p.running, job)
			p.mu.Unlock()
		}()
	}

	body, _ := json.Marshal(sent{Intent: intent, Owner: r.Header.Get("Authorization"), Request: r.Header.Get("X-Sim-Request"),
		Job: job, Attempt: n, Provider: at})
	act := func() {
		w.mu.Lock()
		w.effects[intent] = append(w.effects[intent], effect{job: job, where: attempt + " at " + at})
		w.mu.Unlock()
		p.mu.Lock()
		p.acted[attempt] = body
		if p.dedup {
			p.done[job] = body
		}
		p.mu.Unlock()
	}
	wait := func(d time.Duration) bool {
		t := time.NewTimer(w.dur(d))
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	io.Copy(io.Discard, r.Body)
	switch {
	case x >= 40 && x < 50: // acts, streams its answer in three parts
		act()
		w.logf("%s %s: acts, streams its answer", at, attempt)
		p.w.mu.Lock()
		p.w.gave[r.Header.Get("X-Sim-Request")] = append(p.w.gave[r.Header.Get("X-Sim-Request")], body)
		p.w.mu.Unlock()
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusCreated)
		for i, third := 0, (len(body)+2)/3; i < len(body); i += third {
			if i > 0 && !wait(400*time.Millisecond) {
				w.logf("%s %s: stream cut", at, attempt)
				return r.Context().Err()
			}
			if _, err := rw.Write(body[i:min(i+third, len(body))]); err != nil {
				return err
			}
			rw.(http.Flusher).Flush()
		}
		return nil
	case x < 50: // acts, answers after a while
		d := []time.Duration{0, 100 * time.Millisecond, 800 * time.Millisecond, 1500 * time.Millisecond}[x%4]
		act()
		w.logf("%s %s: acts, answers in %v", at, attempt, d)
		if !wait(d) {
			return r.Context().Err()
		}
		return p.answer(rw, r, body)
	case x < 60: // refuses before acting
		w.logf("%s %s: refuses (503)", at, attempt)
		rw.WriteHeader(http.StatusServiceUnavailable)
		return nil
	case x < 70: // never answers, never acts
		w.logf("%s %s: hangs", at, attempt)
		<-r.Context().Done()
		return r.Context().Err()
	case x < 80: // acts, then the connection breaks
		act()
		w.logf("%s %s: acts, connection breaks", at, attempt)
		return errors.New("read tcp: connection reset by peer")
	case x < 90: // acts, answers past the deadline
		act()
		w.logf("%s %s: acts, answers past the deadline", at, attempt)
		if !wait(2 * attemptDeadline) {
			return r.Context().Err()
		}
		return p.answer(rw, r, body)
	default: // the request was written, then the TLS layer fails: acted or not, the gateway cannot know
		if trace := httptrace.ContextClientTrace(r.Context()); trace != nil && trace.WroteHeaders != nil {
			trace.WroteHeaders()
		}
		if x%2 == 0 {
			act()
		}
		w.logf("%s %s: request written, then a TLS alert (acted: %v)", at, attempt, x%2 == 0)
		return &net.OpError{Op: "remote error", Net: "tcp", Err: tls.AlertError(20)} // bad_record_mac
	}
}

// lookup answers the reconciler's lookup of attempt a as the provider
// knows it: the answer it gave if it acted (per job, if it deduplicates),
// 404 if it never did; or, drawn from the seed, slowly (past the
// lookup's bound) or with a 500 that says nothing.
func (p *provider) lookup(ctx context.Context, a *ledger.Attempt) (int, http.Header, []byte, error) {
	ref := a.JobID + "/" + strconv.Itoa(a.Number)
	p.w.mu.Lock()
	intent := p.w.jobIntent[a.JobID]
	p.w.mu.Unlock()
	p.mu.Lock()
	try := p.looked[ref]
	p.looked[ref]++
	body, acted := p.acted[ref]
	if p.dedup {
		body, acted = p.done[a.JobID]
	}
	p.mu.Unlock()
	at := p.route + "/" + p.name
	switch x := p.w.draw("lookup", at, intent, a.Number, try) % 10; {
	case x < 2:
		p.w.logf("%s lookup of %s: slow", at, ref)
		<-ctx.Done()
		return 0, nil, nil, ctx.Err()
	case x < 4:
		p.w.logf("%s lookup of %s: 500", at, ref)
		return http.StatusInternalServerError, nil, nil, nil
	case acted:
		p.w.logf("%s lookup of %s: found", at, ref)
		return http.StatusCreated, http.Header{"Content-Type": {"application/json"}}, body, nil
	}
	p.w.logf("%s lookup of %s: absent (404)", at, ref)
	return http.StatusNotFound, nil, nil, nil
}

// checkLease records an attempt that arrived after its lease ran out by
// the store's clock (give or take the pace's transit), and returns the
// attempt's deadline (zero if it cannot be read).
func (p *provider) checkLease(job string, n int) (deadline time.Time) {
	arrived := time.Now().Add(p.w.offset)
	p.w.reopening.RLock()
	j, err := p.w.current().Job(context.Background(), job)
	p.w.reopening.RUnlock()
	p.w.mu.Lock()
	purged := p.w.purged != ""
	p.w.mu.Unlock()
	if purged && errors.Is(err, ledger.ErrNotFound) {
		return time.Time{} // a purge removed the job of a re-send on its way: an operator decided
	}
	if err != nil {
		p.w.violation("world: attempt %s/%d arrived at %s/%s but its job cannot be read: %v", job, n, p.route, p.name, err)
		return time.Time{}
	}
	for _, a := range j.Attempts {
		if a.Number != n {
			continue
		}
		if late := arrived.Sub(a.Deadline); late >= p.w.pace.transit {
			p.w.violation("lease: attempt %s/%d arrived at %s/%s %v after its lease ran out", job, n, p.route, p.name, late)
		}
		return a.Deadline
	}
	return time.Time{}
}

// started reports whether the provider may still start the work of an
// attempt whose deadline (the store's clock) is deadline: as the contract
// asks of a provider, it drops what it has not started by then (in real
// time, a provider under load may reach that point late).
func (p *provider) started(deadline time.Time) bool {
	return deadline.IsZero() || time.Now().Add(p.w.offset).Before(deadline)
}

// connectError is the gateway's rule of a request that never left, as
// caddymodule's: a dial error or a TLS failure (whether it left is
// decided by what was written first).
func connectError(err error) bool {
	var (
		op *net.OpError
		ae tls.AlertError
	)
	return errors.As(err, &ae) || (errors.As(err, &op) && op.Op == "dial")
}

func (w *world) violation(format string, args ...any) {
	w.logf("VIOLATION: "+format, args...)
	w.mu.Lock()
	w.noted = append(w.noted, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// current returns the store as it is now (a kill -9 reopens it).
func (w *world) current() ledger.Ledger {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.store
}

// gateway returns the live gateway of name, nil if it was killed.
func (w *world) gateway(name string) *gateway {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.gateways {
		if g.name == name {
			return g
		}
	}
	return nil
}

// --- the operator -----------------------------------------------------------

// operator looks at the jobs now and then while the clients run, and
// cancels an unknown one, as the admin API's resolve does; once in a
// while it purges an owner, as the admin API's purge does.
func (w *world) operator(done <-chan struct{}) {
	purge := w.draw("purge")%3 == 0
	for round := 0; ; round++ {
		t := time.NewTimer(w.dur(time.Duration(500+w.draw("operator", round)%4000) * time.Millisecond))
		select {
		case <-done:
			t.Stop()
			return
		case <-t.C:
		}
		if w.operate(purge, round) {
			purge = false
		}
	}
}

// operate is one round of the operator: a purge, if one is due, else a
// look at the unknown jobs and now and then a cancel. It holds off a kill
// -9's reopening of the store while it uses it, and reports whether it
// purged.
func (w *world) operate(purge bool, round int) (purged bool) {
	w.reopening.RLock()
	defer w.reopening.RUnlock()
	store := w.current()
	if purge && w.draw("purge", round)%4 == 0 {
		owner := owners[w.draw("purged")%2]
		// Named before the call: the purge removes jobs before it
		// returns, and an attempt on its way may arrive in between.
		w.mu.Lock()
		w.purged = owner
		w.mu.Unlock()
		st, err := store.(ledger.Purger).Purge(context.Background(), proxy.NewHasher(nil).Owner(owner))
		w.mu.Lock()
		w.purgedAt = time.Now() // even after an error: it may have removed some
		w.mu.Unlock()
		w.logf("operator purges %s: %+v %v", owner, st, err)
		return true
	}
	page, err := store.Jobs(context.Background(), ledger.JobQuery{State: ledger.JobUnknown})
	if err != nil || len(page.Jobs) == 0 || w.draw("cancel", round)%3 != 0 {
		return false
	}
	j := page.Jobs[w.draw("which", round)%uint64(len(page.Jobs))]
	if _, err := store.Resolve(context.Background(), j.ID, ledger.Resolution{Cancel: true}); err == nil {
		w.mu.Lock()
		w.cancelled[j.ID] = true
		w.mu.Unlock()
		w.logf("operator cancels job %s", j.ID)
	}
	return false
}

// --- the clients ------------------------------------------------------------

var owners = []string{"alice", "bob"}

// client sends the requests of one intent until one is answered with the
// provider's answer, or it runs out of tries.
func (w *world) client(i int, wg *sync.WaitGroup) {
	defer wg.Done()
	rt := int(w.draw("route", i) % uint64(len(w.routes)))
	route := w.routes[rt]
	owner := owners[w.draw("owner", i)%2]
	k := w.draw("key", i) % 4
	key := fmt.Sprintf("key-%d", k) // the same key for two owners, now and then
	// Most bodies are the key's, the same for both owners (so a mix-up of
	// owners would show); the others are the client's own, and a second
	// client of one owner and key is then a mismatch, not a second charge.
	body := fmt.Sprintf(`{"amount":%d}`, 100+k)
	if w.draw("body", i)%3 == 0 {
		body = fmt.Sprintf(`{"amount":%d}`, 1000+i)
	}
	if route.implicit && w.draw("implicit", i)%2 == 0 {
		key = "" // keyed by its fingerprint: one intent per owner and body
	}
	intent := route.name + "/" + owner + "/" + key
	if key == "" {
		intent += "~" + body
	}
	start := time.Duration(w.draw("start", i)%2000) * time.Millisecond
	time.Sleep(w.dur(start))
	var dup sync.WaitGroup
	for try := range maxTries {
		send := func(req string) answer {
			gws := w.live()
			gw := gws[w.draw("gateway", i, req)%uint64(len(gws))]
			r := httptest.NewRequest(http.MethodPost, "/"+route.name, strings.NewReader(body))
			if key != "" {
				r.Header.Set(proxy.DefaultKeyHeader, key)
			}
			r.Header.Set("Authorization", owner)
			r.Header.Set("X-Sim-Intent", intent)
			r.Header.Set("X-Sim-Request", req)
			r.Header.Set("X-Sim-Gateway", gw.name)
			if x := w.draw("prefer", req) % 8; x < 2 { // Prefer: wait=0 or wait=3 (in whole seconds at any pace)
				wait := w.dur(time.Duration(3*x) * time.Second)
				r.Header.Set("Prefer", fmt.Sprintf("wait=%d", int(math.Ceil(wait.Seconds()))))
			}
			a := answer{intent: intent, request: req, sent: time.Now()}
			rec := httptest.NewRecorder()
			if aborted := w.serve(gw.mws[rt], rec, r); aborted {
				w.logf("client %s %s via %s: connection aborted after %d %q", intent, req, gw.name, rec.Code, rec.Body.Bytes())
				return a
			}
			if gw.link.isDead() { // the connection broke with the process: no answer
				w.logf("client %s %s via %s: the gateway was killed", intent, req, gw.name)
				return a
			}
			a.status, a.job, a.body = rec.Code, rec.Header().Get(proxy.HeaderJobID), rec.Body.Bytes()
			a.replayed = rec.Header().Get(proxy.HeaderReplayed) == "true"
			w.logf("client %s %s via %s: %d replayed=%v %s", intent, req, gw.name, a.status, a.replayed, strings.TrimSpace(string(a.body)))
			w.mu.Lock()
			w.answers = append(w.answers, a)
			w.mu.Unlock()
			return a
		}
		req := fmt.Sprintf("r%d.%d", i, try)
		if w.draw("duplicate", i, try)%5 == 0 { // a duplicate in flight
			dup.Add(1)
			go func() { defer dup.Done(); send(req + "d") }()
		}
		a := send(req)
		if a.status == http.StatusCreated && w.draw("again", i, try)%2 == 0 {
			break
		}
		if a.status == http.StatusUnprocessableEntity { // a mismatch: another body has the key
			break
		}
		pause := time.Duration(100+w.draw("jitter", i, try)%3000) * time.Millisecond
		if try == maxTries-2 && w.draw("late", i)%3 == 0 {
			pause = lateRetry
		}
		time.Sleep(w.dur(pause))
	}
	dup.Wait()
}

// serve runs one client request through mw, and reports whether the
// connection was aborted (an answer cut short after its headers went out).
func (w *world) serve(mw *proxy.Middleware, rec *httptest.ResponseRecorder, r *http.Request) (aborted bool) {
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler {
				panic(v)
			}
			aborted = true
		}
	}()
	if err := mw.ServeHTTP(rec, r, noNext); err != nil {
		w.violation("world: request %s: the middleware returned %v", r.Header.Get("X-Sim-Request"), err)
	}
	return false
}

// live returns the gateways alive now.
func (w *world) live() []*gateway {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gateways
}

// noNext is the next handler: never called, every route has providers.
var noNext = proxy.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
	return errors.New("next called although providers are configured")
})
