package main

import (
	"context"
	"fmt"
	"io"
	neturl "net/url"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// master is one Redis master under a series: the single server, or one
// master of a cluster.
type master struct {
	addr  string
	slots int // hash slots it serves; 0 for a single server
	c     *redis.Client
}

// masterStats is what a master has done so far, from DBSIZE, INFO
// commandstats and INFO cpu.
type masterStats struct {
	keys    int64
	scripts int64 // calls of EVALSHA, EVAL, FCALL and their _RO forms
	// Calls of the other data commands by name: Redis counts the commands
	// a script runs as calls too, so most of them are the scripts' own.
	// The bench's and the clients' own (INFO, CLUSTER, PING, ...) are left
	// out.
	calls map[string]int64
	cpu   time.Duration // the main thread's CPU time (user + system), where commands run
}

// other is the number of calls of data commands other than scripts.
func (s masterStats) other() int64 {
	var n int64
	for _, c := range s.calls {
		n += c
	}
	return n
}

// redisMasters returns the masters behind a ledger's Redis URL: the
// server it names or, when that server is a cluster node, every master
// the cluster lists, with its slots.
func redisMasters(ctx context.Context, url string) ([]*master, error) {
	o, err := redisOptions(url)
	if err != nil {
		return nil, err
	}
	nodes, err := clusterNodes(ctx, o)
	if err != nil {
		return nil, err
	}
	if nodes == nil {
		return []*master{{addr: o.Addr, c: redis.NewClient(o)}}, nil
	}
	var out []*master
	for _, n := range nodes {
		if !strings.Contains(n.flags, "master") {
			continue
		}
		mo := *o
		mo.Addr = n.addr
		out = append(out, &master{addr: n.addr, slots: n.slots, c: redis.NewClient(&mo)})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("CLUSTER NODES lists no master")
	}
	return out, nil
}

// redisOptions returns the options of the server a ledger's Redis URL
// names. A cluster URL names its first node as the URL's host, the others
// as addr= parameters; the first is enough to find them all.
func redisOptions(url string) (*redis.Options, error) {
	u, err := neturl.Parse(url)
	if err != nil {
		return nil, fmt.Errorf("invalid Redis URL")
	}
	o := &redis.Options{Addr: u.Host}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	return o, nil
}

// clusterNode is one node of a Redis Cluster, as CLUSTER NODES lists it.
type clusterNode struct {
	addr  string
	flags string // myself, master, slave, ...
	slots int    // hash slots it serves (none for a replica)
}

// clusterNodes returns the nodes of the cluster the server at o belongs
// to, but those CLUSTER NODES flags as failing; none when it is a single
// server.
func clusterNodes(ctx context.Context, o *redis.Options) ([]clusterNode, error) {
	c := redis.NewClient(o)
	defer c.Close()
	nodes, err := c.ClusterNodes(ctx).Result()
	if err != nil {
		if strings.Contains(err.Error(), "cluster support disabled") {
			return nil, nil
		}
		return nil, err
	}
	var out []clusterNode
	for _, line := range strings.Split(nodes, "\n") {
		// <id> <ip:port@cport> <flags> <master> <ping-sent> <pong-recv> <epoch> <link-state> <slot> ...
		f := strings.Fields(line)
		if len(f) < 8 || strings.Contains(f[2], "fail") {
			continue
		}
		n := clusterNode{addr: strings.SplitN(f[1], "@", 2)[0], flags: f[2]}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") { // a slot being imported or migrated
				continue
			}
			lo, hi, _ := strings.Cut(r, "-")
			a, _ := strconv.Atoi(lo)
			b := a
			if hi != "" {
				b, _ = strconv.Atoi(hi)
			}
			n.slots += b - a + 1
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("CLUSTER NODES lists no node")
	}
	return out, nil
}

func closeMasters(ms []*master) {
	for _, m := range ms {
		m.c.Close()
	}
}

