package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// These tests run the cluster's keyspace (clusterBuckets buckets, each its
// own hash tag) on miniredis, which is no cluster: a hook checks what a
// cluster would refuse, that every script and every MULTI names keys of
// one slot.

// slotChecker fails the test when a script or a MULTI names keys in more
// than one slot, or a script names none (a cluster client would send it
// to any node).
type slotChecker struct {
	t       *testing.T
	mu      sync.Mutex
	scripts int
}

func (h *slotChecker) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *slotChecker) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.checkScript(cmd)
		return next(ctx, cmd)
	}
}

func (h *slotChecker) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		tx := len(cmds) > 0 && cmds[0].Name() == "multi"
		var keys []string
		for _, c := range cmds {
			h.checkScript(c)
			switch c.Name() {
			case "multi", "exec", "time":
			default:
				if tx {
					keys = append(keys, fmt.Sprint(c.Args()[1]))
				}
			}
		}
		h.sameSlot("MULTI", keys)
		return next(ctx, cmds)
	}
}

func (h *slotChecker) checkScript(cmd redis.Cmder) {
	if n := cmd.Name(); n != "evalsha" && n != "eval" {
		return
	}
	a := cmd.Args()
	nk, _ := strconv.Atoi(fmt.Sprint(a[2]))
	if nk == 0 {
		h.t.Errorf("a script named no key: %v", a[:3])
		return
	}
	keys := make([]string, nk)
	for i := range keys {
		keys[i] = fmt.Sprint(a[3+i])
	}
	h.mu.Lock()
	h.scripts++
	h.mu.Unlock()
	h.sameSlot("script", keys)
}

func (h *slotChecker) sameSlot(what string, keys []string) {
	for _, k := range keys {
		if !strings.Contains(k, "{") {
			h.t.Errorf("%s key %q has no hash tag", what, k)
		}
		if slot(k) != slot(keys[0]) {
			h.t.Errorf("%s crosses slots: %q and %q", what, keys[0], k)
			return
		}
	}
}

func openBucketed(t *testing.T, m *miniredis.Miniredis, prefix string, h *slotChecker) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Open(ctx, "redis://"+m.Addr()+"/0", Options{Prefix: prefix, buckets: clusterBuckets})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	l.Client().AddHook(h)
	t.Cleanup(func() { l.Close() })
	return l
}

// TestBucketedConformance runs the conformance suite on the cluster's
// keyspace, each script and MULTI checked to stay in one slot.
func TestBucketedConformance(t *testing.T) {
	m := miniredis.RunT(t)
	h := &slotChecker{t: t}
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			return openBucketed(t, m, "b:"+ledger.NewID()+":", h)
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return openBucketed(t, m, l.(*Ledger).Prefix(), h)
		},
	})
	if h.scripts == 0 {
		t.Error("the hook saw no script")
	}
}

// TestBucketTags pins the cluster keyspace: the slot function agrees with
// Redis's (on known keys here; TestClusterKeySlot asks a real cluster), each bucket's tag hashes to the middle of its share of the
// slots, and the tags and the bucket of an identity never change (they
// name stored keys).
func TestBucketTags(t *testing.T) {
	for key, want := range map[string]int{"foo": 12182, "123456789": 12739, "x{foo}y": 12182, "a": 15495, "{a}b": 15495, "{}a": slot("{}a")} {
		if got := slot(key); got != want {
			t.Errorf("slot(%q) = %d, want %d", key, got, want)
		}
	}
	tags := bucketTags()
	width := clusterSlots / clusterBuckets
	for i, tag := range tags {
		if got := slot(tag); got != i*width+width/2 {
			t.Errorf("bucket %d: tag %q in slot %d, want %d", i, tag, got, i*width+width/2)
		}
	}
	if tags[0] != "j18958" || tags[1] != "j25108" || tags[63] != "j13121" {
		t.Errorf("tags changed: %q %q ... %q", tags[0], tags[1], tags[63])
	}
	l := &Ledger{buckets: newBuckets("p:", clusterBuckets)}
	if b := l.bucketOf(identity([]byte("o"), []byte("k"))); b != 35 {
		t.Errorf("bucket of (o, k) = %d, want 35", b)
	}
	if l.buckets[35] != "p:{"+tags[35]+"}" {
		t.Errorf("bucket prefix %q", l.buckets[35])
	}
}

