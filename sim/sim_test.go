package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/proxy"
)

var (
	seedFlag      = flag.Int64("sim.seed", 0, "run only the schedule of this seed")
	schedulesFlag = flag.Int("sim.schedules", 0, "schedules per ledger; default $ONEJOB_SIM_SCHEDULES, else 2000")
	traceFlag     = flag.Bool("sim.trace", false, "print the trace of every schedule run")
)

// schedules returns the seeds to run: -sim.seed alone, else 1 to N (the
// same seeds in every run of the test command, so that it passes or fails
// the same way; the long mode draws its own with ONEJOB_SIM_BASE).
func schedules(t *testing.T) []int64 {
	if *seedFlag != 0 {
		return []int64{*seedFlag}
	}
	n := *schedulesFlag
	if n == 0 {
		n = 2000
		if v := os.Getenv("ONEJOB_SIM_SCHEDULES"); v != "" {
			var err error
			if n, err = strconv.Atoi(v); err != nil || n < 1 {
				t.Fatalf("ONEJOB_SIM_SCHEDULES=%q: want a count", v)
			}
		}
	}
	base := int64(0)
	if v := os.Getenv("ONEJOB_SIM_BASE"); v != "" {
		var err error
		if base, err = strconv.ParseInt(v, 10, 64); err != nil {
			t.Fatalf("ONEJOB_SIM_BASE=%q: want a number", v)
		}
	}
	seeds := make([]int64, n, n+len(found))
	for i := range seeds {
		seeds[i] = base + int64(i) + 1
	}
	return append(seeds, found...)
}

// found are seeds past the test command's that broke an invariant once
// (in a long run): each runs in every run, so that what it found stays
// fixed.
var found = []int64{
	5001072, 5005019, // a deduplicating provider's relayed answer (checker)
	5003610, 5084759, // a connect error recorded after its lease ran out
	5085138, 5569348, 5628105, // a hedge's later result won over the first, which the ledger had not taken
	8396769, // a purged job back as failed (a never-sent record's repeat): its earlier replays are not the checker's to hold
}

// store is a ledger the gateways of a schedule share.
type store struct {
	name string
	// open returns a new store for the schedule of seed, on the clock now
	// (a store on a server keeps its server's), and another: a new client
	// of the same store, as another process opens it (for the file
	// ledger, which lives in the gateways' process, only once the first is
	// closed: after a kill -9); nil when the store is the test process's
	// own memory, which outlives the gateways.
	open func(t *testing.T, seed int64, now func() time.Time) (l ledger.Ledger, another func() (ledger.Ledger, error))
}

var stores = []store{
	{"memory", func(_ *testing.T, _ int64, now func() time.Time) (ledger.Ledger, func() (ledger.Ledger, error)) {
		return memory.New(memory.WithClock(now)), nil
	}},
	{"file", func(t *testing.T, _ int64, now func() time.Time) (ledger.Ledger, func() (ledger.Ledger, error)) {
		dir := filepath.Join(memDir(t), "jobs")
		open := func() (ledger.Ledger, error) { return file.Open(dir, file.Options{Now: now}) }
		l, err := open()
		if err != nil {
			t.Fatal(err)
		}
		return l, open
	}},
}

// memDir returns a directory for a file ledger, in memory where the
// system has one (/dev/shm): the ledger's code runs all the same, and its
// flushes cost nothing; a kill -9 loses nothing a flush would have kept.
func memDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "onejob-sim-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// TestExactlyOnce runs every schedule on every store that runs in the
// test's process, each in a synctest bubble, and fails at the first
// schedule that breaks an invariant, with the command that replays it.
func TestExactlyOnce(t *testing.T) {
	seeds := schedules(t)
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			// One share of the seeds per processor, each in its own
			// bubbles: the schedules are independent.
			shares := min(runtime.GOMAXPROCS(0), len(seeds))
			for i := range shares {
				t.Run(strconv.Itoa(i), func(t *testing.T) {
					t.Parallel()
					failed, ran := 0, 0
					for j := i; j < len(seeds) && failed < maxFailed; j += shares {
						if !explore(t, virtual, s, seeds[j]) {
							failed++
						}
						if ran++; ran%progressEvery == 0 {
							t.Logf("%s share %d: %d schedules, %d failed", s.name, i, ran, failed)
						}
					}
				})
			}
		})
		t.Logf("%s: %d schedules", s.name, len(seeds))
	}
}

