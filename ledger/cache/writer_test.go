package cache

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/memory"
)

// gate holds every pipeline of the writer's commands sent while it is
// shut, and counts those pipelines and commands.
type gate struct {
	mu        sync.Mutex
	open      chan struct{}
	pipelines int
	commands  int
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, c := range cmds {
			switch c.Name() {
			case "set", "del", "publish":
				n++
			}
		}
		if n == 0 {
			return next(ctx, cmds) // the connection's handshake
		}
		g.mu.Lock()
		g.pipelines++
		g.commands += n
		open := g.open
		g.mu.Unlock()
		<-open
		return next(ctx, cmds)
	}
}

// holding returns once a pipeline is held at the gate.
func (g *gate) holding(t *testing.T) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if p, _ := g.counts(); p == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the first write was not sent")
		}
		time.Sleep(time.Millisecond)
	}
}

func (g *gate) counts() (pipelines, commands int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pipelines, g.commands
}

// gated returns a cache Ledger on m whose Redis pipelines pass g, with a
// timeout long enough for a held pipeline.
func gated(t *testing.T, m *miniredis.Miniredis, g *gate) *Ledger {
	t.Helper()
	rdb := client(t, m.Addr())
	rdb.AddHook(g)
	l := New(memory.New(), rdb, Options{Timeout: 10 * time.Second})
	t.Cleanup(func() { l.Close() })
	ledgertest.KeepsReplays(t, l.near) // else the writer sets no reply
	return l
}

// holding returns a gated cache Ledger whose first write, a publication,
// is held at the gate.
func holding(t *testing.T) (*miniredis.Miniredis, *gate, *Ledger) {
	t.Helper()
	m := miniredis.RunT(t)
	g := newGate()
	l := gated(t, m, g)
	l.writer.queue(op{publish: "first", queued: l.now()})
	g.holding(t)
	return m, g, l
}

// TestWritesBatched: the writes queued while a pipeline is on its way go
// together in the next one, in the order they were queued, and a reply's
// time to live loses the time its write waited.
func TestWritesBatched(t *testing.T) {
	m, g, l := holding(t)
	queued := l.now()
	l.writer.queue(op{key: "k", value: []byte("v1"), ttl: time.Hour, gen: l.near.Gen(), queued: queued})
	for i := range 8 {
		l.writer.queue(op{publish: "job" + string(rune('a'+i)), queued: queued})
	}
	l.writer.queue(op{del: "k", queued: queued})
	l.writer.queue(op{key: "k", value: []byte("v2"), ttl: time.Hour, gen: l.near.Gen(), queued: queued.Add(-20 * time.Minute)})
	close(g.open)
	l.writer.flush()

	if p, c := g.counts(); p != 2 || c != 12 {
		t.Errorf("%d pipelines, %d commands; want 2 and 12: the writes queued meanwhile sent together", p, c)
	}
	if v, err := m.Get("k"); err != nil || v != "v2" {
		t.Errorf("k = %q, %v; want the last write (set, del, set in that order)", v, err)
	}
	if ttl := m.TTL("k"); ttl > 40*time.Minute || ttl < 39*time.Minute {
		t.Errorf("ttl %v, want an hour less the 20 minutes the write waited", ttl)
	}
}

// TestCloseSendsQueuedWrites: Close sends what was queued before it, and
// a write after Close is dropped without blocking.
func TestCloseSendsQueuedWrites(t *testing.T) {
	m := miniredis.RunT(t)
	g := newGate()
	l := gated(t, m, g)
	l.writer.queue(op{key: "a", value: []byte("1"), ttl: time.Hour, gen: l.near.Gen(), queued: l.now()})
	l.writer.queue(op{key: "b", value: []byte("2"), ttl: time.Hour, gen: l.near.Gen(), queued: l.now()})
	close(g.open)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if !m.Exists("a") || !m.Exists("b") {
		t.Errorf("keys after Close: %v; want a and b written", m.Keys())
	}
	l.writer.queue(op{key: "c", value: []byte("3"), ttl: time.Hour, gen: l.near.Gen(), queued: l.now()})
	l.writer.flush()
	if m.Exists("c") {
		t.Error("a write after Close reached Redis")
	}
}

// TestBatchBytesBounded: large replies are not all sent in one pipeline.
func TestBatchBytesBounded(t *testing.T) {
	m, g, l := holding(t)
	big := make([]byte, maxBatchBytes*6/10)
	for _, k := range []string{"a", "b", "c"} {
		l.writer.queue(op{key: k, value: big, ttl: time.Hour, gen: l.near.Gen(), queued: l.now()})
	}
	close(g.open)
	l.writer.flush()
	if p, c := g.counts(); p != 3 || c != 4 {
		t.Errorf("%d pipelines, %d commands; want 3 and 4: two large replies, then the third", p, c)
	}
	for _, k := range []string{"a", "b", "c"} {
		if !m.Exists(k) {
			t.Errorf("%s was not written", k)
		}
	}
}
