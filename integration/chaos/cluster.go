package main

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// The faults of a run on Redis Cluster, in place of restarting the ledger's
// server: a master killed with SIGKILL, which its replica replaces, then
// started again (it rejoins as a replica of the new master); and one slot
// that holds jobs migrated from its master to another under load. Both
// wait until the cluster is whole again: three masters, each with its
// replica in sync, every slot served, no slot half moved.
//
// The gateways reach the cluster's nodes directly, not through fault
// proxies: a cluster client learns the nodes' addresses from the cluster
// itself (CLUSTER SLOTS), so a proxy per node and per instance would need
// the nodes to announce other addresses to each instance. A run on the
// cluster has no link faults.

// Layout of the ledger's keys on a cluster (ledger/redis/layout.go): 64
// buckets, a job in the bucket of its identity (CRC-32 of "<hex owner
// hash>:<hex key hash>" modulo 64), each bucket's hash tag chosen to hash
// to the middle slot of its 1/64 of the slots.
const (
	clusterBuckets = 64
	clusterSlots   = 16384
)

// bucketSlot returns the slot of the bucket of job ident (owner and key
// hashes in hex, as the admin API shows them).
func bucketSlot(ownerHash, keyHash string) int {
	b := int(crc32.ChecksumIEEE([]byte(ownerHash+":"+keyHash)) % clusterBuckets)
	width := clusterSlots / clusterBuckets
	return b*width + width/2
}

// clusterEvent is a fault on the cluster: a master killed (At) and its
// replica promoted (Promoted), until the cluster was whole again (End); or
// a slot migrated from At to End.
type clusterEvent struct {
	Kind     string // clusterKill or clusterMigration
	At, End  time.Time
	Promoted time.Time
	Node     string   // the killed master, or the slot's old master
	To       string   // the promoted replica, or the slot's new master
	Slots    [][2]int // the slots the node served when the fault began
	Keys     int      // keys migrated
	Jobs     []string // ids of the jobs whose keys were migrated
}

const (
	clusterKill      = "master killed"
	clusterMigration = "slot migrated"
)

// holds reports whether slot was among the event's slots.
func (e clusterEvent) holds(slot int) bool {
	for _, r := range e.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

func (e clusterEvent) String() string {
	switch e.Kind {
	case clusterKill:
		return fmt.Sprintf("master %s (slots %s) killed at %s, %s promoted after %s, whole again after %s",
			e.Node, slotRanges(e.Slots), e.At.Format("15:04:05.000"), e.To,
			e.Promoted.Sub(e.At).Round(time.Millisecond), e.End.Sub(e.At).Round(time.Millisecond))
	default:
		return fmt.Sprintf("slot %d migrated from %s to %s at %s in %s (%d keys of %d jobs)",
			e.Slots[0][0], e.Node, e.To, e.At.Format("15:04:05.000"), e.End.Sub(e.At).Round(time.Millisecond), e.Keys, len(e.Jobs))
	}
}

func slotRanges(rs [][2]int) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		if r[0] == r[1] {
			parts[i] = strconv.Itoa(r[0])
		} else {
			parts[i] = fmt.Sprintf("%d-%d", r[0], r[1])
		}
	}
	return strings.Join(parts, ",")
}

// cluster is the Redis Cluster integration/services.sh started: a node per
// directory $WORK/cluster/<port>/, holding its redis.conf and pid file.
type cluster struct {
	dir   string
	ports []string
	fsync bool // nodes run with appendonly yes and appendfsync always
}

func findCluster(work string) (*cluster, error) {
	dir := filepath.Join(work, "cluster")
	confs, _ := filepath.Glob(filepath.Join(dir, "*", "redis.conf"))
	if len(confs) == 0 {
		return nil, fmt.Errorf("no cluster node in %s: run ./integration/chaos/run.sh", dir)
	}
	c := &cluster{dir: dir}
	for _, conf := range confs {
		c.ports = append(c.ports, filepath.Base(filepath.Dir(conf)))
	}
	sort.Strings(c.ports)
	return c, nil
}

func nodeClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, DialTimeout: time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 2 * time.Second, MaxRetries: -1, PoolSize: 1})
}

func (c *cluster) addr(port string) string { return "127.0.0.1:" + port }

// clusterNode is a line of CLUSTER NODES.
type clusterNode struct {
	ID, Addr string
	Master   bool
	MasterID string
	Failing  bool     // flagged fail or fail?
	Moving   bool     // a slot of it is being imported or migrated
	Slots    [][2]int // served, for a master
}

// nodes returns the cluster as the node at addr sees it.
func nodes(ctx context.Context, addr string) ([]clusterNode, error) {
	cl := nodeClient(addr)
	defer cl.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	out, err := cl.ClusterNodes(cctx).Result()
	if err != nil {
		return nil, err
	}
	var ns []clusterNode
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		n := clusterNode{ID: f[0], Addr: strings.SplitN(f[1], "@", 2)[0], MasterID: f[3]}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.Master = true
			case "fail", "fail?":
				n.Failing = true
			}
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				n.Moving = true
				continue
			}
			lo, hi, _ := strings.Cut(s, "-")
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if hi == "" {
				b, err2 = a, nil
			}
			if err1 == nil && err2 == nil {
				n.Slots = append(n.Slots, [2]int{a, b})
			}
		}
		ns = append(ns, n)
	}
	return ns, nil
}

// view returns the cluster as the first node that answers sees it,
// skipping the node at skip.
func (c *cluster) view(ctx context.Context, skip string) ([]clusterNode, error) {
	var err error
	for _, p := range c.ports {
		if c.addr(p) == skip {
			continue
		}
		var ns []clusterNode
		if ns, err = nodes(ctx, c.addr(p)); err == nil {
			return ns, nil
		}
	}
	return nil, fmt.Errorf("no cluster node answers: %w", err)
}

// masterOf returns the master serving slot in the view ns.
func masterOf(ns []clusterNode, slot int) *clusterNode {
	for i := range ns {
		if ns[i].Master && !ns[i].Failing && (clusterEvent{Slots: ns[i].Slots}).holds(slot) {
			return &ns[i]
		}
	}
	return nil
}

