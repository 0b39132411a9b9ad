package cache

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/memory"
)

// quiet drops go-redis's own log lines: the tests close Redis on purpose.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}

// client returns a client of the Redis at addr, closed with the test.
func client(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// open wraps truth with a cache on the Redis at addr, closed with the test.
// open returns a cache over truth whose notifications are up: it keeps
// answers only while it can hear purges.
func open(t *testing.T, truth ledger.Ledger, addr string, opts Options) *Ledger {
	t.Helper()
	l := openDown(t, truth, addr, opts)
	ledgertest.KeepsReplays(t, l.near)
	return l
}

// openDown returns a cache over truth whose Redis at addr may be gone.
func openDown(t *testing.T, truth ledger.Ledger, addr string, opts Options) *Ledger {
	t.Helper()
	l := New(truth, client(t, addr), opts)
	t.Cleanup(func() { l.Close() })
	return l
}

// ticking moves m's clock with real time, as a Redis server's runs:
// miniredis counts times to live down only when told to.
func ticking(t *testing.T, m *miniredis.Miniredis) {
	done := make(chan struct{})
	stopped := make(chan struct{})
	t.Cleanup(func() { close(done); <-stopped })
	go func() {
		defer close(stopped)
		last := time.Now()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				m.FastForward(now.Sub(last))
				last = now
			}
		}
	}()
}

func conformance(t *testing.T, opts Options, redisDown bool) {
	open := open
	if redisDown {
		open = openDown
	}
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			m := miniredis.RunT(t)
			addr := m.Addr()
			if redisDown {
				m.Close()
			} else {
				ticking(t, m)
			}
			return open(t, memory.New(), addr, opts)
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			c := l.(*Ledger)
			return open(t, c.Truth(), c.rdb.Options().Addr, opts)
		},
	})
}

// TestConformance runs the ledger suite through the cache.
func TestConformance(t *testing.T) { conformance(t, Options{}, false) }

// TestConformanceTightMargin caches even the suite's short-lived jobs, so
// that expiry and replacement are judged by the cache too.
func TestConformanceTightMargin(t *testing.T) {
	// Not tighter than miniredis's clock, which ticking moves in steps.
	conformance(t, Options{Margin: 250 * time.Millisecond}, false)
}

// TestConformanceRedisDown runs the suite with Redis gone: every call is
// answered by the truth.
func TestConformanceRedisDown(t *testing.T) { conformance(t, Options{}, true) }

// counting is a truth that counts its calls.
type counting struct {
	ledger.Ledger
	reserves, jobs atomic.Int64
}

func (c *counting) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	c.reserves.Add(1)
	return c.Ledger.Reserve(ctx, p)
}

func (c *counting) Job(ctx context.Context, id string) (*ledger.Job, error) {
	c.jobs.Add(1)
	return c.Ledger.Job(ctx, id)
}

// partial is a truth whose Complete returns the job without its identity,
// as PostgreSQL's does.
type partial struct{ ledger.Ledger }

func (p partial) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	c, err := p.Ledger.Complete(ctx, ref, resp)
	if c.Job != nil {
		j := c.Job
		c.Job = &ledger.Job{ID: j.ID, State: j.State, Version: j.Version, CompletedBy: j.CompletedBy,
			CompletedAt: j.CompletedAt, ExpiresAt: j.ExpiresAt, Response: j.Response}
	}
	return c, err
}

// deaf is a truth whose Wait never wakes but for its context: only the
// cache's publications can wake a waiter.
type deaf struct{ ledger.Ledger }

func (deaf) Wait(ctx context.Context, _ string) (*ledger.Job, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

func randBytes(n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return b
}

func params() ledger.ReserveParams {
	return ledger.ReserveParams{
		OwnerHash: randBytes(32), KeyHash: randBytes(32), Fingerprint: randBytes(32), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "primary", Lease: time.Minute},
	}
}

func answer(body string) ledger.Response {
	return ledger.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}},
		Body: []byte(body), Size: int64(len(body)), Stored: true}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func mustReserve(t *testing.T, l ledger.Ledger, p ledger.ReserveParams, want ledger.Outcome) ledger.Reservation {
	t.Helper()
	r, err := l.Reserve(testCtx(t), p.WithNewIDs())
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	if r.Outcome != want {
		t.Fatalf("Reserve = %v, want %v", r.Outcome, want)
	}
	written(l)
	return r
}

