//go:build integration

package redis

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// url returns the test server's address; under the integration tag a
// missing address is a failure, never a skip.
func url(t *testing.T) string {
	t.Helper()
	u := os.Getenv("ONEJOB_TEST_REDIS")
	if u == "" {
		t.Fatal("ONEJOB_TEST_REDIS is not set: start a redis-server and set it to its URL, e.g. redis://127.0.0.1:6390/0")
	}
	return u
}

// newPrefix returns a key prefix no other test uses; its keys are deleted
// at cleanup.
func newPrefix(t *testing.T) string {
	prefix := "onejob-test:" + ledger.NewID() + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		o, err := redis.ParseURL(url(t))
		if err != nil {
			t.Error(err)
			return
		}
		c := redis.NewClient(o)
		defer c.Close()
		iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("clean up %s: %v", prefix, err)
			return
		}
		if len(keys) > 0 {
			if err := c.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("clean up %s: %v", prefix, err)
			}
		}
	})
	return prefix
}

func open(t *testing.T, prefix string) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Open(ctx, url(t), Options{Prefix: prefix})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestRedisConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger { return open(t, newPrefix(t)) },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return open(t, l.(*Ledger).Prefix())
		},
	})
}

// countingHook counts round trips: one per command, one per pipeline.
type countingHook struct {
	mu   sync.Mutex
	n    int
	cmds []string
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.n++
		h.cmds = append(h.cmds, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.n++
		h.cmds = append(h.cmds, "pipeline")
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (h *countingHook) take() (int, []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, cmds := h.n, h.cmds
	h.n, h.cmds = 0, nil
	return n, cmds
}

// TestRoundTrips counts the commands and pipelines each call sends, once
// the connections are set up (go-redis keeps one pool for commands and one
// for pipelines, and says HELLO on each new connection).
func TestRoundTrips(t *testing.T) {
	l := open(t, newPrefix(t))
	ledgertest.KeepsReplays(t, l.replays)
	h := &countingHook{}
	l.Client().AddHook(h)
	ctx := context.Background()
	p := ledger.ReserveParams{
		JobID: ledger.NewID(), OwnerHash: []byte("owner"), KeyHash: []byte("warm-up"), Fingerprint: []byte("fp"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{ID: ledger.NewID(), Provider: "p", Lease: time.Minute},
	}
	w, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Job(ctx, w.Job.ID); err != nil {
		t.Fatal(err)
	}
	h.take()

	p.KeyHash = []byte("key")
	r, err := l.Reserve(ctx, again(p))
	if err != nil || r.Outcome != ledger.Created {
		t.Fatalf("fresh reserve: %v %v", r.Outcome, err)
	}
	if n, cmds := h.take(); n != 1 {
		t.Errorf("fresh reserve took %d round trips %v, want 1", n, cmds)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil {
		t.Fatal(err)
	}
	if n, cmds := h.take(); n != 1 {
		t.Errorf("complete took %d round trips %v, want 1", n, cmds)
	}
	if r, err := l.Reserve(ctx, again(p)); err != nil || r.Outcome != ledger.Done || string(r.Job.Response.Body) != "x" {
		t.Fatalf("replay reserve: %v %v", r.Outcome, err)
	}
	if n, cmds := h.take(); n != 1 {
		t.Errorf("replay reserve took %d round trips %v, want 1", n, cmds)
	}
	// Later replays are answered from the process; another request under
	// the key is refused from there too.
	if r, err := l.Reserve(ctx, again(p)); err != nil || r.Outcome != ledger.Done || string(r.Job.Response.Body) != "x" {
		t.Fatalf("second replay reserve: %v %v", r.Outcome, err)
	}
	other := p
	other.Fingerprint = []byte("another request")
	if r, err := l.Reserve(ctx, again(other)); err != nil || r.Outcome != ledger.Mismatch {
		t.Fatalf("another request under the key: %v %v", r.Outcome, err)
	}
	if n, cmds := h.take(); n != 0 {
		t.Errorf("second replay and mismatch took %d round trips %v, want 0", n, cmds)
	}
	if _, err := l.Job(ctx, r.Job.ID); err != nil {
		t.Fatal(err)
	}
	if n, cmds := h.take(); n != 1 {
		t.Errorf("job read took %d round trips %v, want 1", n, cmds)
	}
}

// TestPubSubReconnects kills the pub/sub connection while a waiter waits:
// the listener subscribes again on a new connection, wakes its waiters, and
// the waiter still sees the completion a peer made meanwhile.
func TestPubSubReconnects(t *testing.T) {
	prefix := newPrefix(t)
	l := open(t, prefix)
	peer := open(t, prefix)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := ledger.ReserveParams{
		JobID: ledger.NewID(), OwnerHash: []byte("owner"), KeyHash: []byte("key"), Fingerprint: []byte("fp"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{ID: ledger.NewID(), Provider: "p", Lease: time.Minute},
	}
	r, err := l.Reserve(ctx, p)
	if err != nil {
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
	// Wait until the listener is subscribed, then kill its connection.
	var killed int64
	for killed == 0 {
		if ctx.Err() != nil {
			t.Fatal("listener never subscribed")
		}
		killed, err = peer.Client().ClientKillByFilter(ctx, "TYPE", "pubsub").Result()
		if err != nil {
			t.Fatal(err)
		}
		if killed == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := peer.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("done"), Size: 4, Stored: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobCompleted {
			t.Fatalf("waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("waiter was not woken after the subscription was killed")
	}
	// A new waiter on the new subscription is woken too.
	q := p
	q.KeyHash = []byte("key2")
	r2, err := l.Reserve(ctx, again(q))
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		j, err := l.Wait(ctx, r2.Job.ID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		got <- j
	}()
	if err := peer.MarkUnknown(ctx, r2.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobUnknown {
			t.Fatalf("second waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("second waiter was not woken")
	}
}

// TestCheckDurability: the test server runs with appendonly no, which the
// check must name.
func TestCheckDurability(t *testing.T) {
	l := open(t, newPrefix(t))
	warns := l.CheckDurability(context.Background())
	found := false
	for _, w := range warns {
		t.Log(w)
		found = found || strings.Contains(w, "appendonly")
	}
	if !found {
		t.Errorf("warnings = %q, want one about appendonly (the test server runs without it)", warns)
	}
}

// TestScriptCacheFlushed: after SCRIPT FLUSH (as after a restart) the
// transitions still run, loading their scripts again.
func TestScriptCacheFlushed(t *testing.T) {
	l := open(t, newPrefix(t))
	ctx := context.Background()
	if err := l.Client().ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p := ledger.ReserveParams{
		JobID: ledger.NewID(), OwnerHash: []byte("owner"), KeyHash: []byte("key"), Fingerprint: []byte("fp"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{ID: ledger.NewID(), Provider: "p", Lease: time.Minute},
	}
	if r, err := l.Reserve(ctx, p); err != nil || r.Outcome != ledger.Created {
		t.Fatalf("reserve after SCRIPT FLUSH: %v %v", r.Outcome, err)
	}
}

// TestRealServerNeverResends and TestRealServerCompleteReplyLost lose a
// script's reply between the real server and the ledger's client.
func TestRealServerNeverResends(t *testing.T) {
	o, err := redis.ParseURL(url(t))
	if err != nil {
		t.Fatal(err)
	}
	checkNeverResends(t, o.Addr, o.DB, newPrefix(t))
}

func TestRealServerCompleteReplyLost(t *testing.T) {
	o, err := redis.ParseURL(url(t))
	if err != nil {
		t.Fatal(err)
	}
	checkCompleteReplyLost(t, o.Addr, o.DB, newPrefix(t))
}
