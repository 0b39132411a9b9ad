// Command bench measures the onejob gateway side by side with plain Caddy
// (built from the same Caddy version) and with pgbench running the
// PostgreSQL ledger's own SQL, in one run on loopback, and prints one table
// of medians with each series' ratio to its baseline. run.sh builds the
// binaries, starts PostgreSQL and Redis, and runs it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

type config struct {
	gateway, plain   string // the two caddy binaries
	wrk, pgbench     string
	dir, work        string // this directory (scripts), a scratch directory
	postgres, redis  string
	redisCluster     string
	profiles         string // where the profiles of the fresh and replay series go; "" for none
	duration, warmup time.Duration
	reps             int
	connections      int
	threads          int
	only             *regexp.Regexp
	waiters          int
	soak             time.Duration
	sweep            []int  // the sweep's numbers of stored jobs; none to skip it
	sweepAnswer      int    // bytes of each stored job's answer; 0: the gateway's own
	sweepCache       string // the sweep's file ledger's cache_size; "": its default
	sweepDir         string // where the sweep's file ledger is kept between runs; "" for the scratch directory
	pin              bool   // the load generators and the server under test each on a core of its own
	rate             int    // requests a second of the open-loop load; 0 for wrk's closed loop
}

// transport is the same upstream transport in every Caddyfile: Caddy's
// default idle pool (32 per host) would distort the comparison.
const transport = "{\n\t\ttransport http {\n\t\t\tkeepalive_idle_conns_per_host 1024\n\t\t}\n\t}"

// answer is what the upstream answers, as a payment API would.
const answer = `{"id":"ch_123","status":"succeeded","amount":4200,"currency":"eur"}`