// ownCommands are the commands that say nothing of the jobs: the bench's
// own questions and the clients' connection and topology upkeep.
var ownCommands = map[string]bool{
	"info": true, "dbsize": true, "cluster": true, "ping": true, "hello": true,
	"client": true, "command": true, "select": true, "auth": true, "script": true, "readonly": true,
}

func (m *master) stats(ctx context.Context) (masterStats, error) {
	s := masterStats{calls: map[string]int64{}}
	var err error
	if s.keys, err = m.c.DBSize(ctx).Result(); err != nil {
		return s, err
	}
	info, err := m.c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return s, err
	}
	var user, sys float64
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			// cmdstat_evalsha:calls=12,usec=...
			name, fields, _ := strings.Cut(rest, ":")
			calls := int64(0)
			for _, kv := range strings.Split(fields, ",") {
				if v, ok := strings.CutPrefix(kv, "calls="); ok {
					calls, _ = strconv.ParseInt(v, 10, 64)
				}
			}
			switch name {
			case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro":
				s.scripts += calls
			default:
				if !ownCommands[strings.SplitN(name, "|", 2)[0]] {
					s.calls[name] += calls
				}
			}
			continue
		}
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "used_cpu_user_main_thread":
			user, _ = strconv.ParseFloat(v, 64)
		case "used_cpu_sys_main_thread":
			sys, _ = strconv.ParseFloat(v, 64)
		}
	}
	s.cpu = time.Duration((user + sys) * float64(time.Second))
	return s, nil
}

// snapshot returns every master's stats now.
func snapshot(ctx context.Context, ms []*master) ([]masterStats, error) {
	out := make([]masterStats, len(ms))
	for i, m := range ms {
		s, err := m.stats(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", m.addr, err)
		}
		out[i] = s
	}
	return out, nil
}

// redisLoad is what a series' measured runs cost each master: the sums,
// over its runs, of the differences between the stats after and before
// each run (other series run between them, on the same servers).
type redisLoad struct {
	requests int64         // answered in the measured runs
	wall     time.Duration // the measured runs' length, added up
	masters  []masterLoad
}

type masterLoad struct {
	addr  string
	slots int
	masterStats
}

// add adds one run's cost to l: what it answered, how long it took, and
// on each master the stats after it less the stats before it.
func (l *redisLoad) add(ms []*master, before, after []masterStats, requests int64, wall time.Duration) {
	if l.masters == nil {
		for _, m := range ms {
			l.masters = append(l.masters, masterLoad{addr: m.addr, slots: m.slots, masterStats: masterStats{calls: map[string]int64{}}})
		}
	}
	l.requests += requests
	l.wall += wall
	for i := range ms {
		a, b, d := after[i], before[i], &l.masters[i]
		d.keys += a.keys - b.keys
		d.scripts += a.scripts - b.scripts
		d.cpu += a.cpu - b.cpu
		for name, n := range a.calls {
			if n > b.calls[name] {
				d.calls[name] += n - b.calls[name]
			}
		}
	}
}

// ceiling is the fresh requests/s at which the busiest master's main
// thread would be busy all the time, each master on a core of its own at
// the CPU per request it spent here, and the CPU per request all masters
// spent together.
func (l *redisLoad) ceiling() (rps float64, total time.Duration) {
	var busiest time.Duration
	for _, m := range l.masters {
		total += m.cpu
		busiest = max(busiest, m.cpu)
	}
	if busiest == 0 || l.requests == 0 {
		return 0, 0
	}
	return float64(l.requests) / busiest.Seconds(), total / time.Duration(l.requests)
}