func mustComplete(t *testing.T, l ledger.Ledger, r ledger.Reservation, body string) ledger.Completion {
	t.Helper()
	c, err := l.Complete(testCtx(t), r.Attempt.Ref(), answer(body))
	if err != nil || !c.Won {
		t.Fatalf("Complete: won %v, %v", c.Won, err)
	}
	written(l)
	return c
}

// written returns once what a cache Ledger l queued for Redis is sent, for
// tests that read Redis, or replay from another instance, next.
func written(l ledger.Ledger) {
	if c, ok := l.(*Ledger); ok {
		c.writer.flush()
	}
}

func wantAnswer(t *testing.T, r ledger.Reservation, jobID, body string) {
	t.Helper()
	want := answer(body)
	got := r.Job.Response
	if r.Job.ID != jobID || got == nil || got.Status != want.Status || string(got.Body) != body || !got.Stored ||
		got.Size != want.Size || fmt.Sprint(got.Header) != fmt.Sprint(want.Header) {
		t.Fatalf("replay of job %s = %+v, want job %s with %+v", r.Job.ID, got, jobID, want)
	}
}

func TestReplayFromCache(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: memory.New()}
	l := open(t, truth, m.Addr(), Options{})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	mustComplete(t, l, r, `{"ok":true}`)
	before := truth.reserves.Load()
	for range 3 {
		wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, `{"ok":true}`)
	}
	if n := truth.reserves.Load() - before; n != 0 {
		t.Errorf("replays called the truth's Reserve %d times, want 0", n)
	}
	// Another instance replays from the same cache.
	peer := open(t, truth, m.Addr(), Options{})
	wantAnswer(t, mustReserve(t, peer, p, ledger.Done), r.Job.ID, `{"ok":true}`)
	if n := truth.reserves.Load() - before; n != 0 {
		t.Errorf("a peer's replay called the truth's Reserve")
	}
	// What is not completed is never cached.
	q := params()
	mustReserve(t, l, q, ledger.Created)
	mustReserve(t, l, q, ledger.InFlight)
	if m.Exists(l.replyKey(q.OwnerHash, q.KeyHash)) {
		t.Errorf("a pending job was cached")
	}
}

// TestCompletionWithoutIdentity: a backend whose Complete leaves the
// identity out still gets its answers cached, from the reservation's
// memory on the same instance and from the truth on another.
func TestCompletionWithoutIdentity(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: partial{memory.New()}}
	l := open(t, truth, m.Addr(), Options{})
	peer := open(t, truth, m.Addr(), Options{})

	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	jobs := truth.jobs.Load()
	mustComplete(t, l, r, "same instance")
	if n := truth.jobs.Load() - jobs; n != 0 {
		t.Errorf("caching a completion on the reserving instance read the truth %d times", n)
	}
	if l.memo.len() != 0 {
		t.Errorf("the completed job's identity is still remembered")
	}
	q := params()
	rq := mustReserve(t, l, q, ledger.Created)
	mustComplete(t, peer, rq, "other instance")

	reserves := truth.reserves.Load()
	wantAnswer(t, mustReserve(t, peer, p, ledger.Done), r.Job.ID, "same instance")
	wantAnswer(t, mustReserve(t, l, q, ledger.Done), rq.Job.ID, "other instance")
	if n := truth.reserves.Load() - reserves; n != 0 {
		t.Errorf("replays called the truth's Reserve %d times, want 0", n)
	}
}

func TestCorruptReplyFallsBack(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: memory.New()}
	// What Redis holds is tampered with below: the tier in this process,
	// which would answer instead, is off.
	l := open(t, truth, m.Addr(), Options{LocalEntries: -1})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	mustComplete(t, l, r, "the answer")
	key := l.replyKey(p.OwnerHash, p.KeyHash)
	good, err := m.Get(key)
	if err != nil {
		t.Fatal(err)
	}
	// Another job's valid reply, stored under this key.
	q := params()
	rq := mustReserve(t, l, q, ledger.Created)
	mustComplete(t, l, rq, "another answer")
	foreign, err := m.Get(l.replyKey(q.OwnerHash, q.KeyHash))
	if err != nil {
		t.Fatal(err)
	}
	flip := func(i int) string {
		b := []byte(good)
		b[i] ^= 0x01
		return string(b)
	}
	other := New(truth, l.rdb, Options{Secret: []byte("another secret")})
	defer other.Close()
	for name, v := range map[string]string{
		"garbage":        "not a reply",
		"empty":          "",
		"format":         flip(0),
		"checksum":       flip(5),
		"payload":        flip(len(good) - 3),
		"truncated":      good[:len(good)-1],
		"trailing":       good + "x",
		"foreign":        foreign,
		"another secret": string(encode(func() *ledger.Job { j, _ := decode([]byte(good), l.mac); return j }(), other.mac)),
	} {
		t.Run(name, func(t *testing.T) {
			if err := m.Set(key, v); err != nil {
				t.Fatal(err)
			}
			before := truth.reserves.Load()
			wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "the answer")
			if truth.reserves.Load() == before {
				t.Fatalf("a %s reply was trusted", name)
			}
			// The truth's answer replaced it.
			written(l)
			if got, _ := m.Get(key); got != good {
				t.Errorf("the reply was not refreshed from the truth")
			}
		})
	}
}