// A share of the seeds goes on past a failing schedule, so that a long
// run reports every failing seed it meets, up to maxFailed; a long run
// says how far it got every progressEvery schedules.
const (
	maxFailed     = 10
	progressEvery = 50000
)

// explore runs the schedule of seed on a new store s at pace (in a
// synctest bubble when virtual) and fails t with the command that replays
// it if it breaks an invariant; it reports whether the schedule held.
func explore(t *testing.T, pace pace, s store, seed int64) bool {
	var w *world
	if pace == virtual {
		synctest.Test(t, func(t *testing.T) { w = run(t, pace, s, nil, seed) })
	} else {
		w = run(t, pace, s, nil, seed)
	}
	v := w.check()
	if *traceFlag || len(v) > 0 {
		t.Logf("seed %d trace:\n%s", seed, strings.Join(w.trace, "\n"))
	}
	if len(v) > 0 {
		test, tags := strings.Split(t.Name(), "/")[0], ""
		if pace != virtual {
			tags = "-tags integration "
		}
		// A schedule's draws are fixed by its seed, but not everything in
		// it: the order of goroutines woken at one instant and of Go's maps
		// is the runtime's, so a replay may need several runs to fail.
		t.Errorf("seed %d broke %d invariants:\n  %s\nreplay: go test %s./sim -run '%s/%s' -sim.seed=%d -sim.trace -count=20 -failfast",
			seed, len(v), strings.Join(v, "\n  "), tags, test, s.name, seed)
	}
	return len(v) == 0
}

// run plays the schedule of seed on a new store s at pace (a virtual
// pace inside a synctest bubble): the clients run to their end, then the
// links heal and the world settles. When mutate is set, the gateways see
// the store through it (a deliberately broken transition, to show the
// checker catches what it breaks).
func run(t *testing.T, pace pace, s store, mutate func(ledger.Ledger) ledger.Ledger, seed int64) *world {
	w := &world{seed: seed, pace: pace, start: time.Now(), mutate: mutate, effects: map[string][]effect{},
		received: map[string]bool{}, sentBy: map[string]string{}, gave: map[string][][]byte{}, jobIntent: map[string]string{},
		reserved: map[string]string{}, sentFrom: map[string]string{}, acked: map[string]acked{},
		gone: map[string]bool{}, cancelled: map[string]bool{}}
	if pace == virtual { // the store's clock, ahead of or behind the gateways'
		w.offset = []time.Duration{0, 0, 0, 90 * time.Second, -90 * time.Second, 2 * time.Second, -2 * time.Second}[w.draw("offset")%7]
	}
	w.store, w.another = s.open(t, seed, func() time.Time { return time.Now().Add(w.offset) })
	// On a server, in half the schedules each gateway has its own client
	// (its own pool, replay memory and notices), as instances do;
	// otherwise they share one, as handlers of one instance do.
	w.perGateway = pace != virtual && w.another != nil && w.draw("clients")%2 == 0
	defer func() { w.current().Close() }()

	// Two routes on the one store, each naming its providers primary and
	// fallback; each plain, hedged (providers without side effects) or
	// with a primary that deduplicates by the job id; the second keys a
	// request without a key by its fingerprint; lookups on either, both
	// or neither.
	lookups := w.draw("lookups") % 4
	for i, name := range []string{"charges", "refunds"} {
		r := &route{name: name, implicit: i == 1, lookups: lookups == uint64(i) || lookups == 2,
			primary: newProvider(w, name, "primary"), fallback: newProvider(w, name, "fallback")}
		switch w.draw("route", name) % 3 {
		case 1:
			r.hedged = true
		case 2:
			r.primary.dedup = true
		}
		w.routes = append(w.routes, r)
		w.logf("route %s: hedged %v, primary deduplicates %v, implicit keys %v, lookups %v", name, r.hedged, r.primary.dedup,
			r.implicit, r.lookups)
	}
	w.logf("the store's clock is %v off the gateways'", w.offset)
	for g := range gateways {
		gw, err := w.newGateway("gw"+strconv.Itoa(g), w.store)
		if err != nil {
			t.Fatal(err)
		}
		w.gateways = append(w.gateways, gw)
	}
	all := slices.Clone(w.gateways)

	var wg sync.WaitGroup
	for i := range intents {
		wg.Add(1)
		go w.client(i, &wg)
	}
	clientsDone, operatorDone := make(chan struct{}), make(chan struct{})
	go func() { w.operator(clientsDone); close(operatorDone) }()
	killed := pace == virtual && w.draw("kill")%4 == 0
	if killed {
		started := make(chan []*gateway)
		go func() { started <- w.kill() }()
		all = append(all, <-started...)
	}
	wg.Wait()
	close(clientsDone)
	<-operatorDone
	w.mu.Lock()
	w.healed = true
	w.mu.Unlock()
	w.logf("links healed")
	w.settle()
	for _, g := range all {
		g.stop()
		g.done.Wait()
		if g.own != nil {
			g.own.Close()
		}
	}
	if killed {
		// What a killed gateway still runs (its never-sent queue, whose
		// link never comes back) gives up after an hour; nothing it does
		// reaches anything.
		time.Sleep(time.Hour + time.Minute)
	}
	w.readJobs()
	return w
}

