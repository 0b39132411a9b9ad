package postgres

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
)

// listener holds the one LISTEN connection of a Ledger, shared by all its
// waiters. It starts with the first waiter and reconnects until closed;
// after every (re)connect it wakes every waiter, so that each reads its job
// again and nothing notified while it was away is missed.
type listener struct {
	cfg     *pgx.ConnConfig
	channel string

	waiters ledger.Waiters // ready while LISTEN is active

	mu      sync.Mutex
	started bool
	ctx     context.Context
	stop    context.CancelFunc
	done    chan struct{}
}

func newListener(cfg *pgx.ConnConfig, channel string) *listener {
	ctx, stop := context.WithCancel(context.Background())
	return &listener{
		cfg:     cfg,
		channel: channel,
		ctx:     ctx,
		stop:    stop,
		done:    make(chan struct{}),
	}
}

// subscribe registers a waiter for jobID and returns once the listener is
// listening, so that a read made after it cannot miss a notification. The
// returned channel receives a value on every notification for the job and
// after every reconnect.
func (ln *listener) subscribe(ctx context.Context, jobID string) (<-chan struct{}, func(), error) {
	ln.mu.Lock()
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

var errClosed = errors.New("postgres ledger: closed")

func (ln *listener) run() {
	defer close(ln.done)
	backoff := 50 * time.Millisecond
	for ln.ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ln.ctx, ln.cfg)
		if err == nil {
			_, err = conn.Exec(ln.ctx, "LISTEN "+pgx.Identifier{ln.channel}.Sanitize())
		}
		if err == nil {
			backoff = 50 * time.Millisecond
			ln.waiters.SetReady()
			err = ln.receive(conn)
			ln.waiters.SetNotReady()
		}
		if conn != nil {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			conn.Close(cctx)
			cancel()
		}
		select {
		case <-ln.ctx.Done():
		case <-time.After(backoff):
			backoff = min(2*backoff, 2*time.Second)
		}
	}
}

// receive dispatches notifications until the connection fails or the
// listener is closed.
func (ln *listener) receive(conn *pgx.Conn) error {
	for {
		n, err := conn.WaitForNotification(ln.ctx)
		if err != nil {
			return err
		}
		ln.waiters.Wake(n.Payload)
	}
}

func (ln *listener) close() {
	ln.stop()
	ln.mu.Lock()
	started := ln.started
	ln.mu.Unlock()
	if started {
		<-ln.done
	}
}

// Wait implements ledger.Ledger: it subscribes before it reads, and reads
// again after each notification, reconnect, or lease deadline.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	if !validID(jobID) {
		return nil, ledger.ErrNotFound
	}
	return ledger.WaitSubscribed(ctx,
		func() (<-chan struct{}, func(), error) { return l.listen.subscribe(ctx, jobID) },
		func() (*ledger.Job, time.Time, error) { return l.load(ctx, jobID) })
}