func TestMismatchFromCache(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: memory.New()}
	l := open(t, truth, m.Addr(), Options{})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	mustComplete(t, l, r, "secret answer")
	before := truth.reserves.Load()
	other := p
	other.Fingerprint = randBytes(32)
	v2 := p
	v2.FingerprintVersion = 2
	for _, q := range []ledger.ReserveParams{other, v2} {
		mm := mustReserve(t, l, q, ledger.Mismatch)
		if mm.Job.ID != r.Job.ID || mm.Job.Response != nil || mm.Attempt != nil || mm.Job.Fingerprint != nil {
			t.Errorf("mismatch from the cache = %+v, want only the job's id and state", mm.Job)
		}
	}
	if n := truth.reserves.Load() - before; n != 0 {
		t.Errorf("mismatches called the truth's Reserve %d times, want 0", n)
	}
}

func TestRedisDown(t *testing.T) {
	m := miniredis.RunT(t)
	truth := memory.New()
	l := open(t, truth, m.Addr(), Options{})
	peer := open(t, truth, m.Addr(), Options{})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	mustComplete(t, l, r, "cached")
	if !m.Exists(l.replyKey(p.OwnerHash, p.KeyHash)) {
		t.Fatal("the answer was not cached")
	}
	m.Close()

	wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "cached")
	q := params()
	rq := mustReserve(t, l, q, ledger.Created)
	done := make(chan *ledger.Job, 1)
	go func() {
		j, err := l.Wait(testCtx(t), rq.Job.ID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		done <- j
	}()
	mustComplete(t, peer, rq, "uncached")
	select {
	case j := <-done:
		if j == nil || j.State != ledger.JobCompleted {
			t.Fatalf("waiter got %+v", j)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter was not woken by the truth without Redis")
	}
	wantAnswer(t, mustReserve(t, peer, q, ledger.Done), rq.Job.ID, "uncached")
	if _, err := l.Resolve(testCtx(t), mustReserve(t, l, params(), ledger.Created).Job.ID, ledger.Resolution{Cancel: true}); err != nil {
		t.Errorf("Resolve without Redis: %v", err)
	}
}

func TestReplyExpiresBeforeJob(t *testing.T) {
	m := miniredis.RunT(t)
	l := open(t, memory.New(), m.Addr(), Options{})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	c := mustComplete(t, l, r, "x")
	ttl := m.TTL(l.replyKey(p.OwnerHash, p.KeyHash))
	if ttl <= 0 {
		t.Fatalf("reply has no TTL")
	}
	// now+ttl is no earlier than when Redis drops the reply.
	if end := time.Now().Add(ttl); !end.Before(c.Job.ExpiresAt.Add(-DefaultMargin + time.Second)) {
		t.Errorf("reply lives until about %v; the job expires at %v", end, c.Job.ExpiresAt)
	}
	// A job that expires within the margin is not cached at all.
	q := params()
	q.Retention = time.Second
	rq := mustReserve(t, l, q, ledger.Created)
	mustComplete(t, l, rq, "y")
	if m.Exists(l.replyKey(q.OwnerHash, q.KeyHash)) {
		t.Errorf("a reply was cached for a job expiring within the margin")
	}
}

func TestLargeAnswerNotCached(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: memory.New()}
	l := open(t, truth, m.Addr(), Options{MaxSize: 1024})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	big := string(bytes.Repeat([]byte("x"), 2048))
	mustComplete(t, l, r, big)
	if m.Exists(l.replyKey(p.OwnerHash, p.KeyHash)) {
		t.Errorf("an answer larger than MaxSize was cached")
	}
	before := truth.reserves.Load()
	wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, big)
	if truth.reserves.Load() == before {
		t.Errorf("the large answer was not replayed from the truth")
	}
}

