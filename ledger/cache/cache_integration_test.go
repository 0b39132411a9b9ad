//go:build integration

package cache

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/postgres"
)

// env returns a test service's address; under the integration tag a
// missing address is a failure, never a skip.
func env(t *testing.T, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: run ./integration/test.sh, which starts PostgreSQL and Redis", name)
	}
	return v
}

var seq struct {
	sync.Mutex
	n int
}

func next() int {
	seq.Lock()
	defer seq.Unlock()
	seq.n++
	return seq.n
}

// newSchema returns a PostgreSQL schema no other test uses, dropped at
// cleanup.
func newSchema(t *testing.T) string {
	dsn := env(t, "ONEJOB_TEST_POSTGRES")
	name := fmt.Sprintf("onejob_cache_t%d_%d", os.Getpid(), next())
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	return name
}

// newPrefix returns a Redis prefix no other test uses; its keys are
// deleted at cleanup.
func newPrefix(t *testing.T) string {
	prefix := fmt.Sprintf("onejob:cachetest:%d:%d:", os.Getpid(), next())
	t.Cleanup(func() {
		rdb := redisClient(t)
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("clean prefix: %v", err)
		}
	})
	return prefix
}

// redisClient returns a client of the test Redis, closed with the test.
func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	rdb, err := NewClient(env(t, "ONEJOB_TEST_REDIS"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// openCache wraps truth with a cache on the test Redis, closed with the
// test.
func openCache(t *testing.T, truth ledger.Ledger, opts Options) *Ledger {
	t.Helper()
	l := New(truth, redisClient(t), opts)
	t.Cleanup(func() { l.Close() })
	return l
}

func openPostgres(t *testing.T, schema string, tracer pgx.QueryTracer) *postgres.Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := postgres.Open(ctx, env(t, "ONEJOB_TEST_POSTGRES"), postgres.Options{Schema: schema, Tracer: tracer})
	if err != nil {
		t.Fatalf("postgres.Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestPostgresRedisConformance runs the ledger suite through the cache,
// with PostgreSQL as the truth and a real Redis.
func TestPostgresRedisConformance(t *testing.T) {
	prefixes := map[*Ledger]string{}
	var mu sync.Mutex
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			prefix := newPrefix(t)
			l := openCache(t, openPostgres(t, newSchema(t), nil), Options{Prefix: prefix})
			mu.Lock()
			prefixes[l] = prefix
			mu.Unlock()
			return l
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			c := l.(*Ledger)
			mu.Lock()
			prefix := prefixes[c]
			mu.Unlock()
			return openCache(t, openPostgres(t, c.Truth().(*postgres.Ledger).Schema(), nil), Options{Prefix: prefix})
		},
	})
}

// countingTracer counts the round trips to PostgreSQL: queries, and
// batches or pipelines of several.
type countingTracer struct {
	mu sync.Mutex
	n  int
}

func (c *countingTracer) count(ctx context.Context) context.Context {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return ctx
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return c.count(ctx)
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return c.count(ctx)
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *countingTracer) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = 0
	return n
}

// countingHook counts the commands sent to Redis, but for the handshake
// of new connections.
type countingHook struct {
	mu sync.Mutex
	n  int
}

func (h *countingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.count(cmd)
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook counts a pipeline once: it is one round trip.
func (h *countingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		for _, c := range cmds {
			if h.counts(c) {
				h.n++
				break
			}
		}
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// counts reports whether cmd counts: it is not part of a new connection's
// handshake.
func (h *countingHook) counts(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "client", "auth", "select":
		return false
	}
	return true
}

// count counts cmd if it counts. h.mu must be held.
func (h *countingHook) count(cmd redis.Cmder) {
	if h.counts(cmd) {
		h.n++
	}
}

func (h *countingHook) take() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.n
	h.n = 0
	return n
}