// TestSingleServerKeyspace pins the keys on a single server: those of
// every earlier release, so that a ledger they wrote reads on, and
// gateways of both releases can share it during an upgrade.
func TestSingleServerKeyspace(t *testing.T) {
	ctx := context.Background()
	m := newMini(t)
	l := openMini(t, m, "ks:")
	p := params("o", "k")
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil {
		t.Fatal(err)
	}
	id, ident := r.Job.ID, "6f:6b" // hex of "o" and "k"
	want := []string{"ks:a:" + id, "ks:expiry", "ks:idx", "ks:j:" + id, "ks:k:" + ident}
	if got := m.Keys(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("keys = %q, want %q", got, want)
	}
	if v, _ := m.Get("ks:k:" + ident); v != id {
		t.Errorf("identity key names %q", v)
	}
	if ms, _ := m.ZMembers("ks:expiry"); len(ms) != 1 || ms[0] != id+"|"+ident {
		t.Errorf("expiry = %q", ms)
	}
	// A job written under these keys by hand, as an earlier release wrote
	// it, is found, read and replayed.
	m.HSet("ks:j:"+"01890a5d-ac96-7ab2-80e2-4536629c90de", "id", "01890a5d-ac96-7ab2-80e2-4536629c90de",
		"owner", "o", "key", "old", "ident", "6f:6f6c64", "fp", "f", "fpv", "1", "fps", "", "state", "completed",
		"ver", "2", "by", "a1", "ret", "3600000000", "created", "1700000000000000", "done", "1700000000000001",
		"exp", "9999999999000000", "n", "1", "status", "201", "hdr", "{}", "body", "old answer", "size", "10", "stored", "1")
	m.HSet("ks:a:01890a5d-ac96-7ab2-80e2-4536629c90de", "1:id", "a1", "1:p", "p", "1:s", "succeeded", "1:v", "1",
		"1:t0", "1700000000000000", "1:dl", "1700000060000000", "1:t1", "1700000000000001", "1:e", "")
	m.Set("ks:k:6f:6f6c64", "01890a5d-ac96-7ab2-80e2-4536629c90de")
	if _, err := m.ZAdd("ks:idx", 0, "01890a5d-ac96-7ab2-80e2-4536629c90de"); err != nil {
		t.Fatal(err)
	}
	d, err := l.Reserve(ctx, params("o", "old"))
	if err != nil || d.Outcome != ledger.Done || string(d.Job.Response.Body) != "old answer" || d.Job.Response.Status != 201 {
		t.Fatalf("replay of an earlier release's job: %v %+v %v", d.Outcome, d.Job, err)
	}
	if j, err := l.Job(ctx, "01890a5d-ac96-7ab2-80e2-4536629c90de"); err != nil || j.State != ledger.JobCompleted {
		t.Errorf("read by id: %+v %v", j, err)
	}
	if page, err := l.Jobs(ctx, ledger.JobQuery{}); err != nil || len(page.Jobs) != 2 {
		t.Errorf("listing: %+v %v", page, err)
	}
}

// TestBucketedWalk lists many jobs spread over the buckets page by page,
// newest first, and reads each by id from a peer that never saw them.
func TestBucketedWalk(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	h := &slotChecker{t: t}
	l := openBucketed(t, m, "walk:", h)
	peer := openBucketed(t, m, "walk:", h)
	var ids []string
	for i := range 150 {
		r, err := l.Reserve(ctx, params("o", strconv.Itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.Job.ID)
		time.Sleep(50 * time.Microsecond) // ids of distinct milliseconds now and then
	}
	buckets := map[string]bool{}
	for _, k := range m.Keys() {
		if strings.HasSuffix(k, "idx") {
			buckets[k] = true
		}
	}
	if len(buckets) < clusterBuckets/2 {
		t.Errorf("150 jobs landed in %d buckets", len(buckets))
	}
	for _, limit := range []int{1, 13, 149, 500} {
		var got []string
		cursor := ""
		for pages := 0; ; pages++ {
			page, err := peer.Jobs(ctx, ledger.JobQuery{Limit: limit, Before: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, j := range page.Jobs {
				got = append(got, j.ID)
			}
			if page.Next == "" || pages > 400 {
				break
			}
			cursor = page.Next
		}
		if len(got) != len(ids) {
			t.Fatalf("limit %d: listed %d jobs, want %d", limit, len(got), len(ids))
		}
		for i := range got {
			if got[i] != ids[len(ids)-1-i] {
				t.Fatalf("limit %d: job %d is %s, want %s (newest first)", limit, i, got[i], ids[len(ids)-1-i])
			}
		}
	}
	for _, id := range ids[:20] {
		if j, err := peer.Job(ctx, id); err != nil || j.ID != id {
			t.Errorf("peer read of %s: %v", id, err)
		}
	}
	if _, err := peer.Job(ctx, ledger.NewID()); err != ledger.ErrNotFound {
		t.Errorf("unknown id: %v", err)
	}
}