func main() {
	var cfg config
	flag.StringVar(&cfg.gateway, "gateway", "", "the caddy binary with onejob")
	flag.StringVar(&cfg.plain, "plain", "", "the caddy binary without onejob, same Caddy version")
	flag.StringVar(&cfg.wrk, "wrk", "wrk", "the wrk binary")
	flag.StringVar(&cfg.pgbench, "pgbench", "pgbench", "the pgbench binary")
	flag.StringVar(&cfg.postgres, "postgres", os.Getenv("ONEJOB_TEST_POSTGRES"), "PostgreSQL URL")
	flag.StringVar(&cfg.redis, "redis", os.Getenv("ONEJOB_TEST_REDIS"), "Redis URL")
	flag.StringVar(&cfg.redisCluster, "redis-cluster", os.Getenv("ONEJOB_TEST_REDIS_CLUSTER"), "Redis Cluster URL (\"\": skip the cluster's series)")
	flag.StringVar(&cfg.profiles, "profiles", "", "save CPU and allocation profiles of the gateway under each fresh and replay series in this directory (\"\": none)")
	flag.DurationVar(&cfg.duration, "duration", 5*time.Second, "length of each measured run")
	flag.DurationVar(&cfg.warmup, "warmup", time.Second, "length of the unmeasured run before a series")
	flag.IntVar(&cfg.reps, "reps", 5, "measured runs per series (the median is reported)")
	flag.IntVar(&cfg.connections, "connections", 32, "concurrent connections (and pgbench clients)")
	flag.IntVar(&cfg.threads, "threads", 2, "wrk and pgbench threads")
	only := flag.String("only", "", "run only the series whose names match this regular expression")
	flag.IntVar(&cfg.waiters, "waiters", 10000, "clients waiting on one in-flight key (0: skip)")
	flag.DurationVar(&cfg.soak, "soak", 5*time.Minute, "length of the memory soak (0: skip)")
	sweep := flag.String("sweep", "10000,100000,1000000", "numbers of jobs stored beforehand, at which the sweep measures the file ledger and PostgreSQL (\"\": skip)")
	flag.IntVar(&cfg.sweepAnswer, "sweep-answer", 0, "bytes of the answer of each job the sweep stores beforehand: the gateway's, then random text (0: the answer as the gateway stored it)")
	flag.StringVar(&cfg.sweepCache, "sweep-cache", "", "the cache_size of the sweep's file ledger, as in a Caddyfile (\"\": the ledger's default)")
	flag.StringVar(&cfg.sweepDir, "sweep-dir", "", "keep the sweep's file ledger in this directory after the run, and grow the one a run left there rather than store its jobs again (\"\": a scratch directory)")
	flag.IntVar(&cfg.rate, "rate", 0, "send each series' requests open-loop at this many a second (vegeta), so that series compare at the same offered rate (0: wrk's closed loop, each series at the rate it reaches)")
	attackWith := flag.String("attack", "", "be the open-loop load process: send the requests this JSON describes, print a JSON report (the bench runs itself so)")
	flag.BoolVar(&cfg.pin, "pin", false, "run wrk and pgbench on CPU "+loadCPU+", the gateway and plain Caddy on CPU "+serverCPU+" (taskset)")
	flag.Parse()
	if *attackWith != "" {
		var spec attackSpec
		if err := json.Unmarshal([]byte(*attackWith), &spec); err != nil {
			log.Fatalf("bench: -attack: %v", err)
		}
		if err := json.NewEncoder(os.Stdout).Encode(attack(spec)); err != nil {
			log.Fatal(err)
		}
		return
	}
	if cfg.gateway == "" || cfg.plain == "" {
		log.Fatal("bench: -gateway and -plain are required (run ./integration/bench/run.sh)")
	}
	if _, err := exec.LookPath("taskset"); cfg.pin && err != nil {
		log.Fatalf("bench: -pin needs taskset (util-linux): %v", err)
	}
	// wrk and pgbench run for whole seconds: a shorter run would be none.
	for _, f := range []struct {
		name string
		d    *time.Duration
	}{{"duration", &cfg.duration}, {"warmup", &cfg.warmup}} {
		if whole := max(time.Second, (*f.d + time.Second - 1).Truncate(time.Second)); whole != *f.d {
			log.Printf("bench: -%s %v rounded up to %v: wrk and pgbench run for whole seconds", f.name, *f.d, whole)
			*f.d = whole
		}
	}
	cfg.only = regexp.MustCompile(*only)
	var err error
	if cfg.sweep, err = parseSizes(*sweep); err != nil {
		log.Fatalf("bench: %v", err)
	}
	if !cfg.only.MatchString("sweep") && !cfg.only.MatchString("sweep_file") && !cfg.only.MatchString("sweep_postgres") {
		cfg.sweep = nil // -only sweep_file measures the file ledger's alone
	}
	if cfg.profiles != "" {
		if err := os.MkdirAll(cfg.profiles, 0o755); err != nil {
			log.Fatal(err)
		}
		abs, err := filepath.Abs(cfg.profiles)
		if err != nil {
			log.Fatal(err)
		}
		cfg.profiles = abs
	}
	exe, _ := os.Getwd()
	cfg.dir = filepath.Join(exe, "integration", "bench")
	if _, err := os.Stat(filepath.Join(cfg.dir, "request.lua")); err != nil {
		log.Fatal("bench: run from the repository's root")
	}
	if cfg.work, err = os.MkdirTemp("", "onejob-bench-"); err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(cfg.work)

	printSettings(os.Stdout, cfg)
	up := startUpstream()
	results, err := runSeries(cfg, up)
	var swept []sweepPoint
	if err == nil && len(cfg.sweep) > 0 {
		swept, err = runSweep(cfg, up)
		results = append(results, sweepRows(swept)...)
	}
	if results != nil {
		printTable(os.Stdout, results)
		printShares(os.Stdout, results)
		printLedgerTimes(os.Stdout, results)
		printSweep(os.Stdout, swept)
		printRedisLoad(os.Stdout, results)
		printProfiles(os.Stdout, cfg.profiles, results)
	}
	if err != nil {
		log.Fatal(err)
	}
	if cfg.waiters > 0 && cfg.only.MatchString("waiters") {
		if err := benchWaiters(cfg, os.Stdout); err != nil {
			log.Fatal(err)
		}
	}
	if cfg.soak > 0 && cfg.only.MatchString("soak") {
		if err := soak(cfg, up, os.Stdout); err != nil {
			log.Fatal(err)
		}
	}
}

// printSettings prints how the series run, as the output's first lines.
func printSettings(w io.Writer, cfg config) {
	load := fmt.Sprintf("wrk with %d threads and %d connections (closed loop: each series at the rate it reaches)", cfg.threads, cfg.connections)
	if cfg.rate > 0 {
		load = fmt.Sprintf("open loop at %d requests/s (vegeta, a process of its own), at most %d connections", cfg.rate, cfg.connections)
	}
	fmt.Fprintf(w, "each series: a %v warm-up, then the median of %d runs of %v; %s\n", cfg.warmup, cfg.reps, cfg.duration, load)
	if cfg.pin {
		fmt.Fprintf(w, "pinning: on (wrk and pgbench on CPU %s, the gateway and plain Caddy on CPU %s; GOMAXPROCS=2 for the gateway on a file ledger; PostgreSQL, Redis and the upstream not pinned)\n", loadCPU, serverCPU)
	} else {
		fmt.Fprintf(w, "pinning: off (every process on any core; -pin puts the load and the server under test on a core each)\n")
	}
	fmt.Fprintf(w, "durability: the PostgreSQL and Redis series with %v; the _nodurable rows with %v\n", durable, nondurable)
	if len(cfg.sweep) > 0 {
		var sizes []string
		for _, n := range cfg.sweep {
			sizes = append(sizes, jobsLabel(n))
		}
		fmt.Fprintf(w, "sweep: the file ledger and PostgreSQL (durable) with %s jobs stored beforehand (sweep_* rows; target: CPU per request within %.0f%% of the first size's)\n",
			strings.Join(sizes, ", "), 100*(sweepTarget.cpuRatio-1))
	}
}