// TestReplayRoundTrips: a replay through the cache costs one Redis round
// trip (the reply and its time to live) and no PostgreSQL query; a replay the cache cannot answer costs one
// query and fills the cache.
func TestReplayRoundTrips(t *testing.T) {
	tr := &countingTracer{}
	truth := openPostgres(t, newSchema(t), tr)
	rdb := redisClient(t)
	hook := &countingHook{}
	rdb.AddHook(hook)
	// The tier in this process is off: this test counts Redis's share.
	l := New(truth, rdb, Options{Prefix: newPrefix(t), LocalEntries: -1})
	t.Cleanup(func() { l.Close() })

	// Connect first: migrations and the connection handshake are not
	// counted.
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	tr.take()
	hook.take()

	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	if n := tr.take(); n != 1 {
		t.Errorf("fresh reserve took %d queries, want 1", n)
	}
	mustComplete(t, l, r, "replayed")
	if n := tr.take(); n != 1 {
		t.Errorf("complete took %d round trips, want 1, complete and announce in one pipeline (the identity is remembered)", n)
	}
	if n := hook.take(); n != 2 {
		t.Errorf("reserve and complete took %d Redis round trips, want 2 (GET and PTTL; SET and PUBLISH)", n)
	}
	for range 3 {
		wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "replayed")
		if n := tr.take(); n != 0 {
			t.Errorf("cached replay took %d PostgreSQL queries, want 0", n)
		}
		if n := hook.take(); n != 1 {
			t.Errorf("cached replay took %d Redis round trips, want 1", n)
		}
	}
	// With the reply gone, the truth answers once and the cache is filled.
	if err := rdb.Del(context.Background(), l.replyKey(p.OwnerHash, p.KeyHash)).Err(); err != nil {
		t.Fatal(err)
	}
	hook.take()
	wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "replayed")
	if n := tr.take(); n != 1 {
		t.Errorf("uncached replay took %d queries, want 1", n)
	}
	wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "replayed")
	if n := tr.take(); n != 0 {
		t.Errorf("replay after refill took %d queries, want 0", n)
	}
}

// TestReplayRoundTripsLocal: with the tier in this process, a replay of a
// reply this process wrote or read costs no round trip at all; another
// process reads it from Redis once.
func TestReplayRoundTripsLocal(t *testing.T) {
	tr := &countingTracer{}
	schema, prefix := newSchema(t), newPrefix(t)
	truth := openPostgres(t, schema, tr)
	rdb := redisClient(t)
	hook := &countingHook{}
	rdb.AddHook(hook)
	l := New(truth, rdb, Options{Prefix: prefix})
	t.Cleanup(func() { l.Close() })
	peer := openCache(t, openPostgres(t, schema, nil), Options{Prefix: prefix})
	ledgertest.KeepsReplays(t, l.near)
	ledgertest.KeepsReplays(t, peer.near)
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}

	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	mustComplete(t, l, r, "local")
	tr.take()
	hook.take()
	for range 3 {
		wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "local")
		if q, c := tr.take(), hook.take(); q != 0 || c != 0 {
			t.Errorf("replay in the completing process took %d queries and %d Redis round trips, want none", q, c)
		}
	}
	// A different body under the same key is refused from the same tier.
	other := p
	other.Fingerprint = []byte("another request")
	if res, err := l.Reserve(context.Background(), other.WithNewIDs()); err != nil || res.Outcome != ledger.Mismatch {
		t.Errorf("another request under the key: %v %v, want mismatch", res.Outcome, err)
	}
	// Another process reads the reply from Redis once, then keeps it.
	peerHook := &countingHook{}
	peer.rdb.AddHook(peerHook)
	for i := range 3 {
		wantAnswer(t, mustReserve(t, peer, p, ledger.Done), r.Job.ID, "local")
		want := 0
		if i == 0 {
			want = 1
		}
		if n := peerHook.take(); n != want {
			t.Errorf("replay %d in another process took %d Redis round trips, want %d", i, n, want)
		}
	}
}

// TestWaiterWokenAcrossInstances: a waiter on one instance is woken by a
// completion on another, through PostgreSQL and Redis together.
func TestWaiterWokenAcrossInstances(t *testing.T) {
	schema, prefix := newSchema(t), newPrefix(t)
	l := openCache(t, openPostgres(t, schema, nil), Options{Prefix: prefix})
	peer := openCache(t, openPostgres(t, schema, nil), Options{Prefix: prefix})
	r := mustReserve(t, l, params(), ledger.Created)
	got := waitFor(t, l, r.Job.ID)
	mustComplete(t, peer, r, "across")
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobCompleted || string(j.Response.Body) != "across" {
			t.Fatalf("waiter got %+v", j)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter was not woken")
	}
}
