package redis

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
)

// healthEvery is how long the subscription may be silent before it is
// pinged; a ping left unanswered as long again means the connection is dead.
const healthEvery = 15 * time.Second

// listener holds the one pub/sub subscription of a Ledger, shared by all its
// waiters. It starts with the first waiter and resubscribes until closed,
// on a new connection each time; after every (re)subscription it wakes
// every waiter, so that each reads its job again and nothing published
// while it was away is missed.
type listener struct {
	client  *redis.Client
	channel string

	waiters ledger.Waiters // ready while subscribed

	mu      sync.Mutex
	started bool
	ps      *redis.PubSub // the current subscription, closed by close
	ctx     context.Context
	stop    context.CancelFunc
	done    chan struct{}
}

func newListener(client *redis.Client, channel string) *listener {
	ctx, stop := context.WithCancel(context.Background())
	return &listener{
		client:  client,
		channel: channel,
		ctx:     ctx,
		stop:    stop,
		done:    make(chan struct{}),
	}
}

var errClosed = errors.New("redis ledger: closed")

// subscribe registers a waiter for jobID and returns once the subscription
// is confirmed, so that a read made after it cannot miss a publication. The
// returned channel receives a value on every publication for the job and
// after every resubscription.
func (ln *listener) subscribe(ctx context.Context, jobID string) (<-chan struct{}, func(), error) {
	ln.mu.Lock()
	if ln.ctx.Err() != nil {
		ln.mu.Unlock()
		return nil, nil, errClosed
	}
	ch, cancel := ln.waiters.Register(jobID)
	if !ln.started {
		ln.started = true
		go ln.run()
	}
	ready := ln.waiters.Ready()
	ln.mu.Unlock()
	select {
	case <-ready:
		return ch, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, ctx.Err()
	case <-ln.ctx.Done():
		cancel()
		return nil, nil, errClosed
	}
}

func (ln *listener) run() {
	defer close(ln.done)
	backoff := 50 * time.Millisecond
	for ln.ctx.Err() == nil {
		ps := ln.client.Subscribe(ln.ctx)
		ln.mu.Lock()
		if ln.ctx.Err() != nil {
			ln.mu.Unlock()
			ps.Close()
			return
		}
		ln.ps = ps
		ln.mu.Unlock()
		if ln.receive(ps) {
			backoff = 50 * time.Millisecond
		}
		ln.waiters.SetNotReady()
		ln.mu.Lock()
		ln.ps = nil
		ln.mu.Unlock()
		ps.Close()
		select {
		case <-ln.ctx.Done():
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// receive subscribes and dispatches publications until the connection
// fails or the listener is closed. It reports whether the subscription was
// confirmed.
func (ln *listener) receive(ps *redis.PubSub) bool {
	if err := ps.Subscribe(ln.ctx, ln.channel); err != nil {
		return false
	}
	confirmed, pinged := false, false
	for {
		msg, err := ps.ReceiveTimeout(ln.ctx, healthEvery)
		if err != nil {
			var ne net.Error
			if !pinged && errors.As(err, &ne) && ne.Timeout() {
				if ps.Ping(ln.ctx) == nil {
					pinged = true
					continue
				}
			}
			return confirmed
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == ln.channel {
				confirmed = true
				ln.waiters.SetReady()
			}
		case *redis.Message:
			ln.waiters.Wake(m.Payload)
		}
	}
}

func (ln *listener) close() {
	ln.mu.Lock()
	ln.stop()
	started, ps := ln.started, ln.ps
	ln.mu.Unlock()
	if ps != nil {
		ps.Close()
	}
	if started {
		<-ln.done
	}
}

// Wait implements ledger.Ledger: it subscribes before it reads, and reads
// again after each publication, resubscription, or lease deadline.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	if !validID(jobID) {
		return nil, ledger.ErrNotFound
	}
	return ledger.WaitSubscribed(ctx,
		func() (<-chan struct{}, func(), error) { return l.listen.subscribe(ctx, jobID) },
		func() (*ledger.Job, time.Time, error) { return l.load(ctx, jobID) })
}