// upstream is the API behind the gateway: it answers a small JSON body and
// counts the requests that reach it, in all and by the run that sent them
// (request.lua names it in a header).
type upstream struct {
	addr  string
	hits  atomic.Int64
	mu    sync.Mutex
	byRun map[string]int64
}

// runHeader carries the prefix of the run's keys (request.lua).
const runHeader = "X-Bench-Run"

func startUpstream() *upstream {
	u := &upstream{byRun: map[string]int64{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	u.addr = l.Addr().String()
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		u.hits.Add(1)
		u.mu.Lock()
		u.byRun[r.Header.Get(runHeader)]++
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	return u
}

// sentBy returns how many requests of the run with keys named after
// prefix reached the upstream. Every series' server stays up through the
// rounds, and the attempts a fresh run's last requests started go on after
// wrk closed their connections: they reach the upstream during the next
// run, whose count must not take them.
func (u *upstream) sentBy(prefix string) int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.byRun[prefix]
}

// result is one series' medians.
type result struct {
	name     string
	rps      float64
	p50, p99 time.Duration
	cpu      time.Duration // per request; 0 when not measured
	peakRSS  int64         // bytes; 0 when not measured
	allocs   float64       // the server's heap allocations per request, over the measured runs
	syncs    float64       // the file ledger's syncs of its log per request; -1 when the server has none
	shares                 // where the machine's CPU went: each measure's median
	baseline string        // the series it is compared with
	target   target        // what it must reach against the baseline
	// Mean ledger time per request, by operation, from the gateway's
	// caddy_idempotency_ledger_seconds (fresh series).
	reserve, complete time.Duration
	profile           *profile   // fresh and replay series with -profiles
	redis             *redisLoad // fresh series on Redis: the load on each master
}

// series describes what one row of the table measures.
type series struct {
	name     string
	binary   string // gateway or plain
	site     string // the site block's body
	mode     string // request.lua's mode: plain, fresh, replay
	baseline string
	target   target
	redis    string // the Redis URL of the ledger, for fresh series whose load on it is measured
	// The stored mode's keys: <prefix>-1 to <prefix>-<keys>, each a job
	// stored before the series (the sweep).
	prefix string
	keys   int
	// What the series asks of PostgreSQL and Redis: the series on them
	// run durable, their fresh series once more without durability.
	durability durability
}

// The component targets: CPU per request as a ratio to the baseline's,
// at the same offered rate.
var (
	freshTarget     = target{cpuRatio: 1.20, extraAllocs: 60}
	replayTarget    = target{cpuRatio: 1.15}
	fileFreshTarget = target{cpuRatio: 1.10, maxSyncs: 0.25}
)

// target is what a series must reach against its baseline, judged on the
// medians; the zero target is none.
type target struct {
	ratio       float64       // minimum requests/s, as a ratio to the baseline's; 0 for no limit
	extraCPU    time.Duration // maximum CPU per request over the baseline's; 0 for no limit
	cpuRatio    float64       // maximum CPU per request, as a ratio to the baseline's; 0 for no limit
	extraAllocs float64       // maximum heap allocations per request over the baseline's; 0 for no limit
	maxSyncs    float64       // maximum syncs of the file ledger's log per request; 0 for no limit
}

func (t target) String() string {
	var parts []string
	if t.ratio > 0 {
		parts = append(parts, fmt.Sprintf(">= %gx", t.ratio))
	}
	if t.extraCPU > 0 {
		parts = append(parts, fmt.Sprintf("<= +%g us", float64(t.extraCPU)/float64(time.Microsecond)))
	}
	if t.cpuRatio > 0 {
		parts = append(parts, fmt.Sprintf("cpu <= %gx", t.cpuRatio))
	}
	if t.extraAllocs > 0 {
		parts = append(parts, fmt.Sprintf("allocs <= +%g", t.extraAllocs))
	}
	if t.maxSyncs > 0 {
		parts = append(parts, fmt.Sprintf("syncs <= %g", t.maxSyncs))
	}
	return strings.Join(parts, ", ")
}

// met says whether r reached the target against its baseline b.
func (t target) met(r, b result) bool {
	return r.rps/b.rps >= t.ratio && (t.extraCPU == 0 || r.cpu-b.cpu <= t.extraCPU) &&
		(t.cpuRatio == 0 || float64(r.cpu) <= t.cpuRatio*float64(b.cpu)) &&
		(t.extraAllocs == 0 || r.allocs-b.allocs <= t.extraAllocs) &&
		(t.maxSyncs == 0 || (r.syncs >= 0 && r.syncs <= t.maxSyncs))
}

// gatewaySite is the site block of a gateway whose idempotency handler
// keeps its jobs as the ledger line says, in front of the upstream.
func gatewaySite(up *upstream, ledger string) string {
	return "\tidempotency {\n\t\t" + ledger + "\n\t}\n" + proxySite(up)
}

// proxySite is the site block of plain Caddy's reverse proxy to the upstream.
func proxySite(up *upstream) string {
	return "\treverse_proxy " + up.addr + " " + transport + "\n"
}

// runSeries measures every series -only selects, in the order of the
// list, and gives PostgreSQL and Redis back their durability settings at
// the end; on an error, it returns no results.
func runSeries(cfg config, up *upstream) (results []result, err error) {
	proxy := proxySite(up)
	gw := func(ledger string) string { return gatewaySite(up, ledger) }
	// The gateway's pool gets as many connections as pgbench has clients
	// (pgx's default is 4 on this machine): the same resources on both
	// sides of the comparison.
	pg := "ledger postgres " + withParam(cfg.postgres, "pool_max_conns", strconv.Itoa(cfg.connections)) + " bench"
	// Each series with its baseline and its target, a component against
	// the cheapest thing that could do its job, in CPU per request (judged
	// at one offered rate with -rate): the gateway's fresh path on the
	// memory ledger against plain Caddy's reverse proxy (and at most 60
	// allocations more), every replay against plain Caddy answering by
	// itself, the file ledger's fresh path against the memory ledger's
	// (and at most a sync of its log for 4 requests). The other fresh
	// series are compared without a target: PostgreSQL's with its own SQL
	// run by pgbench, the cache's with PostgreSQL without it, Redis's with
	// plain Caddy.
	list := []series{
		{name: "plain_respond", binary: cfg.plain, mode: "plain",
			site: "\theader Content-Type application/json\n\trespond `" + answer + "` 200\n"},
		{name: "plain_reverse_proxy", binary: cfg.plain, mode: "plain", site: proxy},
		{name: "memory_fresh", mode: "fresh", site: gw("ledger memory"), baseline: "plain_reverse_proxy", target: freshTarget},
		{name: "memory_replay", mode: "replay", site: gw("ledger memory"), baseline: "plain_respond", target: replayTarget},
		{name: "file_fresh", mode: "fresh", site: gw("ledger file"), baseline: "memory_fresh", target: fileFreshTarget},
		{name: "file_replay", mode: "replay", site: gw("ledger file"), baseline: "plain_respond", target: replayTarget},
		{name: "postgres_fresh", mode: "fresh", site: gw(pg), baseline: "pgbench_ledger_sql", durability: durable},
		{name: "pgbench_ledger_sql", mode: "pgbench", durability: durable},
		{name: "postgres_replay", mode: "replay", site: gw(pg), baseline: "plain_respond", target: replayTarget, durability: durable},
		{name: "postgres+cache_fresh", mode: "fresh", site: gw(pg + "\n\t\tcache redis " + cfg.redis + " bench:cache:"), baseline: "postgres_fresh", durability: durable},
		{name: "postgres+cache_replay", mode: "replay", site: gw(pg + "\n\t\tcache redis " + cfg.redis + " bench:cache:"), baseline: "plain_respond", target: replayTarget, durability: durable},
		{name: "redis_fresh", mode: "fresh", site: gw("ledger redis " + cfg.redis + " bench:"), baseline: "plain_reverse_proxy", redis: cfg.redis, durability: durable},
		{name: "redis_replay", mode: "replay", site: gw("ledger redis " + cfg.redis + " bench:"), baseline: "plain_respond", target: replayTarget, durability: durable},
	}
	// The same two series on the cluster, next to the single server's,
	// with no target: the ratio is the cluster's over one server's.
	if cfg.redisCluster != "" {
		list = append(list,
			series{name: "redis-cluster_fresh", mode: "fresh", site: gw("ledger redis " + cfg.redisCluster + " bench:"), baseline: "redis_fresh", redis: cfg.redisCluster, durability: durable},
			series{name: "redis-cluster_replay", mode: "replay", site: gw("ledger redis " + cfg.redisCluster + " bench:"), baseline: "redis_replay", durability: durable})
	} else if cfg.only.MatchString("redis-cluster_fresh") {
		log.Printf("no Redis Cluster (-redis-cluster, ONEJOB_TEST_REDIS_CLUSTER): skipping its series")
	}
	// Then the durable fresh series once more without durability, each
	// against its durable row (the ratio: how much faster without it),
	// with no target.
	var nondurables []series
	for _, s := range list {
		if s.durability == durable && s.mode != "replay" {
			s.name, s.baseline, s.target, s.durability = s.name+"_nodurable", s.name, target{}, nondurable
			nondurables = append(nondurables, s)
		}
	}
	list = append(list, nondurables...)

	sw := &durabilitySwitch{cfg: cfg}
	defer func() {
		if rerr := sw.restore(context.Background()); rerr != nil {
			err = errors.Join(err, fmt.Errorf("bench: restoring the durability settings: %w", rerr))
		}
	}()
	run := fmt.Sprintf("%x", time.Now().UnixNano())
	// The durable series (and those on neither server) first, then the
	// non-durable ones: the servers switch once between them (turning
	// Redis's append-only file on rewrites it, which would load the runs
	// after every switch).
	var phases [2][]series
	for _, s := range list {
		if !cfg.only.MatchString(s.name) {
			continue
		}
		if s.binary == "" {
			s.binary = cfg.gateway
		}
		i := 0
		if s.durability == nondurable {
			i = 1
		}
		phases[i] = append(phases[i], s)
	}
	for _, phase := range phases {
		if len(phase) == 0 {
			continue
		}
		rs, err := runRounds(cfg, up, sw, phase, run)
		if err != nil {
			return nil, err
		}
		results = append(results, rs...)
	}
	return results, nil
}

// runRounds measures the series side by side: it starts each one's server
// and warms it up, then takes cfg.reps rounds, each one run of every
// series in turn, and reports each series' medians. A series and its
// baseline are so measured over the same minutes, and whatever else loads
// the machine meanwhile (a checkpoint, PostgreSQL vacuuming after
// pgbench's inserts, another tenant of the host) falls on both, not on
// whichever ran later (run one series after the other, every replay
// series was judged against plain_respond measured up to ten minutes
// before it).
func runRounds(cfg config, up *upstream, sw *durabilitySwitch, list []series, run string) ([]result, error) {
	ctx := context.Background()
	var runs []*seriesRun
	defer func() {
		for _, r := range runs {
			r.close()
		}
	}()
	for _, s := range list {
		if err := sw.set(ctx, s.durability); err != nil {
			return nil, fmt.Errorf("bench: %s: durability: %w", s.name, err)
		}
		r := &seriesRun{s: s, run: run}
		runs = append(runs, r)
		if err := r.start(cfg, up); err != nil {
			return nil, fmt.Errorf("bench: %s: %w", s.name, err)
		}
	}
	for rep := range cfg.reps {
		// Every other round runs the series backwards: two series then
		// take turns first (ABBA), which cancels a load that grows or
		// fades steadily over the rounds, and what one series leaves
		// behind (pgbench's inserts to vacuum) falls in turn on the
		// series on either side of it.
		order := slices.Clone(runs)
		if rep%2 == 1 {
			slices.Reverse(order)
		}
		for _, r := range order {
			if err := sw.set(ctx, r.s.durability); err != nil {
				return nil, fmt.Errorf("bench: %s: durability: %w", r.s.name, err)
			}
			if err := r.once(cfg, up, rep); err != nil {
				return nil, fmt.Errorf("bench: %s: %w", r.s.name, err)
			}
		}
		log.Printf("round %d of %d: %d series", rep+1, cfg.reps, len(runs))
	}
	var results []result
	for _, r := range runs {
		m, err := r.finish(cfg)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", r.s.name, err)
		}
		res := m.result(r.s.name)
		res.baseline, res.target = r.s.baseline, r.s.target
		res.profile, res.redis = m.profile, m.redis
		results = append(results, res)
	}
	return results, nil
}