// newGateway starts a gateway over store: a middleware per route, and a
// reconciler per route whose providers answer lookups.
func (w *world) newGateway(name string, store ledger.Ledger) (*gateway, error) {
	var own ledger.Ledger
	if w.perGateway {
		var err error
		if own, err = w.another(); err != nil {
			return nil, err
		}
		store = own
	}
	seen := store
	if w.mutate != nil {
		seen = w.mutate(store)
	}
	g := &gateway{name: name, own: own, link: &link{Ledger: seen, w: w, name: name, calls: map[string]int{}}}
	ctx, stop := context.WithCancel(context.Background())
	g.stop = stop
	failoverOn, err := fallback.ParseFailoverOn([]string{"connect_error", "503"})
	if err != nil {
		return nil, err
	}
	for _, r := range w.routes {
		c := proxy.Config{
			Ledger:          g.link,
			Scope:           r.name,
			Providers:       []proxy.Provider{{Name: r.primary.name, Handler: r.primary}, {Name: r.fallback.name, Handler: r.fallback}},
			FailoverOn:      failoverOn,
			AttemptTimeout:  w.dur(attemptTimeout),
			AttemptDeadline: w.dur(attemptDeadline),
			ReconcileEvery:  w.dur(reconcileEvery),
			Retention:       24 * time.Hour,
			IsConnectError:  connectError,
			Logger:          w.logger(name),
			Hold:            w.hold,
		}
		if r.hedged {
			c.HedgeAfter = w.dur(300 * time.Millisecond)
		}
		if r.primary.dedup {
			c.Providers[0].Deduplicates = proxy.DefaultKeyHeader
		}
		if r.implicit {
			c.ImplicitKey = 24 * time.Hour
		}
		mw, err := proxy.New(c)
		if err != nil {
			stop()
			return nil, err
		}
		g.mws = append(g.mws, mw)
		if r.lookups {
			rc := mw.Reconciler([]proxy.Lookup{{Provider: r.primary.name, Send: r.primary.lookup},
				{Provider: r.fallback.name, Send: r.fallback.lookup}})
			g.done.Add(1)
			go func() { defer g.done.Done(); rc.Run(ctx) }()
		}
	}
	return g, nil
}

