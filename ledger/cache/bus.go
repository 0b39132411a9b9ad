package cache

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// bus holds the one Redis subscription of a cache Ledger, to the channel
// on which every instance publishes the ids of jobs that changed. It is
// shared by all of the Ledger's waiters, starts with the first of them,
// and resubscribes until closed; after each (re)subscription it wakes
// every waiter, so that each reads its job again and nothing published
// while it was away is missed for longer than that.
//
// Publications are hints: a waiter woken by one reads the truth before it
// believes anything, so a lost, late or forged publication costs at most a
// read, and the truth's own Wait keeps running beside it.
type bus struct {
	rdb     *redis.Client
	channel string
	log     *logThrottle
	// readyWait bounds how long a waiter waits for the subscription to be
	// confirmed before it reads the truth anyway.
	readyWait time.Duration

	// waiters is ready while the subscription is confirmed. Where its
	// state must agree with down, it is used with mu held.
	waiters ledger.Waiters

	mu      sync.Mutex
	down    bool // the last attempt to subscribe failed
	started bool
	closed  bool
	ps      *redis.PubSub
	ctx     context.Context
	stop    context.CancelFunc
	done    chan struct{}
}

// Timing of the subscription loop.
const (
	busIdle       = 15 * time.Second // ping after this long without a message
	busMinBackoff = 50 * time.Millisecond
	busMaxBackoff = 2 * time.Second
)

func newBus(rdb *redis.Client, channel string, readyWait time.Duration, log *logThrottle) *bus {
	ctx, stop := context.WithCancel(context.Background())
	return &bus{
		rdb:       rdb,
		channel:   channel,
		log:       log,
		readyWait: readyWait,
		ctx:       ctx,
		stop:      stop,
		done:      make(chan struct{}),
	}
}

// subscribe registers a waiter for jobID. It returns once the subscription
// is confirmed, or at once while Redis is known to be down, or after
// readyWait: the waiter's reads of the truth then follow its subscription
// whenever Redis allows. The returned channel receives a value when the
// job's id is published and after every resubscription; cancel unregisters
// the waiter.
func (b *bus) subscribe(ctx context.Context, jobID string) (<-chan struct{}, func()) {
	b.mu.Lock()
	ch, cancel := b.waiters.Register(jobID)
	if !b.started && !b.closed {
		b.started = true
		go b.run()
	}
	ready, down := b.waiters.Ready(), b.down || b.closed
	b.mu.Unlock()
	if !down {
		t := time.NewTimer(b.readyWait)
		select {
		case <-ready:
		case <-t.C:
		case <-ctx.Done():
		case <-b.ctx.Done():
		}
		t.Stop()
	}
	return ch, cancel
}

// run subscribes, receives, and resubscribes after failures until closed.
func (b *bus) run() {
	defer close(b.done)
	backoff := busMinBackoff
	for b.ctx.Err() == nil {
		ps := b.rdb.Subscribe(b.ctx, b.channel)
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			_ = ps.Close()
			return
		}
		b.ps = ps
		b.mu.Unlock()

		confirmed, err := b.session(ps)

		b.mu.Lock()
		b.ps = nil
		b.down = true
		b.waiters.SetNotReady()
		b.mu.Unlock()
		_ = ps.Close()
		if b.ctx.Err() != nil {
			return
		}
		b.log.warn("redis cache: subscription lost; waiters rely on the ledger's own notifications",
			zap.String("channel", b.channel), zap.Error(err))
		if confirmed {
			backoff = busMinBackoff
		}
		select {
		case <-b.ctx.Done():
			return
		case <-time.After(backoff):
			backoff = min(2*backoff, busMaxBackoff)
		}
	}
}

// session receives on one subscription until it fails. It reports whether
// the subscription was confirmed.
func (b *bus) session(ps *redis.PubSub) (confirmed bool, err error) {
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(b.ctx, busIdle)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				// Quiet: make sure the connection is still alive.
				pinged = true
				pctx, cancel := context.WithTimeout(b.ctx, busIdle)
				err = ps.Ping(pctx)
				cancel()
				if err == nil {
					continue
				}
			}
			return confirmed, err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == b.channel {
				confirmed = true
				b.up()
			}
		case *redis.Message:
			if m.Channel == b.channel {
				b.waiters.Wake(m.Payload)
			}
		}
	}
}

// up marks the subscription confirmed and wakes every waiter.
func (b *bus) up() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.down = false
	b.waiters.SetReady()
}

// close ends the subscription and waits for its loop to stop.
func (b *bus) close() {
	b.stop()
	b.mu.Lock()
	b.closed = true
	started, ps := b.started, b.ps
	b.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	if started {
		<-b.done
	}
}