// clock is a settable clock shared by the truth and the cache.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// TestExpiryByLedgerClocks: the cache compares no clock with another. A
// gateway whose clock runs a minute ahead of the truth's and Redis's, or a
// minute behind, replays a job from the cache until Redis's time to live
// (the job's time left by the truth's clock, less the margin) runs out,
// and never after: then the truth answers, and past expiry a new job starts.
func TestExpiryByLedgerClocks(t *testing.T) {
	for _, skew := range []time.Duration{time.Minute, -time.Minute} {
		t.Run(skew.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			clk := &clock{t: time.Now()}
			truth := &counting{Ledger: memory.New(memory.WithClock(clk.now))}
			l := open(t, truth, m.Addr(), Options{})
			l.now = func() time.Time { return clk.now().Add(skew) }
			advance := func(d time.Duration) { clk.add(d); m.FastForward(d) }
			p := params()
			p.Retention = time.Minute
			r := mustReserve(t, l, p, ledger.Created)
			mustComplete(t, l, r, "old")

			before := truth.reserves.Load()
			wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "old")
			if truth.reserves.Load() != before {
				t.Errorf("a fresh completed job was not replayed from the cache")
			}
			// Within the margin before expiry the reply is gone from
			// Redis and from the process; the truth still answers.
			advance(time.Minute - DefaultMargin/2)
			before = truth.reserves.Load()
			wantAnswer(t, mustReserve(t, l, p, ledger.Done), r.Job.ID, "old")
			if truth.reserves.Load() == before {
				t.Errorf("a reply within the margin of its expiry was trusted")
			}
			// Past expiry: a new job, never the old answer.
			advance(time.Minute)
			fresh := mustReserve(t, l, p, ledger.Created)
			if fresh.Job.ID == r.Job.ID {
				t.Fatalf("expired job was not replaced")
			}
			mustComplete(t, l, fresh, "new")
			wantAnswer(t, mustReserve(t, l, p, ledger.Done), fresh.Job.ID, "new")
			// A different request is a mismatch of the new job.
			q := p
			q.Fingerprint = randBytes(32)
			if mm := mustReserve(t, l, q, ledger.Mismatch); mm.Job.ID != fresh.Job.ID {
				t.Errorf("mismatch names job %s, want %s", mm.Job.ID, fresh.Job.ID)
			}
		})
	}
}

// TestRepeatedCompletionCachedByLedgerClock: a completion ran in the
// truth but its reply was lost, and the gateway repeats it 30 s later: the
// reply is cached for the time the job has left by the truth's clock at
// the repeat, never for a whole retention counted from the repeat (it
// would replay an expired job's answer to a new intent).
func TestRepeatedCompletionCachedByLedgerClock(t *testing.T) {
	m := miniredis.RunT(t)
	clk := &clock{t: time.Now()}
	truth := memory.New(memory.WithClock(clk.now))
	l := open(t, truth, m.Addr(), Options{})
	l.now = clk.now
	p := params()
	p.Retention = time.Minute
	r := mustReserve(t, l, p, ledger.Created)
	if c, err := truth.Complete(testCtx(t), r.Attempt.Ref(), answer("done")); err != nil || !c.Won {
		t.Fatalf("the completion whose reply is lost: %v, %v", c.Won, err)
	}
	clk.add(30 * time.Second)
	m.FastForward(30 * time.Second)
	mustComplete(t, l, r, "done") // the repeat
	if ttl := m.TTL(l.replyKey(p.OwnerHash, p.KeyHash)); ttl <= 0 || ttl > 30*time.Second {
		t.Errorf("the reply is cached for %v; the job has 30s left", ttl)
	}
}

func TestStreamCachedOnceStored(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: partial{memory.New()}}
	l := open(t, truth, m.Addr(), Options{})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	head := ledger.Response{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}, Size: -1}
	if c, err := l.Complete(testCtx(t), r.Attempt.Ref(), head); err != nil || !c.Won {
		t.Fatalf("Complete: %v %v", c.Won, err)
	}
	written(l)
	key := l.replyKey(p.OwnerHash, p.KeyHash)
	if rr := mustReserve(t, l, p, ledger.Done); rr.Job.Response.Stored || m.Exists(key) {
		t.Fatalf("an answer was cached before its body was stored")
	}
	if err := l.SaveBody(testCtx(t), r.Attempt.Ref(), []byte("data: 1\n\n"), 9, true); err != nil {
		t.Fatal(err)
	}
	before := truth.reserves.Load()
	got := mustReserve(t, l, p, ledger.Done).Job.Response
	if !got.Stored || string(got.Body) != "data: 1\n\n" || got.Size != 9 || truth.reserves.Load() != before {
		t.Errorf("stored stream = %+v, from the truth: %v", got, truth.reserves.Load() != before)
	}
	// A body cut short is never cached.
	q := params()
	rq := mustReserve(t, l, q, ledger.Created)
	if _, err := l.Complete(testCtx(t), rq.Attempt.Ref(), head); err != nil {
		t.Fatal(err)
	}
	if err := l.SaveBody(testCtx(t), rq.Attempt.Ref(), []byte("partial"), 1<<30, false); err != nil {
		t.Fatal(err)
	}
	written(l)
	if m.Exists(l.replyKey(q.OwnerHash, q.KeyHash)) {
		t.Errorf("an answer that was not stored was cached")
	}
}