// kill, at a time drawn from the seed, kills a gateway's process as
// kill -9 does, and starts another in its place: with a store that lives
// in that process (the file ledger), every gateway of it dies and the
// store is reopened from its files; else one gateway dies and the store
// lives on. It returns the gateways it started.
func (w *world) kill() []*gateway {
	reopen := w.another
	time.Sleep(w.dur(time.Duration(500+w.draw("kill at")%8000) * time.Millisecond))
	w.mu.Lock()
	victims := w.gateways
	if reopen == nil {
		victims = victims[w.draw("victim")%uint64(len(victims)):][:1]
	}
	var alive []*gateway
	for _, g := range w.gateways {
		if !slices.Contains(victims, g) {
			alive = append(alive, g)
		}
	}
	for _, g := range victims {
		g.link.kill()
		g.stop()
	}
	store := w.store
	w.mu.Unlock()
	w.logf("kill -9: %d gateways die (store reopened: %v)", len(victims), reopen != nil)
	if reopen != nil {
		w.reopening.Lock()
		store.Close()
		s, err := reopen()
		if err != nil {
			w.reopening.Unlock()
			w.violation("world: the store does not open again after a kill -9: %v", err)
			return nil
		}
		store = s
		w.mu.Lock()
		w.store = store // the world reads the new store from now on
		w.mu.Unlock()
		w.reopening.Unlock()
	}
	var started []*gateway
	for _, v := range victims {
		g, err := w.newGateway(v.name+"'", store)
		if err != nil {
			w.violation("world: %v", err)
			continue
		}
		started = append(started, g)
	}
	w.mu.Lock()
	w.store, w.gateways = store, append(alive, started...)
	w.mu.Unlock()
	return started
}

// settle lets the world run until nothing is left to happen: in virtual
// time, for settleTime; in real time, past every lease and until no
// gateway has an attempt or a never-sent queue running, twice in a row
// (no client is left to start one), within settleLimit.
func (w *world) settle() {
	if w.pace == virtual {
		time.Sleep(settleTime)
		synctest.Wait()
		return
	}
	time.Sleep(w.dur(attemptDeadline))
	const look, settleLimit = 20 * time.Millisecond, 2 * time.Minute
	for end, idle := time.Now().Add(settleLimit), 0; idle < 2; time.Sleep(look) {
		if time.Now().After(end) {
			w.violation("world: the gateways still run attempts or never-sent queues %v after the links healed", settleLimit)
			return
		}
		w.mu.Lock()
		if w.holds == 0 {
			idle++
		} else {
			idle = 0
		}
		w.mu.Unlock()
	}
	w.logf("settled")
}

// logger returns a logger that puts a gateway's warnings and errors in
// the trace, under its name: they say why it did what the trace shows.
func (w *world) logger(name string) *zap.Logger {
	enc := zapcore.NewConsoleEncoder(zapcore.EncoderConfig{LevelKey: "level", MessageKey: "msg", EncodeLevel: zapcore.LowercaseLevelEncoder})
	out := zapcore.AddSync(traceWriter(func(line string) { w.logf("%s %s", name, line) }))
	return zap.New(zapcore.NewCore(enc, out, zapcore.WarnLevel))
}

// traceWriter is an io.Writer of log lines.
type traceWriter func(line string)