// measured is what the runs of one series found.
type measured struct {
	samples []sample
	peak    int64                    // the server's peak RSS over the measured runs
	ops     map[string]time.Duration // mean ledger time per request, by operation
	profile *profile                 // with -profiles, for fresh and replay series
	redis   *redisLoad               // for fresh series on Redis
	allocs  float64                  // the server's heap allocations per request, over the measured runs
	syncs   float64                  // the file ledger's syncs of its log per request, over the measured runs; -1: no file ledger
}

// result returns the medians of m's runs, named name, with the peak
// memory and the ledger's times they took, and logs them.
func (m measured) result(name string) result {
	r := median(m.samples)
	r.name, r.peakRSS, r.allocs, r.syncs = name, m.peak, m.allocs, m.syncs
	r.reserve, r.complete = m.ops["reserve"], m.ops["complete"]
	log.Printf("%-30s %8.0f req/s  p50 %v  p99 %v  cpu %v/req", r.name, r.rps, r.p50, r.p99, r.cpu)
	return r
}

// measureOn measures one series alone on srv, as the sweep does: its
// warm-up, cfg.reps runs, then what they cost.
func measureOn(cfg config, up *upstream, srv *server, s series, run string) (measured, error) {
	r := &seriesRun{s: s, run: run, srv: srv}
	defer r.closeMasters()
	if err := r.warm(cfg, up); err != nil {
		return measured{}, err
	}
	for rep := range cfg.reps {
		if err := r.once(cfg, up, rep); err != nil {
			return measured{}, err
		}
	}
	return r.finish(cfg)
}

