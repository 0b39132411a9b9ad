//go:build integration

package redis

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/pubsub"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// clusterURL returns the test cluster's URL (integration/services.sh starts
// it); under the integration tag a missing address is a failure.
func clusterURL(t *testing.T) string {
	t.Helper()
	u := os.Getenv("ONEJOB_TEST_REDIS_CLUSTER")
	if u == "" {
		t.Fatal("ONEJOB_TEST_REDIS_CLUSTER is not set: run the tests under integration/services.sh, which starts a Redis Cluster")
	}
	return u
}

// clusterAdmin returns a cluster client of the test cluster, with
// go-redis's defaults, closed at cleanup.
func clusterAdmin(t *testing.T) *redis.ClusterClient {
	t.Helper()
	o, err := redis.ParseClusterURL(clusterURL(t))
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// newClusterPrefix returns a key prefix no other test uses; its keys are
// deleted from every master at cleanup.
func newClusterPrefix(t *testing.T) string {
	prefix := "onejob-test:" + ledger.NewID() + ":"
	c := clusterAdmin(t)
	t.Cleanup(func() {
		ctx := context.Background()
		err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			iter := n.Scan(ctx, 0, prefix+"*", 1000).Iterator()
			for iter.Next(ctx) {
				// Through the cluster client: the node may no longer
				// serve the key's slot (a test moved it).
				if err := c.Del(ctx, iter.Val()).Err(); err != nil {
					return err
				}
			}
			return iter.Err()
		})
		if err != nil {
			t.Errorf("clean up %s: %v", prefix, err)
		}
	})
	return prefix
}

func openCluster(t *testing.T, url, prefix string, opts Options) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts.Prefix = prefix
	if opts.Replicas > 0 {
		replicasOnline(t, url)
	}
	l, err := Open(ctx, url, opts)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if l.cluster == nil || len(l.buckets) != clusterBuckets {
		t.Fatalf("Open(%s) did not open a cluster ledger", url)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

var clusterHarness = ledgertest.Harness{
	New: func(t *testing.T) ledger.Ledger {
		return openCluster(t, clusterURL(t), newClusterPrefix(t), Options{})
	},
	Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
		return openCluster(t, clusterURL(t), l.(*Ledger).Prefix(), Options{})
	},
}

func TestClusterConformance(t *testing.T) { ledgertest.Run(t, clusterHarness) }

// A purge on a cluster reaches every instance through the sharded
// channel of each bucket it removed jobs from.
func TestClusterPurge(t *testing.T) { ledgertest.RunPurge(t, clusterHarness) }

func TestClusterCounts(t *testing.T) {
	ledgertest.RunCounts(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			return openCluster(t, clusterURL(t), newClusterPrefix(t), Options{})
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return openCluster(t, clusterURL(t), l.(*Ledger).Prefix(), Options{})
		},
	})
}

// TestClusterLayout: the cluster agrees with slot() on the buckets' keys,
// the buckets divide evenly among the three masters, and a cluster named
// by one of its nodes, without addr=, is found out (INFO cluster).
func TestClusterLayout(t *testing.T) {
	ctx := context.Background()
	c := clusterAdmin(t)
	perMaster := map[string]int{}
	for _, bp := range newBuckets("onejob:", clusterBuckets) {
		for _, k := range []string{idxKey(bp), jobKey(bp, ledger.NewID())} {
			want, err := c.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := slot(k); got != int(want) {
				t.Errorf("slot(%q) = %d, the cluster says %d", k, got, want)
			}
		}
		n, err := c.MasterForKey(ctx, idxKey(bp))
		if err != nil {
			t.Fatal(err)
		}
		perMaster[n.Options().Addr]++
	}
	if len(perMaster) != 3 {
		t.Errorf("buckets per master = %v, want three masters", perMaster)
	}
	for addr, n := range perMaster {
		if n < clusterBuckets/3-1 || n > clusterBuckets/3+1 {
			t.Errorf("master %s holds %d of %d buckets", addr, n, clusterBuckets)
		}
	}
	one, _, _ := strings.Cut(clusterURL(t), "?")
	l := openCluster(t, one, newClusterPrefix(t), Options{})
	if _, err := l.Reserve(ctx, params("o", "k")); err != nil {
		t.Fatal(err)
	}
}

