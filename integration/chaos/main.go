// Command chaos is the onejob chaos soak: three gateway instances on one
// shared ledger (PostgreSQL, with a Redis cache, Redis, or Redis Cluster), an upstream
// that misbehaves on purpose, 200 clients retrying over a few thousand
// keys, a gateway killed with SIGKILL and the ledger's server restarted
// mid-run, and faults on each instance's link to its ledger (a fault proxy
// in between): replies lost after their command ran, replies delayed past
// the client's timeout, connections reset mid-call, the ledger unreachable
// for a few seconds. On Redis Cluster (-ledger redis-cluster) masters are
// killed, their replicas promoted, and slots that hold jobs migrated under
// load instead, with no link faults (cluster.go). Once every deadline has
// passed, it checks the upstream's record of what it executed, the ledger
// (through the admin API) and every answer the clients got, and exits 1
// on any violation; on a cluster, a violation that follows a master kill
// says which (explain.go).
//
// Run it with ./integration/chaos/run.sh, which starts the servers and
// builds the gateway; see -h for the knobs.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
	"github.com/onejob/onejob/proxy"
)

// discardLog silences the upstream's http.Server: its resets are on purpose.
var discardLog = log.New(io.Discard, "", 0)

// options are the driver's flags.
type options struct {
	ledger          string
	binary          string
	work            string
	short           bool
	duration        time.Duration
	clients         int
	owners          int
	keys            int
	kills           int
	restarts        int
	masterKills     int
	migrations      int
	replicas        int
	fsyncAlways     bool
	links           linkPlan
	cache           bool
	attemptTimeout  time.Duration
	attemptDeadline time.Duration
	inFlightWait    time.Duration
	hedgeAfter      time.Duration
	maxTries        int
	think           time.Duration
	acceptResets    float64
	maxViolations   int
	dedupClients    int
}

func parseOptions() options {
	var o options
	flag.StringVar(&o.ledger, "ledger", "", "the shared ledger: postgres, redis or redis-cluster (required)")
	flag.StringVar(&o.binary, "binary", "", "the gateway binary, built from ./cmd/caddy (required)")
	flag.StringVar(&o.work, "work", "", "directory for configs and logs (default: a new temporary one)")
	flag.BoolVar(&o.short, "short", false, "a CI-sized run: less load, fewer keys and faults")
	flag.DurationVar(&o.duration, "duration", 150*time.Second, "how long the clients run (-short: 25s)")
	flag.IntVar(&o.clients, "clients", 200, "concurrent clients")
	flag.IntVar(&o.owners, "owners", 5, "owners (Authorization: Bearer <owner>) (-short: 4)")
	flag.IntVar(&o.keys, "keys", 800, "keys per owner, the same key names under every owner (-short: 250)")
	flag.IntVar(&o.kills, "kills", 3, "gateway instances killed with SIGKILL and restarted (-short: 1)")
	flag.IntVar(&o.restarts, "restarts", 2, "restarts of the ledger's server (-short: 1); not on redis-cluster")
	flag.IntVar(&o.masterKills, "master-kills", 2, "redis-cluster: masters killed with SIGKILL, their replica promoted, then started again (-short: 1)")
	flag.IntVar(&o.migrations, "migrations", 2, "redis-cluster: slots holding jobs migrated to another master under load (-short: 1)")
	flag.IntVar(&o.replicas, "replicas", 0, "redis-cluster: the ledger's replicas setting, a write acknowledged once that many replicas have it (WAIT); 0: off")
	flag.BoolVar(&o.fsyncAlways, "fsync-always", false, "redis-cluster: appendonly yes and appendfsync always on every node (CONFIG SET at start);\n"+
		"a single Redis ledger always runs with them")
	flag.IntVar(&o.links.Drops, "lost-replies", 40, "ledger replies dropped after their command ran (-short: 8)")
	flag.IntVar(&o.links.Delays, "delays", 3, "windows of 1.5s in which a link's replies are held past the client's timeout (-short: 1)")
	flag.DurationVar(&o.links.Delay, "reply-delay", 6*time.Second, "how long a delayed reply is held: past the gateway's 5s per ledger call")
	flag.IntVar(&o.links.Resets, "resets", 6, "times every open connection of a link is reset with RST (-short: 2)")
	flag.IntVar(&o.links.Cuts, "cuts", 3, "times an instance's ledger link is cut for 2-4s (-short: 1)")
	flag.BoolVar(&o.cache, "cache", true, "a Redis cache in front of the PostgreSQL ledger")
	flag.DurationVar(&o.attemptTimeout, "attempt-timeout", 500*time.Millisecond, "the gateways' attempt_timeout")
	flag.DurationVar(&o.attemptDeadline, "attempt-deadline", 3*time.Second, "the gateways' attempt_deadline")
	flag.DurationVar(&o.inFlightWait, "in-flight-wait", time.Second, "the gateways' in_flight wait")
	flag.DurationVar(&o.hedgeAfter, "hedge-after", 0, "the gateways' hedge_after; off by default. Hedging sends one intent twice on\n"+
		"purpose, so the soak then reports double executions: a way to see that its checks bite")
	flag.IntVar(&o.maxTries, "max-tries", 30, "requests per client session before it gives up")
	flag.DurationVar(&o.think, "think", 500*time.Millisecond, "mean pause of a client between sessions")
	flag.Float64Var(&o.acceptResets, "accept-resets", 0.03, "odds that the upstream resets a connection it accepts")
	flag.IntVar(&o.maxViolations, "max-violations", 300, "violations printed in full; the rest are counted")
	flag.IntVar(&o.dedupClients, "dedup-clients", 20, "clients of the route whose provider deduplicates and answers lookups; 0: no such route")
	flag.Parse()

	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if o.short {
		short := map[string]func(){
			"duration":     func() { o.duration = 25 * time.Second },
			"owners":       func() { o.owners = 4 },
			"keys":         func() { o.keys = 250 },
			"kills":        func() { o.kills = 1 },
			"restarts":     func() { o.restarts = 1 },
			"master-kills": func() { o.masterKills = 1 },
			"migrations":   func() { o.migrations = 1 },
			"lost-replies": func() { o.links.Drops = 8 },
			"delays":       func() { o.links.Delays = 1 },
			"resets":       func() { o.links.Resets = 2 },
			"cuts":         func() { o.links.Cuts = 1 },
		}
		for name, apply := range short {
			if !set[name] {
				apply()
			}
		}
	}
	return o
}

