package cache

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
)

// maxBatch and maxBatchBytes bound the writes one pipeline carries: a
// pipeline of large replies would not fit in one call's timeout, and its
// failure would take small writes with it.
const (
	maxBatch      = 128
	maxBatchBytes = 1 << 20
)

// op is one write to Redis, prepared by the caller: the writer only sends
// it. A reply's time to live counts from when the op was queued, so the
// time it waited is taken off it when it is sent.
type op struct {
	key     string        // the reply to set, "" for none
	value   []byte        // the reply
	ttl     time.Duration // its time to live when queued
	gen     uint64        // the near tier's generation before the reply was read: the set is dropped unless it keeps it
	del     string        // the reply to drop, "" for none
	publish string        // the job id to publish, "" for none
	queued  time.Time     // by the cache's local clock
	flushed chan struct{} // closed once every op queued before this one was sent

	// forget drops every reply of this owner, once the ops queued before
	// are sent; the result goes to forgot, if not nil, and ctx bounds it
	// (nil: forgetTimeout).
	forget []byte
	ctx    context.Context
	forgot chan<- forgotten
}

// forgotten is the result of a forget op.
type forgotten struct {
	n   int
	err error
}

// forgetTimeout bounds the forget of a purge heard from another instance.
const forgetTimeout = time.Minute

// writer sends the cache's writes to Redis in the background, in the order
// they were queued, as many at a time as are waiting (up to maxBatch) in
// one pipeline. A call that changed the truth returns without waiting for
// Redis: its writes only help later calls (a reply they can replay, a
// publication that wakes waiters sooner than the truth's own
// notification), and every reader falls back to the truth without them.
// Under load, one round trip carries the writes of many calls.
type writer struct {
	rdb     *redis.Client
	timeout time.Duration
	now     func() time.Time
	keeps   func(gen uint64) bool                                    // the near tier's Keeps
	forget  func(ctx context.Context, ownerHash []byte) (int, error) // drops an owner's replies
	log     *logThrottle
	channel string

	start   sync.Once
	ops     chan op
	done    chan struct{} // closed by close: send what is queued and stop
	stopped chan struct{} // closed when the loop has returned
	closed  sync.Once
}

func newWriter(rdb *redis.Client, channel string, timeout time.Duration, now func() time.Time, keeps func(uint64) bool,
	forget func(context.Context, []byte) (int, error), log *logThrottle) *writer {
	return &writer{
		rdb: rdb, timeout: timeout, now: now, keeps: keeps, forget: forget, log: log, channel: channel,
		ops:     make(chan op, 4*maxBatch),
		done:    make(chan struct{}),
		stopped: make(chan struct{}),
	}
}

// queue hands o to the loop, which it starts on first use. After close
// the op is dropped.
func (w *writer) queue(o op) {
	w.start.Do(func() { go w.loop() })
	select {
	case <-w.done:
		return
	default:
	}
	select {
	case w.ops <- o:
	case <-w.done:
	}
}

// flush returns once every op queued before it was sent (or the writer
// stopped).
func (w *writer) flush() {
	ch := make(chan struct{})
	w.queue(op{flushed: ch})
	select {
	case <-ch:
	case <-w.stopped:
	}
}

// forgetOwner runs the forget op o.
func (w *writer) forgetOwner(o op) {
	ctx := o.ctx
	if ctx == nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), forgetTimeout)
		defer cancel()
	}
	n, err := w.forget(ctx, o.forget)
	if o.forgot != nil {
		o.forgot <- forgotten{n, err}
	} else if err != nil {
		w.log.warn("redis cache: cannot drop the replies of a purged owner; they expire with their jobs", zap.Error(err))
	}
}

// purgeHeard is the notify.Watcher by which a writer hears of purges run
// by other instances: their replies it may have put back in Redis after
// the purge deleted them go too.
type purgeHeard struct{ w *writer }

func (purgeHeard) Live(bool) {}

func (p purgeHeard) ForgetOwner(ownerHash []byte) { p.w.queue(op{forget: ownerHash}) }

// close sends what is queued and stops the loop, if it was started.
func (w *writer) close() {
	w.closed.Do(func() {
		close(w.done)
		w.start.Do(func() { close(w.stopped) }) // never started: nothing to stop, and it never will
		<-w.stopped
	})
}

func (w *writer) loop() {
	defer close(w.stopped)
	batch := make([]op, 0, maxBatch) // fill keeps it within this capacity
	for {
		select {
		case o := <-w.ops:
			w.send(w.fill(append(batch[:0], o)))
		case <-w.done:
			// Send what is queued, then stop.
			for len(w.ops) > 0 {
				w.send(w.fill(append(batch[:0], <-w.ops)))
			}
			return
		}
	}
}

// fill adds to batch the ops waiting, within maxBatch and maxBatchBytes.
func (w *writer) fill(batch []op) []op {
	size := 0
	for _, o := range batch {
		size += len(o.value)
	}
	for len(batch) < maxBatch && size < maxBatchBytes {
		select {
		case o := <-w.ops:
			batch = append(batch, o)
			size += len(o.value)
		default:
			return batch
		}
	}
	return batch
}

// send writes batch in one pipeline, cut where an op forgets an owner;
// Redis errors are logged, never returned. A reply the near tier would not
// keep (read before a purge was heard, or while one could go unheard) is
// not set: the purge may have deleted it already.
func (w *writer) send(batch []op) {
	ctx, cancel := context.WithTimeout(context.Background(), w.timeout)
	defer cancel()
	pipe := w.rdb.Pipeline()
	exec := func() {
		if pipe.Len() > 0 {
			if _, err := pipe.Exec(ctx); err != nil {
				w.log.warn("redis cache: write failed; replays and wake-ups fall back to the ledger", zap.Error(err))
			}
		}
	}
	now := w.now()
	for _, o := range batch {
		if o.forget != nil {
			exec()
			w.forgetOwner(o)
			continue
		}
		if o.key != "" && w.keeps(o.gen) {
			if ttl := o.ttl - now.Sub(o.queued); ttl >= time.Millisecond {
				pipe.Set(ctx, o.key, o.value, ttl)
			}
		}
		if o.del != "" {
			pipe.Del(ctx, o.del)
		}
		if o.publish != "" {
			pipe.Publish(ctx, w.channel, o.publish)
		}
	}
	exec()
	for _, o := range batch {
		if o.flushed != nil {
			close(o.flushed)
		}
	}
}