// seriesRun is one series under way: its server (none for pgbench, which
// runs the PostgreSQL ledger's SQL for a fresh request itself, in the
// schema the postgres series' gateway created), the counters its runs are
// measured against, and what they measured so far.
type seriesRun struct {
	s        series
	run      string  // the bench run's id, in the series' keys
	srv      *server // started by start, or given (measureOn)
	own      bool    // srv is the run's to stop
	keys     int
	before   map[string]opTime // the ledger's times after the warm-up
	rtBefore runtimeCounters
	masters  []*master // the Redis masters of a fresh series on Redis
	m        measured
}

// storedJobs reports whether the series replays jobs stored before it
// (the sweep's stored and recent modes): s.keys of them, named after
// s.prefix.
func (s series) storedJobs() bool { return s.mode == "stored" || s.mode == "recent" }

// prefix names the keys of run rep (-1: the warm-up): a replay series
// replays the warm-up's keys; a series of stored jobs, those jobs.
func (r *seriesRun) prefix(rep int) string {
	switch {
	case r.s.mode == "replay":
		return "replay-" + r.run
	case r.s.storedJobs():
		return r.s.prefix
	}
	return fmt.Sprintf("%s-%s-%d", r.s.name, r.run, rep)
}

// keyCount is how many keys the series' requests pick among: the stored
// jobs, or the 64 a replay series' warm-up creates.
func (r *seriesRun) keyCount() int {
	if r.s.storedJobs() {
		return r.s.keys
	}
	return 64
}