// printRedisLoad prints the load of each Redis series' measured fresh runs
// on each master, then what the masters would carry with a machine each.
func printRedisLoad(w io.Writer, results []result) {
	var loaded []result
	for _, r := range results {
		if r.redis != nil {
			loaded = append(loaded, r)
		}
	}
	if len(loaded) == 0 {
		return
	}
	pct := func(a, b int64) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
	}
	fmt.Fprintf(w, "\nRedis under the measured fresh runs, by master (what the runs added, and the main thread's CPU):\n")
	fmt.Fprintf(w, "%-30s %-16s %6s %8s %6s %8s %6s %9s %11s %8s %7s %6s %11s\n",
		"series", "master", "slots", "keys", "share", "scripts", "share", "scripts/s", "scripts/req", "cmds/req", "cpu-s", "busy", "cpu-us/req")
	for _, r := range loaded {
		l := r.redis
		all := masterStats{calls: map[string]int64{}}
		for _, m := range l.masters {
			all.keys += m.keys
			all.scripts += m.scripts
			all.cpu += m.cpu
			for name, n := range m.calls {
				all.calls[name] += n
			}
		}
		perReq := func(n int64) float64 { return float64(n) / float64(l.requests) }
		row := func(name, addr, slots string, m masterStats) {
			fmt.Fprintf(w, "%-30s %-16s %6s %8d %6s %8d %6s %9.0f %11.2f %8.2f %7.2f %5.0f%% %11.1f\n",
				name, addr, slots, m.keys, pct(m.keys, all.keys), m.scripts, pct(m.scripts, all.scripts),
				float64(m.scripts)/l.wall.Seconds(), perReq(m.scripts), perReq(m.other()),
				m.cpu.Seconds(), 100*m.cpu.Seconds()/l.wall.Seconds(), float64(m.cpu.Microseconds())/float64(l.requests))
		}
		for i, m := range l.masters {
			name, slots := "", "-"
			if i == 0 {
				name = r.name
			}
			if m.slots > 0 {
				slots = strconv.Itoa(m.slots)
			}
			row(name, m.addr, slots, m.masterStats)
		}
		if len(l.masters) > 1 {
			row("", "all masters", "", all)
		}
		names := make([]string, 0, len(all.calls))
		for name := range all.calls {
			names = append(names, name)
		}
		sort.Slice(names, func(i, j int) bool { return all.calls[names[i]] > all.calls[names[j]] })
		var top []string
		for _, name := range names[:min(len(names), 8)] {
			top = append(top, fmt.Sprintf("%s %.2f", name, perReq(all.calls[name])))
		}
		fmt.Fprintf(w, "%-30s   commands per request: %s\n", "", strings.Join(top, ", "))
	}
	fmt.Fprintf(w, "(requests answered in the measured runs: %s; cmds/req: calls of commands other than scripts, the scripts' own included, as Redis counts them; busy: the main thread's CPU over the runs' wall time)\n",
		requestCounts(loaded))
	// A cluster's series is compared with the single server's row before
	// it: the series list keeps each cluster series after the single
	// server's of the same durability.
	var one float64
	for _, r := range loaded {
		rps, total := r.redis.ceiling()
		if rps == 0 {
			continue
		}
		n := len(r.redis.masters)
		if n == 1 {
			one = rps
			fmt.Fprintf(w, "%s: one server with a core to itself would carry about %.0f fresh requests/s (%.1f us of its main thread per request)\n",
				r.name, rps, float64(total.Nanoseconds())/1e3)
			continue
		}
		fmt.Fprintf(w, "%s: %d masters, each with a machine to itself, would carry about %.0f fresh requests/s, when the busiest master's main thread is busy all the time (%.1f us of main-thread CPU per request over all masters)",
			r.name, n, rps, float64(total.Nanoseconds())/1e3)
		if one > 0 {
			fmt.Fprintf(w, "; %d x one server would be %.0f: %.2f of it", n, float64(n)*one, rps/(float64(n)*one))
		}
		fmt.Fprintln(w)
	}
}

func requestCounts(rs []result) string {
	var out []string
	for _, r := range rs {
		out = append(out, fmt.Sprintf("%s %d", r.name, r.redis.requests))
	}
	return strings.Join(out, ", ")
}