func TestResolveCaches(t *testing.T) {
	m := miniredis.RunT(t)
	truth := &counting{Ledger: memory.New()}
	l := open(t, truth, m.Addr(), Options{})
	admin := open(t, truth, m.Addr(), Options{})
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	if err := l.MarkUnknown(testCtx(t), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	resp := answer("operator")
	if _, err := admin.Resolve(testCtx(t), r.Job.ID, ledger.Resolution{Response: &resp, AttemptID: ledger.NewID()}); err != nil {
		t.Fatal(err)
	}
	written(admin)
	before := truth.reserves.Load()
	got := mustReserve(t, l, p, ledger.Done)
	if string(got.Job.Response.Body) != "operator" || truth.reserves.Load() != before {
		t.Errorf("resolved answer %q, from the truth: %v", got.Job.Response.Body, truth.reserves.Load() != before)
	}
}

// waitFor runs Wait in the background.
func waitFor(t *testing.T, l ledger.Ledger, id string) <-chan *ledger.Job {
	ch := make(chan *ledger.Job, 1)
	go func() {
		j, err := l.Wait(testCtx(t), id)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		ch <- j
	}()
	return ch
}

// subscribed waits until n connections listen on the cache's channel.
func subscribed(t *testing.T, m *miniredis.Miniredis, l *Ledger, n int) {
	t.Helper()
	ledgertest.Eventually(t, "the waiter is subscribed", func() bool { return m.PubSubNumSub(l.Channel())[l.Channel()] >= n })
}

// TestWaiterWokenByPublication: the truth's Wait never wakes, so only the
// publication of another instance's completion can wake the waiter.
func TestWaiterWokenByPublication(t *testing.T) {
	m := miniredis.RunT(t)
	truth := deaf{memory.New()}
	l := open(t, truth, m.Addr(), Options{})
	peer := open(t, truth, m.Addr(), Options{})

	settle := map[string]func(r ledger.Reservation) error{
		"complete": func(r ledger.Reservation) error {
			_, err := peer.Complete(context.Background(), r.Attempt.Ref(), answer("via redis"))
			return err
		},
		"unknown": func(r ledger.Reservation) error {
			return peer.MarkUnknown(context.Background(), r.Attempt.Ref(), "timeout")
		},
		"fail": func(r ledger.Reservation) error {
			_, err := peer.Fail(context.Background(), r.Attempt.Ref(), "503", nil)
			return err
		},
		"cancel": func(r ledger.Reservation) error {
			_, err := peer.Resolve(context.Background(), r.Job.ID, ledger.Resolution{Cancel: true})
			return err
		},
	}
	for name, fn := range settle {
		t.Run(name, func(t *testing.T) {
			r := mustReserve(t, l, params(), ledger.Created)
			got := waitFor(t, l, r.Job.ID)
			subscribed(t, m, l, 1)
			// A publication while the job is still pending wakes the
			// waiter, which reads the truth and waits on.
			m.Publish(l.Channel(), r.Job.ID)
			select {
			case j := <-got:
				t.Fatalf("waiter returned %+v for a pending job", j)
			case <-time.After(50 * time.Millisecond):
			}
			if err := fn(r); err != nil {
				t.Fatal(err)
			}
			select {
			case j := <-got:
				if j == nil || j.State == ledger.JobPending {
					t.Fatalf("waiter got %+v", j)
				}
				if name == "complete" && string(j.Response.Body) != "via redis" {
					t.Errorf("waiter got body %q", j.Response.Body)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("waiter was not woken by the publication")
			}
		})
	}
}

// TestWaiterSurvivesRedisRestart: the subscription comes back after Redis
// does, and wakes waiters again.
func TestWaiterSurvivesRedisRestart(t *testing.T) {
	m := miniredis.RunT(t)
	truth := deaf{memory.New()}
	l := open(t, truth, m.Addr(), Options{})
	peer := open(t, truth, m.Addr(), Options{})
	r := mustReserve(t, l, params(), ledger.Created)
	got := waitFor(t, l, r.Job.ID)
	subscribed(t, m, l, 1)
	m.Close()
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	subscribed(t, m, l, 1)
	mustComplete(t, peer, r, "after restart")
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobCompleted {
			t.Fatalf("waiter got %+v", j)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter was not woken after Redis restarted")
	}
}

func TestWaitEndsWithContext(t *testing.T) {
	m := miniredis.RunT(t)
	l := open(t, deaf{memory.New()}, m.Addr(), Options{})
	r := mustReserve(t, l, params(), ledger.Created)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Wait(ctx, r.Job.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait = %v, want the context's error", err)
	}
}

func TestCloseOwnership(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := client(t, m.Addr())
	truth := memory.New()
	l := New(truth, rdb, Options{})
	r := mustReserve(t, l, params(), ledger.Created)
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.Wait(wctx, r.Job.ID)
	subscribed(t, m, l, 1)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	ledgertest.Eventually(t, "the subscription ends", func() bool { return m.PubSubNumSub(l.Channel())[l.Channel()] == 0 })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Errorf("Close closed a client it does not own: %v", err)
	}
	mustReserve(t, truth, params(), ledger.Created)

	owned := New(truth, client(t, m.Addr()), Options{CloseClient: true, CloseTruth: true})
	if err := owned.Close(); err != nil {
		t.Fatal(err)
	}
	if err := owned.rdb.Ping(context.Background()).Err(); err == nil {
		t.Errorf("Close left an owned client open")
	}
}

func TestEntryRoundTrip(t *testing.T) {
	now := time.Now()
	j := &ledger.Job{
		ID: ledger.NewID(), OwnerHash: randBytes(32), KeyHash: randBytes(32), Fingerprint: randBytes(32),
		FingerprintVersion: 3, State: ledger.JobCompleted, Version: 7, CompletedBy: ledger.NewID(),
		Retention: time.Hour, CreatedAt: now.Add(-time.Minute), CompletedAt: now, ExpiresAt: now.Add(time.Hour),
		Response: &ledger.Response{Status: 200, Header: map[string][]string{"A": {"1", ""}, "B": {}}, Body: []byte{}, Size: 0, Stored: true},
	}
	for _, secret := range [][]byte{nil, []byte("k")} {
		mac := newMAC(secret)
		got, err := decode(encode(j, mac), mac)
		if err != nil {
			t.Fatal(err)
		}
		if got.ID != j.ID || !bytes.Equal(got.OwnerHash, j.OwnerHash) || !bytes.Equal(got.KeyHash, j.KeyHash) ||
			!bytes.Equal(got.Fingerprint, j.Fingerprint) || got.FingerprintVersion != 3 || got.State != j.State ||
			got.Version != 7 || got.CompletedBy != j.CompletedBy || got.Retention != time.Hour ||
			!got.CreatedAt.Equal(j.CreatedAt) || !got.CompletedAt.Equal(j.CompletedAt) || !got.ExpiresAt.Equal(j.ExpiresAt) ||
			fmt.Sprint(got.Response.Header) != fmt.Sprint(j.Response.Header) || got.Response.Body == nil || !got.Response.Stored {
			t.Errorf("round trip: %+v, want %+v", got, j)
		}
	}
}

func FuzzDecode(f *testing.F) {
	j := &ledger.Job{ID: "id", OwnerHash: []byte("o"), KeyHash: []byte("k"), State: ledger.JobCompleted, CompletedBy: "a",
		ExpiresAt: time.Now(), Response: &ledger.Response{Status: 200, Header: map[string][]string{"X": {"y"}}, Body: []byte("b"), Stored: true}}
	f.Add(encode(j, newMAC(nil))[1+sumSize:])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, payload []byte) {
		mac := newMAC(nil)
		_, _ = decode(payload, mac)
		// Signed, any payload reaches the parser: it must fail cleanly or
		// decode to the end.
		h := mac()
		h.Write([]byte{entryFormat})
		h.Write(payload)
		signed := append(append([]byte{entryFormat}, h.Sum(nil)...), payload...)
		if j, err := decode(signed, mac); err == nil && j.Response == nil {
			t.Fatalf("decoded a job without a response")
		}
	})
}