// start starts the series' server, then warms it up.
func (r *seriesRun) start(cfg config, up *upstream) error {
	if r.s.mode != "pgbench" {
		srv, err := startServer(cfg, r.s.binary, r.s.name, "", r.s.site)
		if err != nil {
			return err
		}
		r.srv, r.own = srv, true
	}
	return r.warm(cfg, up)
}

// warm runs the unmeasured warm-up (which also creates the replayed keys)
// and reads the counters the measured runs are compared with.
func (r *seriesRun) warm(cfg config, up *upstream) error {
	if r.s.mode == "pgbench" {
		_, err := runPgbench(cfg, cfg.postgres, "bench", cfg.warmup)
		return err
	}
	r.keys = r.keyCount()
	if _, err := drive(cfg, r.srv.url, cfg.warmup, r.s.mode, r.prefix(-1), r.keys); err != nil {
		return err
	}
	// The metrics are read here and in finish, never while a run's Redis
	// stats are taken: a scrape may have the ledger count its jobs, which
	// would show as Redis calls of the run.
	r.before, r.rtBefore = ledgerTimes(r.srv.admin), readRuntime(r.srv.admin)
	if r.s.redis != "" && r.s.mode == "fresh" {
		masters, err := redisMasters(context.Background(), r.s.redis)
		if err != nil {
			return fmt.Errorf("the Redis masters: %v", err)
		}
		r.masters, r.m.redis = masters, &redisLoad{}
	}
	return nil
}