// whole returns why the cluster is not whole, or "" when it is: every node
// answers and says cluster_state:ok, sees three masters serving slots and
// three replicas, none failing and no slot moving; every master has a
// replica online and every replica's link to its master is up.
func (c *cluster) whole(ctx context.Context) string {
	for _, p := range c.ports {
		addr := c.addr(p)
		cl := nodeClient(addr)
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := cl.ClusterInfo(cctx).Result()
		var repl string
		if err == nil {
			repl, err = cl.Info(cctx, "replication").Result()
		}
		cancel()
		cl.Close()
		if err != nil {
			return fmt.Sprintf("%s: %v", addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return addr + ": cluster_state not ok"
		}
		switch {
		case strings.Contains(repl, "role:master"):
			if !strings.Contains(repl, "connected_slaves:1") || !strings.Contains(repl, "state=online") {
				return addr + ": a master without a replica online"
			}
		case !strings.Contains(repl, "master_link_status:up") || !strings.Contains(repl, "master_sync_in_progress:0"):
			return addr + ": a replica not in sync"
		}
		ns, err := nodes(ctx, addr)
		if err != nil {
			return fmt.Sprintf("%s: %v", addr, err)
		}
		masters, replicas := 0, 0
		for _, n := range ns {
			switch {
			case n.Failing:
				return fmt.Sprintf("%s sees %s failing", addr, n.Addr)
			case n.Moving:
				return fmt.Sprintf("%s sees a slot of %s moving", addr, n.Addr)
			case n.Master && len(n.Slots) > 0:
				masters++
			case !n.Master:
				replicas++
			}
		}
		if masters != 3 || replicas != 3 {
			return fmt.Sprintf("%s sees %d masters and %d replicas", addr, masters, replicas)
		}
	}
	return ""
}

// waitWhole waits until the cluster is whole, for limit at most.
func (c *cluster) waitWhole(ctx context.Context, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		why := c.whole(ctx)
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the cluster is not whole after %s: %s", limit, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// durable turns on the append-only file with an fsync per write on every
// node, as docs/ledgers.md asks of every node of a cluster; a node started
// again after a kill gets the same settings (startNode).
func (c *cluster) durable(ctx context.Context) error {
	for _, p := range c.ports {
		if err := redisDurable(ctx, "redis://"+c.addr(p)); err != nil {
			return fmt.Errorf("node %s: %w", c.addr(p), err)
		}
	}
	c.fsync = true
	return nil
}

// startNode starts the node on port again, from its redis.conf.
func (c *cluster) startNode(ctx context.Context, port string, out *os.File) error {
	args := []string{filepath.Join(c.dir, port, "redis.conf")}
	if c.fsync {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	}
	cmd := exec.CommandContext(ctx, "redis-server", args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return err
	}
	return waitRedis(ctx, "redis://"+c.addr(port))
}

// killMaster kills a random master with SIGKILL, waits until the other
// nodes promoted its replica in its place (a replica starts an election
// once the master is unreachable for cluster-node-timeout, 2 s in
// services.sh), then starts the killed node again: it rejoins as a
// replica of the promoted one and copies its data. Started before the
// promotion, the node (whose data died with it unless it had its
// append-only file) would take its slots back empty.
func (f *faults) killMaster(ctx context.Context) error {
	// Once begun, the fault runs to its end even if the load ends first.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	c := f.cluster
	ns, err := c.view(ctx, "")
	if err != nil {
		return err
	}
	var masters []clusterNode
	for _, n := range ns {
		if n.Master && len(n.Slots) > 0 {
			masters = append(masters, n)
		}
	}
	if len(masters) == 0 {
		return errors.New("no master to kill")
	}
	m := masters[rand.IntN(len(masters))]
	port := strings.TrimPrefix(m.Addr, "127.0.0.1:")
	if !slices.Contains(c.ports, port) {
		return fmt.Errorf("master %s is no node of %s", m.Addr, c.dir)
	}
	pidPath := filepath.Join(c.dir, port, "redis.pid")
	b, err := os.ReadFile(pidPath)
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%s: %w", pidPath, err)
	}
	ev := clusterEvent{Kind: clusterKill, At: time.Now(), Node: m.Addr, Slots: m.Slots}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return err
	}
	f.logf("killed master %s (SIGKILL), serving slots %s", m.Addr, slotRanges(m.Slots))
	for deadline := time.Now().Add(10 * time.Second); alive(pid); {
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server %d did not die", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The promotion: another master serves the killed one's first slot.
	for deadline := time.Now().Add(30 * time.Second); ; {
		if ns, err := c.view(ctx, m.Addr); err == nil {
			if n := masterOf(ns, m.Slots[0][0]); n != nil && n.ID != m.ID {
				ev.Promoted, ev.To = time.Now(), n.Addr
				break
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no replica of %s was promoted in 30s", m.Addr)
		}
		time.Sleep(50 * time.Millisecond)
	}
	f.logf("replica %s promoted in place of %s after %s", ev.To, m.Addr, ev.Promoted.Sub(ev.At).Round(time.Millisecond))
	if err := c.startNode(ctx, port, f.out); err != nil {
		return fmt.Errorf("starting %s again: %w", m.Addr, err)
	}
	if err := c.waitWhole(ctx, 60*time.Second); err != nil {
		return err
	}
	ev.End = time.Now()
	f.addCluster(ev)
	f.logf("%s running again as a replica; the cluster is whole after %s", m.Addr, ev.End.Sub(ev.At).Round(time.Millisecond))
	return nil
}

// migrateSlot moves one slot that holds jobs (a bucket's, picked at
// random among those with keys) from its master to another, as
// redis-cli --cluster reshard does: the target IMPORTING, the source
// MIGRATING, MIGRATE of its keys a hundred at a time, then the slot
// assigned to the target on every master. Meanwhile the source answers
// ASK for keys it no longer has, and TRYAGAIN to a script whose keys are
// split between the two.
func (f *faults) migrateSlot(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	c := f.cluster
	ns, err := c.view(ctx, "")
	if err != nil {
		return err
	}
	type candidate struct {
		slot int
		from *clusterNode
		keys int64
	}
	var cands []candidate
	width := clusterSlots / clusterBuckets
	for b := range clusterBuckets {
		slot := b*width + width/2
		m := masterOf(ns, slot)
		if m == nil {
			return fmt.Errorf("no master serves slot %d", slot)
		}
		cl := nodeClient(m.Addr)
		n, err := cl.ClusterCountKeysInSlot(ctx, slot).Result()
		cl.Close()
		if err != nil {
			return err
		}
		if n > 0 {
			cands = append(cands, candidate{slot, m, n})
		}
	}
	if len(cands) == 0 {
		f.logf("no bucket's slot holds keys yet: no slot migrated")
		return nil
	}
	pick := cands[rand.IntN(len(cands))]
	var targets []clusterNode
	for _, n := range ns {
		if n.Master && len(n.Slots) > 0 && n.ID != pick.from.ID {
			targets = append(targets, n)
		}
	}
	to := targets[rand.IntN(len(targets))]
	ev := clusterEvent{Kind: clusterMigration, At: time.Now(), Node: pick.from.Addr, To: to.Addr,
		Slots: [][2]int{{pick.slot, pick.slot}}}
	f.logf("migrating slot %d (%d keys) from %s to %s", pick.slot, pick.keys, pick.from.Addr, to.Addr)
	src, dst := nodeClient(pick.from.Addr), nodeClient(to.Addr)
	defer src.Close()
	defer dst.Close()
	if err := dst.Do(ctx, "cluster", "setslot", pick.slot, "importing", pick.from.ID).Err(); err != nil {
		return fmt.Errorf("IMPORTING on %s: %w", to.Addr, err)
	}
	if err := src.Do(ctx, "cluster", "setslot", pick.slot, "migrating", to.ID).Err(); err != nil {
		return fmt.Errorf("MIGRATING on %s: %w", pick.from.Addr, err)
	}
	host, port, _ := strings.Cut(to.Addr, ":")
	jobs := map[string]bool{}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, pick.slot, 100).Result()
		if err != nil {
			return err
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
			if _, id, ok := strings.Cut(k, "}j:"); ok {
				jobs[id] = true
			}
		}
		if err := src.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("MIGRATE of %d keys of slot %d: %w", len(keys), pick.slot, err)
		}
		ev.Keys += len(keys)
	}
	// The target first, so that it serves the slot before the source
	// sends MOVED there; then the source and the other masters.
	order := []*redis.Client{dst, src}
	for _, n := range ns {
		if n.Master && len(n.Slots) > 0 && n.ID != to.ID && n.ID != pick.from.ID {
			cl := nodeClient(n.Addr)
			defer cl.Close()
			order = append(order, cl)
		}
	}
	for _, cl := range order {
		if err := cl.Do(ctx, "cluster", "setslot", pick.slot, "node", to.ID).Err(); err != nil {
			return fmt.Errorf("SETSLOT NODE on %s: %w", cl.Options().Addr, err)
		}
	}
	for id := range jobs {
		ev.Jobs = append(ev.Jobs, id)
	}
	sort.Strings(ev.Jobs)
	if err := c.waitWhole(ctx, 60*time.Second); err != nil {
		return err
	}
	ev.End = time.Now()
	f.addCluster(ev)
	f.logf("slot %d now on %s: %d keys of %d jobs moved in %s", pick.slot, to.Addr, ev.Keys, len(ev.Jobs), ev.End.Sub(ev.At).Round(time.Millisecond))
	return nil
}

func (f *faults) addCluster(e clusterEvent) {
	f.mu.Lock()
	f.clusterEvents = append(f.clusterEvents, e)
	f.mu.Unlock()
}
