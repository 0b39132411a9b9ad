package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// services locates the throwaway servers integration/services.sh started;
// run.sh exports these variables.
type services struct {
	Work      string // services.sh's $WORK: pg/ and redis/ live there
	PGBin     string
	PGUser    string // the OS user PostgreSQL runs as, when we are root
	RedisPort string
	Postgres  string // DSN
	Redis     string // URL
	Cluster   string // the Redis Cluster's URL: its three masters
}

func servicesFromEnv() services {
	return services{
		Work:      os.Getenv("WORK"),
		PGBin:     os.Getenv("PGBIN"),
		PGUser:    os.Getenv("PGUSER_OS"),
		RedisPort: os.Getenv("REDISPORT"),
		Postgres:  os.Getenv("ONEJOB_TEST_POSTGRES"),
		Redis:     os.Getenv("ONEJOB_TEST_REDIS"),
		Cluster:   os.Getenv("ONEJOB_TEST_REDIS_CLUSTER"),
	}
}

// canRestart reports why the ledger's server cannot be restarted, if so.
func (s services) canRestart(ledger string) error {
	missing := []string{}
	if s.Work == "" {
		missing = append(missing, "WORK")
	}
	switch ledger {
	case "postgres":
		if s.PGBin == "" {
			missing = append(missing, "PGBIN")
		}
	case "redis":
		if s.RedisPort == "" {
			missing = append(missing, "REDISPORT")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("restarting %s needs %s from integration/services.sh: run ./integration/chaos/run.sh (or pass -restarts 0)",
			ledger, strings.Join(missing, ", "))
	}
	return nil
}

// faults injects the run's faults: process faults (SIGKILLed gateway
// instances and restarts of the ledger's server, or on a cluster masters
// killed and slots migrated (cluster.go), one at a time) and, on their own
// schedule, ledger-link faults (links.go).
type faults struct {
	fleet   fleet
	links   []*ledgerLink
	ledger  string
	svc     services
	cluster *cluster // the ledger's cluster, on redis-cluster
	out     *os.File // output of the commands run, and a line per fault

	mu            sync.Mutex
	kills         []killEvent
	restarts      []restartEvent
	clusterEvents []clusterEvent
	events        []string
}

// killEvent is a gateway instance killed with SIGKILL, and when it was
// running again.
type killEvent struct {
	Gateway  int
	At, Back time.Time
}

// restartEvent is a restart of the ledger's server: from the moment it was
// told to stop until it answered again.
type restartEvent struct {
	At, End time.Time
	Crash   bool
}

func (f *faults) logf(format string, args ...any) {
	line := time.Now().Format("15:04:05.000") + " " + fmt.Sprintf(format, args...)
	f.mu.Lock()
	f.events = append(f.events, line)
	f.mu.Unlock()
	fmt.Fprintln(f.out, line)
}

// Process faults, in a plan.
const (
	faultKill        = "kill"         // a gateway instance killed with SIGKILL
	faultRestart     = "restart"      // the ledger's server restarted
	faultMasterKill  = "master kill"  // a cluster master killed with SIGKILL
	faultMigrateSlot = "migrate slot" // a cluster slot migrated
)

// processPlan interleaves n[0] faults of kinds[0], n[1] of kinds[1], and
// so on: one of each kind in turn while any is left.
func processPlan(kinds []string, n []int) []string {
	var plan []string
	for i := 0; ; i++ {
		added := false
		for k, kind := range kinds {
			if i < n[k] {
				plan = append(plan, kind)
				added = true
			}
		}
		if !added {
			return plan
		}
	}
}

// run spreads the plan's process faults evenly over the middle of a load
// of length d, one at a time. However it ends, every instance is running
// again when it returns (or the error says why not).
func (f *faults) run(ctx context.Context, d time.Duration, plan []string) error {
	start := time.Now()
	var err error
	for i, what := range plan {
		at := time.Duration(float64(d) * (0.15 + 0.7*(float64(i)+0.5)/float64(len(plan))))
		if !sleep(ctx, time.Until(start.Add(at))) {
			break
		}
		switch what {
		case faultKill:
			err = f.killOne(ctx)
		case faultRestart:
			// Every second restart is a crash: no shutdown work at all.
			err = f.restartLedger(ctx, len(f.restarts)%2 == 1)
		case faultMasterKill:
			err = f.killMaster(ctx)
		case faultMigrateSlot:
			err = f.migrateSlot(ctx)
		}
		if err != nil {
			break
		}
	}
	// Whatever happened, the fleet ends whole.
	for _, g := range f.fleet {
		if !g.running() {
			if serr := g.start(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}
	return err
}

// killOne kills a random instance with SIGKILL and starts it again 1–3 s
// later, on the same ports and config.
func (f *faults) killOne(ctx context.Context) error {
	g := f.fleet[rand.IntN(len(f.fleet))]
	at := time.Now()
	g.kill()
	f.mu.Lock()
	f.kills = append(f.kills, killEvent{Gateway: g.n, At: at})
	k := len(f.kills) - 1
	f.mu.Unlock()
	down := randDuration(time.Second, 3*time.Second)
	f.logf("killed gateway %d (SIGKILL), restarting in %s", g.n, down.Round(time.Millisecond))
	sleep(ctx, down)
	// A start can fail while the ledger restarts, or while an outgoing
	// connection holds the port as its local end: try a few times.
	var err error
	for try := 0; try < 5; try++ {
		if try > 0 {
			time.Sleep(time.Second)
		}
		if err = g.start(); err == nil {
			f.mu.Lock()
			f.kills[k].Back = time.Now()
			f.mu.Unlock()
			f.logf("gateway %d running again", g.n)
			return nil
		}
	}
	return err
}

// restartLedger restarts PostgreSQL (pg_ctl restart -m fast, or -m
// immediate for a crash) or Redis (SIGTERM, or SIGKILL for a crash, then a
// new redis-server on the same port and data).
func (f *faults) restartLedger(ctx context.Context, crash bool) error {
	how := "restarting"
	if crash {
		how = "crashing and restarting"
	}
	f.logf("%s %s", how, f.ledger)
	t := time.Now()
	var err error
	switch f.ledger {
	case "postgres":
		mode := "fast"
		if crash {
			mode = "immediate" // no checkpoint: the next start replays the WAL
		}
		err = f.restartPostgres(ctx, mode)
	case "redis":
		sig := syscall.SIGTERM
		if crash {
			sig = syscall.SIGKILL // the append-only file, fsync'ed per write, must hold everything
		}
		err = f.restartRedis(ctx, sig)
	}
	if err != nil {
		return fmt.Errorf("restarting %s: %w", f.ledger, err)
	}
	f.mu.Lock()
	f.restarts = append(f.restarts, restartEvent{At: t, End: time.Now(), Crash: crash})
	f.mu.Unlock()
	f.logf("%s restarted in %s", f.ledger, time.Since(t).Round(time.Millisecond))
	return nil
}

// asPG runs a PostgreSQL tool as the user services.sh runs the server as.
func (f *faults) asPG(ctx context.Context, tool string, args ...string) *exec.Cmd {
	path := filepath.Join(f.svc.PGBin, tool)
	var cmd *exec.Cmd
	if f.svc.PGUser != "" {
		cmd = exec.CommandContext(ctx, "runuser", append([]string{"-u", f.svc.PGUser, "--", path}, args...)...)
	} else {
		cmd = exec.CommandContext(ctx, path, args...)
	}
	// A file, not a pipe: the restarted server inherits these descriptors.
	cmd.Stdout, cmd.Stderr = f.out, f.out
	return cmd
}

func (f *faults) restartPostgres(ctx context.Context, mode string) error {
	dir := filepath.Join(f.svc.Work, "pg")
	cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	return f.asPG(cctx, "pg_ctl", "-D", dir, "-l", filepath.Join(dir, "server.log"), "-m", mode, "-w", "-t", "60", "restart").Run()
}

// redisArgs are services.sh's redis-server arguments, with the append-only
// file on: a restart must not lose an acknowledged reservation.
func (f *faults) redisArgs() []string {
	dir := filepath.Join(f.svc.Work, "redis")
	return []string{"--port", f.svc.RedisPort, "--bind", "127.0.0.1", "--save", "",
		"--appendonly", "yes", "--appendfsync", "always",
		"--dir", dir, "--daemonize", "yes", "--pidfile", filepath.Join(f.svc.Work, "redis.pid"),
		"--logfile", filepath.Join(dir, "redis.log")}
}

func (f *faults) restartRedis(ctx context.Context, sig syscall.Signal) error {
	pidPath := filepath.Join(f.svc.Work, "redis.pid")
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%s: %w", pidPath, err)
	}
	t := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		return err
	}
	for deadline := time.Now().Add(30 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server %d did not stop in 30s", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Fprintf(f.out, "redis-server %d stopped (%s) in %s\n", pid, sig, time.Since(t).Round(time.Millisecond))
	cmd := exec.CommandContext(ctx, "redis-server", f.redisArgs()...)
	cmd.Stdout, cmd.Stderr = f.out, f.out
	if err := cmd.Run(); err != nil {
		return err
	}
	return waitRedis(ctx, f.svc.Redis)
}

// alive reports whether a process runs: it exists and is no zombie (the
// daemonized server is not our child, and whoever reaps it may be slow).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] != 'Z' && s[i+2] != 'X'
}

// waitRedis waits until Redis answers PING (it refuses while loading).
func waitRedis(ctx context.Context, url string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	c := redis.NewClient(opt)
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis did not come back: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// redisDurable turns on the append-only file with an fsync per write in the
// running server, as docs/ledgers.md asks of a Redis ledger, and waits until the
// first rewrite is done.
func redisDurable(ctx context.Context, url string) error {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return err
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.ConfigSet(ctx, "appendfsync", "always").Err(); err != nil {
		return err
	}
	if err := c.ConfigSet(ctx, "appendonly", "yes").Err(); err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		info, err := c.Info(ctx, "persistence").Result()
		if err != nil {
			return err
		}
		if strings.Contains(info, "aof_enabled:1") && strings.Contains(info, "aof_rewrite_in_progress:0") &&
			strings.Contains(info, "aof_rewrite_scheduled:0") {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.New("redis: the append-only file was not ready in 30s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// processFaults returns the kills, ledger restarts and cluster faults so
// far.
func (f *faults) processFaults() ([]killEvent, []restartEvent, []clusterEvent) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.kills), slices.Clone(f.restarts), slices.Clone(f.clusterEvents)
}