func (f traceWriter) Write(p []byte) (int, error) {
	f(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// readJobs reads every job a client was told of, a provider saw or the
// store acknowledged, as the world ends; a job a purge removed is gone.
func (w *world) readJobs() {
	jobs := map[string]bool{}
	for _, a := range w.answers {
		if a.job != "" {
			jobs[a.job] = true
		}
	}
	for job := range w.jobIntent {
		jobs[job] = true
	}
	for job := range w.reserved {
		jobs[job] = true
	}
	purged := ""
	if w.purged != "" {
		purged = string(proxy.NewHasher(nil).Owner(w.purged))
	}
	store := w.current()
	for id := range jobs {
		j, err := store.Job(context.Background(), id)
		if errors.Is(err, ledger.ErrNotFound) && purged != "" && w.reserved[id] == purged {
			w.gone[id] = true
			continue
		}
		if _, acked := w.reserved[id]; acked && errors.Is(err, ledger.ErrNotFound) {
			w.violation("durable: job %s, whose reservation the store acknowledged, is lost", id)
			continue
		}
		if err != nil {
			w.violation("world: job %s, which a client or provider saw, cannot be read: %v", id, err)
			continue
		}
		w.final = append(w.final, j)
	}
	slices.SortFunc(w.final, func(a, b *ledger.Job) int { return strings.Compare(a.ID, b.ID) })
}

// check tests the invariants of docs/reliability.md on what the schedule
// left, and returns each violation.
func (w *world) check() []string {
	v := slices.Clone(w.noted) // seen while the world ran: no attempt arrives after its lease
	byID := map[string]*ledger.Job{}
	for _, j := range w.final {
		byID[j.ID] = j
	}

	// At most one side effect per intent (a hedged route's providers have
	// none: both may act), unless an operator decided: a cancelled job
	// may run again, and after a purge the owner's key is a new intent
	// (one side effect per job, then).
	decided := map[string]bool{}
	for job := range w.cancelled {
		decided[w.jobIntent[job]] = true
	}
	for intent, acts := range w.effects {
		if w.routeOf(intent).hedged || decided[intent] {
			continue
		}
		perJob := map[string][]string{}
		all := make([]string, len(acts))
		purged := false
		for i, e := range acts {
			perJob[e.job] = append(perJob[e.job], e.where)
			all[i] = e.where
			purged = purged || w.gone[e.job]
		}
		if !purged && len(acts) > 1 {
			v = append(v, fmt.Sprintf("once: intent %s acted %d times: %v", intent, len(acts), all))
		}
		for job, where := range perJob {
			if purged && len(where) > 1 {
				v = append(v, fmt.Sprintf("once: job %s of intent %s acted %d times: %v", job, intent, len(where), where))
			}
		}
	}

	for _, a := range w.answers {
		if a.status/100 != 2 {
			continue
		}
		var s sent
		if err := json.Unmarshal(a.body, &s); err != nil {
			v = append(v, fmt.Sprintf("owner: request %s: answer %d %q is not a provider's", a.request, a.status, a.body))
			continue
		}
		// No answer crosses owners or intents.
		if s.Intent != a.intent || ownerOf(a.intent) != s.Owner {
			v = append(v, fmt.Sprintf("owner: request %s of %s got the answer of %s (owner %s)", a.request, a.intent, s.Intent, s.Owner))
		}
		// A purged owner's answers are replayed by no instance, once the
		// purge's notice reached it.
		if w.gone[a.job] {
			if a.replayed && a.sent.After(w.purgedAt.Add(w.pace.notice)) {
				v = append(v, fmt.Sprintf("purged: request %s, sent after %s was purged, got a replay of job %s, which the purge removed",
					a.request, w.purged, a.job))
			}
			continue
		}
		if w.purgedBefore(a.job, a.sent) {
			continue // answered before a purge removed its job, which may be back as failed since
		}
		// Replayed exactly when the request did not produce the answer: a
		// relayed answer (not replayed) is one a provider gave an attempt
		// the request carried (a provider that deduplicates answers a
		// re-send with what it did for an earlier request), and a request
		// whose own attempt completed the job is never told its answer is
		// a replay.
		completer := ""
		if j := byID[a.job]; j != nil && j.State == ledger.JobCompleted {
			for _, at := range j.Attempts {
				if at.ID == j.CompletedBy {
					completer = w.sentBy[a.job+"/"+strconv.Itoa(at.Number)]
				}
			}
		}
		own := slices.ContainsFunc(w.gave[a.request], func(b []byte) bool { return bytes.Equal(b, a.body) })
		switch {
		case !a.replayed && !own:
			v = append(v, fmt.Sprintf("replayed: request %s: Idempotent-Replayed false on an answer no attempt of its got (the provider gave it %s)",
				a.request, s.Request))
		case a.replayed && completer == a.request:
			v = append(v, fmt.Sprintf("replayed: request %s: Idempotent-Replayed true on the answer its own attempt completed the job with", a.request))
		}
		// Every answer of a completed job is its stored answer, byte for
		// byte; a replay comes only from a completed job. (The request
		// whose attempt produced an answer gets it even when the ledger
		// did not take it: the job is then unknown, never completed with
		// another.)
		j := byID[a.job]
		switch {
		case j == nil:
			v = append(v, fmt.Sprintf("stored: request %s: answered for job %q, which does not exist", a.request, a.job))
		case j.State != ledger.JobCompleted || j.Response == nil:
			if a.replayed {
				v = append(v, fmt.Sprintf("stored: request %s got a replay, but job %s is %s", a.request, j.ID, j.State))
			}
		case w.cancelled[j.ID] && !a.replayed:
			// An operator cancelled the job after this request got its
			// own answer (which the ledger had not taken): a retry then
			// ran it again, as the operator decided.
		case j.Response.Status != a.status || (j.Response.Stored && !bytes.Equal(j.Response.Body, a.body)):
			v = append(v, fmt.Sprintf("stored: request %s: answer %d %s, stored %d %s", a.request, a.status, a.body, j.Response.Status, j.Response.Body))
		}
	}

	// Nothing the store acknowledged is lost, across a kill -9 too.
	for id, ack := range w.acked {
		j, resp := byID[id], ack.resp
		switch {
		case w.gone[id] || w.purgedBefore(id, ack.at):
		case j == nil:
			v = append(v, fmt.Sprintf("durable: job %s, whose completion the store acknowledged, is lost", id))
		case j.State != ledger.JobCompleted || j.Response == nil || j.Response.Status != resp.Status ||
			(resp.Stored && !bytes.Equal(j.Response.Body, resp.Body)):
			v = append(v, fmt.Sprintf("durable: job %s completed with %d %s, acknowledged; now %s %+v", id, resp.Status, resp.Body, j.State, j.Response))
		}
	}

	for _, j := range w.final {
		acted := slices.ContainsFunc(w.effects[w.jobIntent[j.ID]], func(e effect) bool { return e.job == j.ID })
		for _, a := range j.Attempts {
			ref := j.ID + "/" + strconv.Itoa(a.Number)
			// An attempt never sent ends failed once the link is back (a
			// killed gateway's link never is: its lease makes it unknown).
			if g := w.sentFrom[ref]; !w.received[ref] && (a.State == ledger.AttemptUnknown || a.State == ledger.AttemptStarting) &&
				(g == "" || w.gateway(g) != nil) {
				v = append(v, fmt.Sprintf("unsent: attempt %s was never sent but is %s", ref, a.State))
			}
		}
		// No job fails while a provider acted for it.
		if r := w.routeOf(w.jobIntent[j.ID]); j.State == ledger.JobFailed && acted && !r.hedged && !w.cancelled[j.ID] &&
			!w.purgedBefore(j.ID, time.Time{}) {
			v = append(v, fmt.Sprintf("acted: job %s is failed, but a provider acted for it: %v", j.ID, w.effects[w.jobIntent[j.ID]]))
		}
	}
	return v
}

// purgedBefore reports whether an operator purged job id's owner after
// at. A purged job may come back failed, with no answer: a never-sent
// record of a reservation made before the purge repeats it (and so
// makes the job again) to find its attempt.
func (w *world) purgedBefore(id string, at time.Time) bool {
	return w.purged != "" && w.purgedAt.After(at) && w.reserved[id] == string(proxy.NewHasher(nil).Owner(w.purged))
}

// ownerOf returns the owner of intent ("route/owner/key").
func ownerOf(intent string) string {
	_, rest, _ := strings.Cut(intent, "/")
	owner, _, _ := strings.Cut(rest, "/")
	return owner
}