// once takes one measured run, numbered rep.
func (r *seriesRun) once(cfg config, up *upstream, rep int) error {
	if r.s.mode == "pgbench" {
		smp, err := withShares(func() (sample, error) { return runPgbench(cfg, cfg.postgres, "bench", cfg.duration) })
		if err != nil {
			return err
		}
		r.m.samples = append(r.m.samples, smp)
		return nil
	}
	ctx := context.Background()
	var redisBefore []masterStats
	if r.masters != nil {
		var err error
		if redisBefore, err = snapshot(ctx, r.masters); err != nil {
			return err
		}
	}
	start := time.Now()
	hits, cpu := up.sentBy(r.prefix(rep)), r.srv.cpu()
	smp, err := withShares(func() (sample, error) {
		return drive(cfg, r.srv.url, cfg.duration, r.s.mode, r.prefix(rep), r.keys)
	})
	if err != nil {
		return fmt.Errorf("%v\nserver log:\n%s", err, r.srv.output())
	}
	smp.cpu = (r.srv.cpu() - cpu) / time.Duration(smp.requests)
	// What reached the upstream proves the series measured what it says:
	// every fresh request, and no replay.
	switch forwarded := up.sentBy(r.prefix(rep)) - hits; {
	case r.s.mode == "replay" || r.s.storedJobs():
		if forwarded != 0 {
			return fmt.Errorf("%d replays reached the upstream", forwarded)
		}
	default:
		if r.s.site != "" && strings.Contains(r.s.site, "reverse_proxy") && forwarded < smp.requests {
			return fmt.Errorf("%d requests answered, %d reached the upstream", smp.requests, forwarded)
		}
	}
	if r.masters != nil {
		after, err := snapshot(ctx, r.masters)
		if err != nil {
			return err
		}
		r.m.redis.add(r.masters, redisBefore, after, smp.requests, time.Since(start))
	}
	r.m.samples = append(r.m.samples, smp)
	return nil
}

// finish reads what the measured runs cost (the ledger's times, the peak
// memory, the allocations and syncs) and, with -profiles, profiles one
// more run of a fresh or replay series.
func (r *seriesRun) finish(cfg config) (measured, error) {
	m := r.m
	m.syncs = -1
	if r.srv == nil {
		return m, nil
	}
	m.ops = map[string]time.Duration{}
	after, rtAfter := ledgerTimes(r.srv.admin), readRuntime(r.srv.admin)
	for op, a := range after {
		if b := r.before[op]; a.count > b.count {
			m.ops[op] = time.Duration((a.sum - b.sum) / float64(a.count-b.count) * float64(time.Second))
		}
	}
	m.peak = r.srv.peakRSS()
	var requests int64
	for _, smp := range m.samples {
		requests += smp.requests
	}
	if requests > 0 {
		n := float64(requests)
		m.allocs = (rtAfter.mallocs - r.rtBefore.mallocs) / n
		if rtAfter.hasSyncs {
			m.syncs = (rtAfter.syncs - r.rtBefore.syncs) / n
		}
	}
	if cfg.profiles != "" && (r.s.mode == "fresh" || r.s.mode == "replay") && r.s.binary == cfg.gateway {
		// A profile that cannot be taken leaves the measurements as they are.
		var err error
		if m.profile, err = profileSeries(cfg, r.srv, r.s.name, r.s.mode, r.prefix(cfg.reps), r.keys); err != nil {
			log.Printf("bench: %s: profiling: %v", r.s.name, err)
		} else if requests > 0 {
			n := float64(requests)
			m.profile.allocated = (rtAfter.bytes - r.rtBefore.bytes) / n
			m.profile.gcs = 1000 * (rtAfter.gcs - r.rtBefore.gcs) / n
		}
	}
	return m, nil
}

// close stops the server the run started and lets the Redis masters go.
func (r *seriesRun) close() {
	r.closeMasters()
	if r.own && r.srv != nil {
		r.srv.stop()
	}
}

func (r *seriesRun) closeMasters() {
	closeMasters(r.masters)
	r.masters = nil
}

type opTime struct {
	sum   float64
	count int64
}

// ledgerTimes reads caddy_idempotency_ledger_seconds' sums and counts by
// operation from the admin endpoint's metrics (none for plain Caddy).
func ledgerTimes(admin string) map[string]opTime {
	out := map[string]opTime{}
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	re := regexp.MustCompile(`(?m)^caddy_idempotency_ledger_seconds_(sum|count)\{operation="([a-z_]+)"\} (\S+)$`)
	for _, m := range re.FindAllStringSubmatch(string(body), -1) {
		t := out[m[2]]
		v, _ := strconv.ParseFloat(m[3], 64)
		if m[1] == "sum" {
			t.sum = v
		} else {
			t.count = int64(v)
		}
		out[m[2]] = t
	}
	return out
}