var ownerNames = []string{"alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy"}

func main() {
	o := parseOptions()
	if err := o.valid(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	code, err := run(ctx, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
	}
	os.Exit(code)
}

func (o options) valid() error {
	switch {
	case o.ledger != "postgres" && o.ledger != "redis" && o.ledger != "redis-cluster":
		return fmt.Errorf("-ledger must be postgres, redis or redis-cluster, not %q", o.ledger)
	case o.replicas < 0 || o.masterKills < 0 || o.migrations < 0:
		return fmt.Errorf("-replicas, -master-kills and -migrations cannot be negative")
	case o.ledger != "redis-cluster" && (o.replicas > 0 || o.fsyncAlways):
		return fmt.Errorf("-replicas and -fsync-always are for -ledger redis-cluster (the single test Redis server has no replica)")
	case o.binary == "":
		return fmt.Errorf("-binary is required (go build -o caddy ./cmd/caddy)")
	case o.owners < 1 || o.owners > len(ownerNames):
		return fmt.Errorf("-owners must be from 1 to %d", len(ownerNames))
	case o.keys < 1 || o.clients < 1 || o.maxTries < 1:
		return fmt.Errorf("-keys, -clients and -max-tries must be positive")
	case o.attemptTimeout <= 0 || o.attemptDeadline <= o.attemptTimeout:
		return fmt.Errorf("-attempt-deadline must be longer than -attempt-timeout")
	case o.links.Drops < 0 || o.links.Delays < 0 || o.links.Resets < 0 || o.links.Cuts < 0:
		return fmt.Errorf("-lost-replies, -delays, -resets and -cuts cannot be negative")
	case o.links.Delay <= 0 || o.links.Delay > faultproxy.MaxDelay:
		return fmt.Errorf("-reply-delay must be positive and at most %s", faultproxy.MaxDelay)
	}
	return nil
}

const ownerSecret = "chaos-soak-secret"

var providers = []string{"primary", "fallback"}

// run is one soak on one ledger. It returns the exit code: 0 clean, 1 on a
// violation, 2 when the soak itself could not run.
func run(ctx context.Context, o options) (int, error) {
	began := time.Now()
	// Everything below is bounded; this is the last resort.
	hardLimit := o.duration + 4*time.Minute
	ctx, cancel := context.WithTimeout(ctx, hardLimit)
	defer cancel()

	svc := servicesFromEnv()
	onCluster := o.ledger == "redis-cluster"
	if o.restarts > 0 && !onCluster {
		if err := svc.canRestart(o.ledger); err != nil {
			return 2, err
		}
	}
	// Each instance's ledger and cache lines, given the URLs to reach
	// their servers by (through the instance's fault proxies).
	var ledgerLine, cacheLine func(url string) string
	ledgerURL, cacheURL := "", ""
	var rc *cluster // the ledger's Redis Cluster
	var err error
	switch o.ledger {
	case "postgres":
		if svc.Postgres == "" {
			return 2, fmt.Errorf("ONEJOB_TEST_POSTGRES is not set: run ./integration/chaos/run.sh")
		}
		ledgerURL = svc.Postgres
		ledgerLine = func(url string) string { return "ledger postgres " + url + " chaos" }
		if o.cache {
			if svc.Redis == "" {
				return 2, fmt.Errorf("ONEJOB_TEST_REDIS is not set for the cache: run ./integration/chaos/run.sh (or pass -cache=false)")
			}
			cacheURL = svc.Redis
			cacheLine = func(url string) string { return "cache redis " + url + " chaoscache:" }
		}
	case "redis":
		if svc.Redis == "" {
			return 2, fmt.Errorf("ONEJOB_TEST_REDIS is not set: run ./integration/chaos/run.sh")
		}
		if err := redisDurable(ctx, svc.Redis); err != nil {
			return 2, fmt.Errorf("making Redis durable: %w", err)
		}
		ledgerURL = svc.Redis
		ledgerLine = func(url string) string { return "ledger redis " + url + " chaos:" }
	case "redis-cluster":
		if svc.Cluster == "" || svc.Work == "" {
			return 2, fmt.Errorf("ONEJOB_TEST_REDIS_CLUSTER and WORK are not set: run ./integration/chaos/run.sh")
		}
		if rc, err = findCluster(svc.Work); err != nil {
			return 2, err
		}
		if err := rc.waitWhole(ctx, 30*time.Second); err != nil {
			return 2, err
		}
		if o.fsyncAlways {
			if err := rc.durable(ctx); err != nil {
				return 2, fmt.Errorf("making the cluster durable: %w", err)
			}
		}
		ledgerURL = svc.Cluster
		block := ""
		if o.replicas > 0 {
			block = fmt.Sprintf(" {\n\t\t\t\treplicas %d\n\t\t\t}", o.replicas)
		}
		ledgerLine = func(url string) string { return "ledger redis " + url + " chaos:" + block }
		// The gateways reach the nodes directly: no link faults (cluster.go).
		o.links = linkPlan{Delay: o.links.Delay}
	}
	if o.work == "" {
		dir, err := os.MkdirTemp("", "onejob-chaos")
		if err != nil {
			return 2, err
		}
		o.work = dir
	}
	if err := os.MkdirAll(o.work, 0o755); err != nil {
		return 2, err
	}
	faultLog, err := os.Create(filepath.Join(o.work, "faults.log"))
	if err != nil {
		return 2, err
	}
	defer faultLog.Close()

	up, err := newUpstream(providers, o.attemptTimeout, o.attemptDeadline, o.acceptResets)
	if err != nil {
		return 2, err
	}
	defer up.close()

	cfg := gatewayConfig{
		Binary: o.binary, OwnerSecret: ownerSecret,
		AttemptTimeout: o.attemptTimeout, AttemptDeadline: o.attemptDeadline, InFlightWait: o.inFlightWait,
		HedgeAfter: o.hedgeAfter,
		Providers:  providers, Upstreams: up.addrs,
	}
	var dup *dedupUpstream
	if o.dedupClients > 0 {
		if dup, err = newDedupUpstream(o.attemptTimeout, o.attemptDeadline); err != nil {
			return 2, err
		}
		defer dup.close()
		cfg.Dedup = dup.addr
	}
	var gws fleet
	ports, err := freePorts(2 * 3)
	if err != nil {
		return 2, err
	}
	var links []*ledgerLink
	defer func() {
		for _, l := range links {
			l.proxy.Close()
		}
	}()
	link := func(n int, name, rawURL string) (string, error) {
		p, url, err := viaProxy(rawURL)
		if err != nil {
			return "", fmt.Errorf("a fault proxy for gateway %d's %s: %w", n, name, err)
		}
		links = append(links, &ledgerLink{Gateway: n, Name: name, proxy: p})
		return url, nil
	}
	for n := range 3 {
		c := cfg
		url := ledgerURL
		if !onCluster {
			if url, err = link(n, o.ledger, ledgerURL); err != nil {
				return 2, err
			}
		}
		c.Ledger = ledgerLine(url)
		if cacheURL != "" {
			if url, err = link(n, "cache", cacheURL); err != nil {
				return 2, err
			}
			c.Cache = cacheLine(url)
		}
		g, err := newGateway(n, o.work, c, ports[2*n], ports[2*n+1])
		if err != nil {
			return 2, err
		}
		gws = append(gws, g)
	}
	defer gws.stop() // before the proxies close
	if err := gws.startAll(ctx); err != nil {
		return 2, err
	}
	what := o.ledger + " ledger"
	if cacheURL != "" {
		what += " with a Redis cache"
	}
	if onCluster {
		what += fmt.Sprintf(" (3 masters, 3 replicas; replicas %d; appendfsync always %v; no link faults)", o.replicas, o.fsyncAlways)
	}
	fmt.Printf("chaos: %s, 3 gateways, %d clients, %s of load; logs in %s\n", what, o.clients, o.duration, o.work)

	// The load, with the faults alongside.
	cl := newClients(clientConfig{
		Clients: o.clients, Owners: ownerNames[:o.owners], Keys: o.keys, MaxTries: o.maxTries,
		Gateways: gws.urls, Path: "/charges", KeyPrefix: "k-", ThinkTime: o.think, Start: time.Now(), Duration: o.duration,
	})
	dcl := newClients(clientConfig{
		Clients: o.dedupClients, Owners: ownerNames[:o.owners], Keys: max(o.keys/4, 1), MaxTries: o.maxTries,
		Gateways: gws.urls, Path: dedupPath, KeyPrefix: "d-", ThinkTime: o.think, Start: time.Now(), Duration: o.duration,
	})
	f := &faults{fleet: gws, links: links, ledger: o.ledger, svc: svc, cluster: rc, out: faultLog}
	plan := processPlan([]string{faultKill, faultRestart}, []int{o.kills, o.restarts})
	if onCluster {
		plan = processPlan([]string{faultKill, faultMasterKill, faultMigrateSlot}, []int{o.kills, o.masterKills, o.migrations})
	}
	loadCtx, endLoad := context.WithTimeout(ctx, o.duration)
	defer endLoad()
	faultErr := make(chan error, 1)
	linksDone := make(chan struct{})
	go func() { faultErr <- f.run(loadCtx, o.duration, plan) }()
	go func() { f.runLinks(loadCtx, o.duration, o.links); close(linksDone) }()
	dedupDone := make(chan struct{})
	go func() { dcl.run(loadCtx); close(dedupDone) }()
	cl.run(loadCtx)
	<-dedupDone
	loadEnded := time.Now()
	<-linksDone
	for _, l := range links {
		l.proxy.Restore() // an interrupted fault ends with the load
	}
	if err := <-faultErr; err != nil {
		return 2, fmt.Errorf("injecting faults: %w", err)
	}
	if ctx.Err() != nil {
		return 2, fmt.Errorf("interrupted: %w", ctx.Err())
	}

	// Let every lease run out and every attempt end before looking.
	sleep(ctx, time.Until(loadEnded.Add(o.attemptDeadline+2*time.Second)))
	idleCtx, idleCancel := context.WithTimeout(ctx, 30*time.Second)
	idle := up.idle(idleCtx)
	idleCancel()
	if !idle {
		return 2, fmt.Errorf("the upstream still has requests running %s after the load ended", time.Since(loadEnded).Round(time.Second))
	}
	if dup != nil {
		// The reconcilers settle the route's unknown jobs by lookups once
		// their deadlines passed; then nothing of it may still run.
		if g := gws.anyRunning(); g != nil {
			settleDedup(ctx, g, 30*time.Second)
		}
		idleCtx, idleCancel := context.WithTimeout(ctx, 30*time.Second)
		idle := dup.idle(idleCtx)
		idleCancel()
		if !idle {
			return 2, fmt.Errorf("the deduplicating provider still has requests running")
		}
	}

	kills, restarts, clusterEvents := f.processFaults()
	ev := &evidence{
		Hasher:          proxy.NewHasher([]byte(ownerSecret)),
		Providers:       providers,
		IDs:             cl.identities(),
		Arrivals:        up.snapshot(),
		Exchanges:       cl.exchanges(),
		AttemptTimeout:  o.attemptTimeout,
		AttemptDeadline: o.attemptDeadline,
		Kills:           kills,
		Restarts:        restarts,
		Links:           linkEvents(links),
		AcceptResets:    up.resetsOnAccept(),
		Cluster:         clusterEvents,
		OnCluster:       onCluster,
	}
	admin := gws.anyRunning()
	if admin == nil {
		return 2, fmt.Errorf("no gateway is running")
	}
	if ev.Jobs, err = readLedger(ctx, admin); err != nil {
		return 2, fmt.Errorf("reading the ledger: %w", err)
	}
	// The deduplicating route's jobs are checked against its own provider.
	dedupJobs := map[string]*adminJob{}
	for id, j := range ev.Jobs {
		if slices.ContainsFunc(j.Attempts, func(a adminAttempt) bool { return a.Provider == dedupProvider }) {
			dedupJobs[id] = j
			delete(ev.Jobs, id)
		}
	}
	ev.Replays = replayAll(ctx, gws.urls(), replayable(ev))
	ev.ArrivalsAfter = up.count()

	r := check(ev)
	var dedupEx []exchange
	var dedupIDs []identity
	t := totals{Duplicates: r.Duplicates, CrossAnswers: r.CrossAnswers}
	if dup != nil {
		dedupEx, dedupIDs = dcl.exchanges(), dcl.identities()
		dr := checkDedup(dup, dedupJobs, dedupEx, ev, dedupIDs)
		r.Violations = append(r.Violations, dr.Violations...)
		t.Duplicates = append(t.Duplicates, dr.DuplicateIDs...)
		t.CrossAnswers += dr.CrossAnswers
		printDedup(os.Stdout, dr, dup, dcl)
	}
	if onCluster {
		x := newExplainer(ev, o.replicas, dedupJobs, dedupEx, dedupIDs)
		t.Notes = make([]string, len(r.Violations))
		for i, v := range r.Violations {
			t.Notes[i] = x.note(v)
		}
		t.DuplicatesAfterKill = x.afterKill(t.Duplicates)
	}
	printReport(os.Stdout, o, r, ev, cl, up, f.events, t, time.Since(began))
	if len(r.Violations) > 0 {
		return 1, nil
	}
	return 0, nil
}

// replayable returns the identities whose job is finished for good
// (completed or unknown): a replay of those changes nothing. A failed job
// would start a new attempt.
func replayable(ev *evidence) []identity {
	byHash := map[string]bool{}
	for _, j := range ev.Jobs {
		if j.State == "completed" || j.State == "unknown" {
			byHash[j.OwnerHash+"/"+j.KeyHash] = true
		}
	}
	var out []identity
	for _, id := range ev.IDs {
		h := fmt.Sprintf("%x/%x", ev.Hasher.Owner("Bearer "+id.Owner), ev.Hasher.Key(id.Key))
		if byHash[h] {
			out = append(out, id)
		}
	}
	return out
}

// gatewayLogs returns the lines of every instance's log, each prefixed
// with its instance.
func gatewayLogs(work string) []string {
	var out []string
	for n := 0; ; n++ {
		b, err := os.ReadFile(filepath.Join(work, fmt.Sprintf("gw%d", n), "caddy.log"))
		if err != nil {
			return out
		}
		for _, l := range strings.Split(string(b), "\n") {
			if l != "" {
				out = append(out, fmt.Sprintf("gw%d: %s", n, l))
			}
		}
	}
}

var jobIDPattern = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

// logLinesOf returns the log lines that name a job of the violation v, at
// most max.
func logLinesOf(logs []string, v string, max int) []string {
	ids := jobIDPattern.FindAllString(v, -1)
	var out []string
	for _, l := range logs {
		for _, id := range ids {
			if strings.Contains(l, id) {
				out = append(out, l)
				break
			}
		}
		if len(out) == max {
			break
		}
	}
	return out
}