// nodeDropper puts a replyDropper in front of each node a cluster client
// dials, all armed at once. The client may dial a node it learns of at any
// time (a replica, to read the slots): the proxies are closed together,
// after the ledgers opened after newNodeDropper are.
type nodeDropper struct {
	t  *testing.T
	mu sync.Mutex
	by map[string]*replyDropper
}

func newNodeDropper(t *testing.T) *nodeDropper {
	d := &nodeDropper{t: t, by: map[string]*replyDropper{}}
	t.Cleanup(func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		for _, p := range d.by {
			p.close()
		}
	})
	return d
}

func (d *nodeDropper) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	d.mu.Lock()
	p := d.by[addr]
	if p == nil {
		p = startReplyDropper(d.t, addr)
		d.by[addr] = p
	}
	d.mu.Unlock()
	var nd net.Dialer
	return nd.DialContext(ctx, network, p.addr())
}

func (d *nodeDropper) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.by {
		p.armed.Store(true)
	}
}

func (d *nodeDropper) disarm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, p := range d.by {
		p.armed.Store(false)
	}
}

// TestClusterNeverResends loses a script's reply on the way back from a
// master. The ledger's own sending runs it once and reports the error. A
// script sent plainly by the same client (MaxRetries -1) runs twice: the
// cluster client re-sends after a network error within its redirect loop,
// which is why the ledger sends scripts as onceCmd.
func TestClusterNeverResends(t *testing.T) {
	ctx := context.Background()
	d := newNodeDropper(t)
	prefix := newClusterPrefix(t)
	l := openCluster(t, clusterURL(t), prefix, Options{dial: d.dial})
	admin := clusterAdmin(t)
	incr := newScriptFrom("return redis.call('INCR', KEYS[1])")
	key := prefix + "{t}once"
	if err := l.eval(ctx, incr, []string{prefix + "{t}warm-up"}).Err(); err != nil {
		t.Fatal(err)
	}
	d.arm()
	err := l.eval(ctx, incr, []string{key}).Err()
	d.disarm()
	if err == nil {
		t.Fatal("a lost reply was not reported")
	}
	if n, _ := admin.Get(ctx, key).Result(); n != "1" {
		t.Errorf("the ledger ran the script %s times, want once", n)
	}
	plain := prefix + "{t}plain"
	d.arm()
	err = incr.Run(ctx, l.Client(), []string{plain}).Err()
	d.disarm()
	if n, _ := admin.Get(ctx, plain).Result(); n != "2" {
		t.Errorf("a plain EVALSHA on the cluster client ran %s times (err %v); the proxy should make the client re-send it", n, err)
	}
}

// TestClusterCompleteReplyLost: as TestCompleteReplyLost, on the cluster.
func TestClusterCompleteReplyLost(t *testing.T) {
	ctx := context.Background()
	d := newNodeDropper(t)
	l := openCluster(t, clusterURL(t), newClusterPrefix(t), Options{dial: d.dial})
	r, err := l.Reserve(ctx, params("o", "k"))
	if err != nil {
		t.Fatal(err)
	}
	resp := ledger.Response{Status: 201, Body: []byte("paid"), Size: 4, Stored: true}
	d.arm()
	_, err = l.Complete(ctx, r.Attempt.Ref(), resp)
	d.disarm()
	if err == nil {
		t.Fatal("Complete with its reply lost reported no error")
	}
	c, err := l.Complete(ctx, r.Attempt.Ref(), resp)
	if err != nil || !c.Won || c.Job.Version != r.Job.Version+1 || string(c.Job.Response.Body) != "paid" {
		t.Fatalf("repeated completion: %+v %v, want won once", c, err)
	}
}

// newScriptFrom returns a script as the ledger's are.
func newScriptFrom(src string) script {
	return script{Script: redis.NewScript(src), src: src}
}