// median returns the medians of each measure over the samples.
func median(samples []sample) result {
	pick := func(f func(sample) float64) float64 {
		v := make([]float64, len(samples))
		for i, s := range samples {
			v[i] = f(s)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	return result{
		rps: pick(func(s sample) float64 { return s.rps }),
		p50: time.Duration(pick(func(s sample) float64 { return float64(s.p50) })),
		p99: time.Duration(pick(func(s sample) float64 { return float64(s.p99) })),
		cpu: time.Duration(pick(func(s sample) float64 { return float64(s.cpu) })),

		shares: shares{
			machine:  time.Duration(pick(func(s sample) float64 { return float64(s.machine) })),
			load:     time.Duration(pick(func(s sample) float64 { return float64(s.load) })),
			upstream: time.Duration(pick(func(s sample) float64 { return float64(s.upstream) })),
			busy:     pick(func(s sample) float64 { return s.busy }),
			cores:    samples[0].cores,
		},
	}
}

// printTable prints one row per series with its ratio to its baseline and
// whether it met its target, then how many targets were met.
func printTable(w io.Writer, results []result) {
	byName := map[string]result{}
	for _, r := range results {
		byName[r.name] = r
	}
	var met, missed, unjudged int
	fmt.Fprintf(w, "\n%-30s %8s %8s %8s %9s %8s %7s %6s  %-25s %6s %8s %9s  %s\n",
		"series", "req/s", "p50-ms", "p99-ms", "cpu-us/req", "peak-MiB", "allocs", "syncs", "baseline", "ratio", "+cpu-us", "cpu-ratio", "target")
	for _, r := range results {
		cpu, rss, allocs, syncs := "-", "-", "-", "-"
		if r.cpu > 0 {
			cpu = fmt.Sprintf("%.1f", float64(r.cpu)/float64(time.Microsecond))
		}
		if r.peakRSS > 0 {
			rss = fmt.Sprintf("%.1f", float64(r.peakRSS)/(1<<20))
		}
		if r.allocs > 0 {
			allocs = fmt.Sprintf("%.0f", r.allocs)
		}
		if r.syncs >= 0 {
			syncs = fmt.Sprintf("%.3f", r.syncs)
		}
		ratio, extra, cpuRatio, goal := "", "", "", ""
		b, ok := byName[r.baseline]
		if ok {
			ratio = fmt.Sprintf("%.2fx", r.rps/b.rps)
			if r.cpu > 0 && b.cpu > 0 {
				extra = fmt.Sprintf("%+.1f", float64(r.cpu-b.cpu)/float64(time.Microsecond))
				cpuRatio = fmt.Sprintf("%.2fx", float64(r.cpu)/float64(b.cpu))
			}
		}
		if r.target != (target{}) {
			switch {
			case !ok:
				goal = r.target.String() + " (baseline not run)"
				unjudged++
			case r.target.met(r, b):
				goal = r.target.String() + " met"
				met++
			default:
				goal = r.target.String() + " MISSED"
				missed++
			}
		}
		fmt.Fprintf(w, "%-30s %8.0f %8.2f %8.2f %9s %8s %7s %6s  %-25s %6s %8s %9s  %s\n",
			r.name, r.rps, ms(r.p50), ms(r.p99), cpu, rss, allocs, syncs, r.baseline, ratio, extra, cpuRatio, goal)
	}
	fmt.Fprintf(w, "targets: %d met, %d missed", met, missed)
	if unjudged > 0 {
		fmt.Fprintf(w, ", %d not judged (their baseline was not run)", unjudged)
	}
	fmt.Fprintln(w)
}

// withParam adds a query parameter to a URL-style DSN.
func withParam(dsn, name, value string) string {
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return dsn + sep + name + "=" + value
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// printLedgerTimes shows, for each fresh series, the ledger's share of a
// request's latency: the completion is what an asynchronous completion
// would take off the client's wait.
func printLedgerTimes(w io.Writer, results []result) {
	fmt.Fprintf(w, "\n%-30s %11s %12s %8s  %s\n", "series", "reserve-ms", "complete-ms", "p50-ms", "completion's share of p50")
	for _, r := range results {
		if r.complete == 0 || r.p50 == 0 {
			continue
		}
		fmt.Fprintf(w, "%-30s %11.3f %12.3f %8.2f  %.0f%%\n", r.name, ms(r.reserve), ms(r.complete), ms(r.p50), 100*float64(r.complete)/float64(r.p50))
	}
}