// moveSlot migrates slot s, with its keys, to the master at dst, as
// redis-cli --cluster reshard does: IMPORTING and MIGRATING, MIGRATE of
// every key, then SETSLOT NODE on every master.
func moveSlot(t *testing.T, c *redis.ClusterClient, s int, dst string) {
	t.Helper()
	ctx := context.Background()
	masters := map[string]*redis.Client{}
	ids := map[string]string{}
	err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		id, err := n.Do(ctx, "cluster", "myid").Text()
		if err != nil {
			return err
		}
		addr := n.Options().Addr
		// ForEachMaster runs fn side by side.
		func() {
			migrateMu.Lock()
			defer migrateMu.Unlock()
			masters[addr], ids[addr] = n, id
		}()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var src string
	ranges, err := masters[dst].ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if r.Start <= s && s <= r.End {
			src = r.Nodes[0].Addr
		}
	}
	if masters[src] == nil || masters[dst] == nil {
		t.Fatalf("slot %d: source %q, destination %q among %v", s, src, dst, ids)
	}
	if src == dst {
		return
	}
	from, to := masters[src], masters[dst]
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("moving slot %d from %s to %s: %v", s, src, dst, err)
		}
	}
	must(to.Do(ctx, "cluster", "setslot", s, "importing", ids[src]).Err())
	must(from.Do(ctx, "cluster", "setslot", s, "migrating", ids[dst]).Err())
	host, port, _ := net.SplitHostPort(dst)
	for {
		keys, err := from.ClusterGetKeysInSlot(ctx, s, 100).Result()
		must(err)
		if len(keys) == 0 {
			break
		}
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		must(from.Do(ctx, args...).Err())
	}
	for _, n := range masters {
		must(n.Do(ctx, "cluster", "setslot", s, "node", ids[dst]).Err())
	}
}

var migrateMu sync.Mutex

// slotOwner returns the address of the master that serves slot s, as the
// cluster says (CLUSTER SLOTS), not as a client remembers it.
func slotOwner(t *testing.T, c *redis.ClusterClient, s int) string {
	t.Helper()
	ranges, err := c.ClusterSlots(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if r.Start <= s && s <= r.End {
			return r.Nodes[0].Addr
		}
	}
	t.Fatalf("no master serves slot %d", s)
	return ""
}

// TestClusterSlotMigration moves the slot of a job's bucket to another
// master under a ledger whose client still knows the old one: its
// transitions follow MOVED and act once, a waiter on the job (whose shard
// channel the old master drops) is woken by a peer's completion, and the
// job lists and reads by id as before. The slot moves back at the end. It
// runs with the cluster client's redirects, and with Replicas 1, whose
// scripts go to the job's master by its node's client and follow the
// redirects themselves (ack.go).
func TestClusterSlotMigration(t *testing.T) {
	t.Run("plain", func(t *testing.T) { slotMigration(t, Options{}) })
	t.Run("replicas", func(t *testing.T) { slotMigration(t, Options{Replicas: 1}) })
}

func slotMigration(t *testing.T, opts Options) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := newClusterPrefix(t)
	l := openCluster(t, clusterURL(t), prefix, opts)
	peer := openCluster(t, clusterURL(t), prefix, Options{})
	admin := clusterAdmin(t)
	p := params("o", "migrating")
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	bp := l.identBucket(identity(p.OwnerHash, p.KeyHash))
	s := slot(bp)
	home := slotOwner(t, admin, s)
	var other string
	if err := admin.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		migrateMu.Lock()
		defer migrateMu.Unlock()
		if a := n.Options().Addr; a != home {
			other = a
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	got := make(chan *ledger.Job, 1)
	go func() {
		j, err := l.Wait(ctx, r.Job.ID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		got <- j
	}()
	// Let the waiter subscribe, then move the slot under it.
	for deadline := time.Now().Add(10 * time.Second); !l.ListenerUp(); {
		if time.Now().After(deadline) {
			t.Fatal("the listener never subscribed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	moveSlot(t, admin, s, other)
	t.Cleanup(func() { moveSlot(t, admin, s, home) })

	hn := ledger.NewAttempt("hedge", time.Minute)
	h, err := l.Hedge(ctx, r.Attempt.Ref(), hn)
	if err != nil || h.Number != 2 {
		t.Fatalf("hedge after the move: %+v %v", h, err)
	}
	if h2, err := l.Hedge(ctx, r.Attempt.Ref(), hn); err != nil || h2.Number != 2 {
		t.Fatalf("repeated hedge after the move: %+v %v", h2, err)
	}
	if _, err := peer.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("moved"), Size: 5, Stored: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobCompleted {
			t.Fatalf("waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("the waiter was not woken after the slot moved")
	}
	if d, err := l.Reserve(ctx, again(p)); err != nil || d.Outcome != ledger.Done || string(d.Job.Response.Body) != "moved" {
		t.Fatalf("replay after the move: %v %v", d.Outcome, err)
	}
	fresh := openCluster(t, clusterURL(t), prefix, Options{})
	if j, err := fresh.Job(ctx, r.Job.ID); err != nil || len(j.Attempts) != 2 {
		t.Fatalf("read by id after the move: %+v %v", j, err)
	}
	if page, err := fresh.Jobs(ctx, ledger.JobQuery{}); err != nil || len(page.Jobs) != 1 {
		t.Fatalf("listing after the move: %+v %v", page, err)
	}
	if n, err := admin.Exists(ctx, jobKey(bp, r.Job.ID)).Result(); err != nil || n != 1 {
		t.Fatalf("the job's key after the move: %d %v", n, err)
	}
	ranges, err := admin.ClusterSlots(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range ranges {
		if r.Start <= s && s <= r.End && r.Nodes[0].Addr != other {
			t.Errorf("slot %d is served by %s after the move, want %s", s, r.Nodes[0].Addr, other)
		}
	}
}

// TestClusterCheckDurability: the test cluster runs without the
// append-only file, each master with a replica: the check names each
// master with both.
func TestClusterCheckDurability(t *testing.T) {
	l := openCluster(t, clusterURL(t), newClusterPrefix(t), Options{})
	warns := l.CheckDurability(context.Background())
	aof, replicas := map[string]bool{}, map[string]bool{}
	for _, w := range warns {
		t.Log(w)
		addr, _, ok := strings.Cut(strings.TrimPrefix(w, "redis ledger: master "), ": ")
		if !ok {
			continue
		}
		if strings.Contains(w, "appendonly") {
			aof[addr] = true
		}
		if strings.Contains(w, "connected replica") {
			replicas[addr] = true
		}
	}
	if len(aof) != 3 || len(replicas) != 3 {
		t.Errorf("warnings name %d masters without appendonly and %d with replicas, want 3 and 3: %q", len(aof), len(replicas), warns)
	}
}

// failover makes the replica of the master at addr take its place
// (CLUSTER FAILOVER, which waits for the replica to catch up: nothing is
// lost), and waits until the replica serves as master and the old master
// serves as its replica. It returns the new master's address.
func failover(t *testing.T, c *redis.ClusterClient, addr string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	master := redis.NewClient(&redis.Options{Addr: addr})
	defer master.Close()
	id, err := master.Do(ctx, "cluster", "myid").Text()
	if err != nil {
		t.Fatal(err)
	}
	// A master that just took over gets its replica (the old master) a
	// moment later.
	raddr := ""
	for raddr == "" {
		nodes, err := master.ClusterNodes(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(nodes, "\n") {
			if f := strings.Fields(line); len(f) > 3 && strings.Contains(f[2], "slave") && f[3] == id {
				raddr, _, _ = strings.Cut(f[1], "@")
			}
		}
		if raddr == "" && ctx.Err() != nil {
			t.Fatalf("%s (%s) has no replica:\n%s", addr, id, nodes)
		}
		time.Sleep(20 * time.Millisecond)
	}
	replica := redis.NewClient(&redis.Options{Addr: raddr})
	defer replica.Close()
	// A replica that is still syncing with its master (the old master of
	// a failover just now) refuses to take over, or takes long.
	for {
		info, err := replica.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") && strings.Contains(info, "master_sync_in_progress:0") {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("the replica %s of %s never synced", raddr, addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The handover is over once the old master knows it too: until then
	// it holds writes back (a manual failover pauses them for up to five
	// seconds), and a ledger that still sends it hers would time out
	// rather than be redirected. A manual failover that does not finish in
	// those five seconds is given up by the servers (the cluster may not
	// grant a failover of the same slots again so soon after the last, as
	// under go test -count): it is asked for again.
	role := func(c *redis.Client, want string) bool {
		info, err := c.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "role:"+want)
	}
	for {
		if !role(replica, "master") {
			if err := replica.Do(ctx, "cluster", "failover").Err(); err != nil && ctx.Err() == nil {
				t.Fatal(err)
			}
		}
		for asked := time.Now(); time.Since(asked) < 6*time.Second; time.Sleep(20 * time.Millisecond) {
			if role(replica, "master") && role(master, "slave") {
				return raddr
			}
			if ctx.Err() != nil {
				t.Fatalf("%s never took over from %s", raddr, addr)
			}
		}
	}
}

// TestClusterFailover: the master of a job's bucket hands over to its
// replica under a ledger that still knows the old master. The ledger's
// transitions follow the redirect and act once, a waiter on the job is
// woken by a peer's completion, and a replay reads the answer.
func TestClusterFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	prefix := newClusterPrefix(t)
	l := openCluster(t, clusterURL(t), prefix, Options{})
	peer := openCluster(t, clusterURL(t), prefix, Options{})
	admin := clusterAdmin(t)
	p := params("o", "failover")
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	bp := l.identBucket(identity(p.OwnerHash, p.KeyHash))
	home := slotOwner(t, admin, slot(bp))
	got := make(chan *ledger.Job, 1)
	go func() {
		j, err := l.Wait(ctx, r.Job.ID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		got <- j
	}()
	for deadline := time.Now().Add(10 * time.Second); !l.ListenerUp(); {
		if time.Now().After(deadline) {
			t.Fatal("the listener never subscribed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The cluster stays failed over: a failover back at once is not
	// reliably taken up by the old master (it may stay a master without
	// slots for a while), and the servers are the test run's own.
	failover(t, admin, home)

	hn := ledger.NewAttempt("hedge", time.Minute)
	if h, err := l.Hedge(ctx, r.Attempt.Ref(), hn); err != nil || h.Number != 2 {
		t.Fatalf("hedge after the failover: %+v %v", h, err)
	}
	if _, err := peer.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("failed over"), Size: 11, Stored: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobCompleted {
			t.Fatalf("waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("the waiter was not woken after the failover")
	}
	j, err := l.Job(ctx, r.Job.ID)
	if err != nil || len(j.Attempts) != 2 || j.State != ledger.JobCompleted {
		t.Fatalf("job after the failover: %+v %v", j, err)
	}
	if d, err := peer.Reserve(ctx, again(p)); err != nil || d.Outcome != ledger.Done || string(d.Job.Response.Body) != "failed over" {
		t.Fatalf("replay after the failover: %v %v", d.Outcome, err)
	}
}

// TestClusterSubscribesOnMasters: a cluster client whose slot map is out
// of date (as it is just after a failover, until it reads the slots again)
// takes a replica for the master of a channel's slot. A replica accepts a
// shard subscription silently, but a master that has not yet learned of
// that replica does not forward its publications to it, so waiters slept
// through completions. The session must refuse to confirm on a node that
// is not the slot's master, and end so that the next one looks again.
func TestClusterSubscribesOnMasters(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ranges := replicatedSlots(ctx, t)
	o, err := redis.ParseClusterURL(clusterURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// Every range names a replica first: the client takes it for the master.
	o.ClusterSlots = func(context.Context) ([]redis.ClusterSlot, error) {
		swapped := make([]redis.ClusterSlot, len(ranges))
		for i, r := range ranges {
			if len(r.Nodes) < 2 {
				return nil, fmt.Errorf("slots %d-%d have no replica", r.Start, r.End)
			}
			nodes := append([]redis.ClusterNode{r.Nodes[1], r.Nodes[0]}, r.Nodes[2:]...)
			swapped[i] = redis.ClusterSlot{Start: r.Start, End: r.End, Nodes: nodes}
		}
		return swapped, nil
	}
	stale := redis.NewClusterClient(o)
	defer stale.Close()
	channel := channelOf(newClusterPrefix(t) + "{j1}")
	ready := make(chan struct{})
	ended := make(chan error, 1)
	go func() {
		ended <- pubsub.Sharded(stale, []string{channel})(ctx, func() { close(ready) }, func(string) {})
	}()
	select {
	case <-ready:
		t.Fatalf("the session confirmed %s on a replica", channel)
	case err := <-ended:
		if err == nil || !strings.Contains(err.Error(), "MOVED") {
			t.Fatalf("the session on a replica ended with %v, want the replica's redirect", err)
		}
	}
}

// replicatedSlots returns the cluster's slot ranges once each lists a
// replica: after a failover (an earlier test's) the old master is listed
// as the new one's replica only a moment after the roles swapped.
func replicatedSlots(ctx context.Context, t *testing.T) []redis.ClusterSlot {
	t.Helper()
	admin := clusterAdmin(t)
	for {
		ranges, err := admin.ClusterSlots(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		whole := true
		for _, r := range ranges {
			whole = whole && len(r.Nodes) > 1
		}
		if whole {
			return ranges
		}
		select {
		case <-ctx.Done():
			t.Fatalf("a slot range still has no replica: %+v", ranges)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// TestClusterSpread reserves and completes many jobs of random keys and
// checks that each master holds about a third of them (the jobs' keys) and
// runs about a third of the scripts (EVALSHA calls, INFO commandstats); it
// logs both, per master.
func TestClusterSpread(t *testing.T) {
	ctx := context.Background()
	prefix := newClusterPrefix(t)
	l := openCluster(t, clusterURL(t), prefix, Options{})
	admin := clusterAdmin(t)
	evalsha := func() map[string]int {
		m := map[string]int{}
		if err := admin.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			info, err := n.Info(ctx, "commandstats").Result()
			if err != nil {
				return err
			}
			calls := 0
			for _, line := range strings.Split(info, "\n") {
				if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_evalsha:calls="); ok {
					calls, _ = strconv.Atoi(strings.SplitN(rest, ",", 2)[0])
				}
			}
			migrateMu.Lock()
			defer migrateMu.Unlock()
			m[n.Options().Addr] = calls
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return m
	}
	before := evalsha()
	const jobs = 1200
	var wg sync.WaitGroup
	errs := make(chan error, jobs)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < jobs; i += 8 {
				r, err := l.Reserve(ctx, params("owner", ledger.NewID()))
				if err == nil {
					_, err = l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true})
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	after := evalsha()
	keys := map[string]int{}
	if err := admin.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		count := 0
		iter := n.Scan(ctx, 0, prefix+"*j:*", 1000).Iterator()
		for iter.Next(ctx) {
			count++
		}
		migrateMu.Lock()
		defer migrateMu.Unlock()
		keys[n.Options().Addr] = count
		return iter.Err()
	}); err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range keys {
		total += n
	}
	if total != jobs || len(keys) != 3 {
		t.Fatalf("jobs per master %v: %d in all, want %d over 3 masters", keys, total, jobs)
	}
	for addr, n := range keys {
		calls := after[addr] - before[addr]
		t.Logf("master %s: %d jobs (%.1f%%), %d scripts run", addr, n, 100*float64(n)/jobs, calls)
		if n < jobs/4 || n > jobs*42/100 {
			t.Errorf("master %s holds %d of %d jobs: the buckets do not spread", addr, n, jobs)
		}
		if calls < jobs*2/4 || calls > jobs*2*42/100 {
			t.Errorf("master %s ran %d of about %d scripts", addr, calls, 2*jobs)
		}
	}
}
