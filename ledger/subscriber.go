package ledger

import (
	"context"
	"errors"
	"sync"
	"time"
)

// A Session is one subscription on one connection (a LISTEN, a pub/sub
// channel): it calls ready once the subscription is confirmed, wake with
// the job id of each notification, and returns when the connection fails
// or ctx ends.
type Session func(ctx context.Context, ready func(), wake func(jobID string)) error

// Subscriber holds the one subscription a backend shares among all its
// waiters. It starts with the first waiter and runs sessions until closed,
// reconnecting after a failure with a backoff (50 ms, doubling to 2 s, back
// to 50 ms after a session that was confirmed); after every confirmed
// (re)subscription it wakes every waiter, so that each reads its job again
// and nothing said while it was away is missed.
type Subscriber struct {
	session Session
	lost    func(error) // called when a session ends before Close; may be nil

	waiters Waiters // ready while a session is confirmed

	mu      sync.Mutex
	started bool
	down    bool // the last session failed, or never confirmed
	ctx     context.Context
	stop    context.CancelFunc
	done    chan struct{}
}

// Backoff between sessions.
const (
	subscribeMinBackoff = 50 * time.Millisecond
	subscribeMaxBackoff = 2 * time.Second
)

// ErrClosed is returned to a waiter that subscribes to a closed Subscriber.
var ErrClosed = errors.New("ledger: closed")

// NewSubscriber returns a Subscriber that runs session; lost, if not nil,
// hears why each session ended before Close.
func NewSubscriber(session Session, lost func(error)) *Subscriber {
	ctx, stop := context.WithCancel(context.Background())
	return &Subscriber{session: session, lost: lost, ctx: ctx, stop: stop, done: make(chan struct{})}
}

// Register adds a waiter for jobID, starting the subscription if needed.
// ch receives a value on every notification for the job and after every
// (re)subscription; cancel removes the waiter. ready is closed once a
// session is confirmed (at once if one is): a read made after it cannot
// miss a notification. down reports that the last session failed, so a
// caller that may go on without notifications need not wait for ready.
func (s *Subscriber) Register(jobID string) (ch <-chan struct{}, cancel func(), ready <-chan struct{}, down bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, nil, nil, true, ErrClosed
	}
	ch, cancel = s.waiters.Register(jobID)
	if !s.started {
		s.started = true
		go s.run()
	}
	return ch, cancel, s.waiters.Ready(), s.down, nil
}

// Subscribe registers a waiter for jobID and returns once the subscription
// is confirmed, or with ctx's error, or ErrClosed.
func (s *Subscriber) Subscribe(ctx context.Context, jobID string) (<-chan struct{}, func(), error) {
	ch, cancel, ready, _, err := s.Register(jobID)
	if err != nil {
		return nil, nil, err
	}
	select {
	case <-ready:
		return ch, cancel, nil
	case <-ctx.Done():
		cancel()
		return nil, nil, ctx.Err()
	case <-s.ctx.Done():
		cancel()
		return nil, nil, ErrClosed
	}
}

// Closed is closed when the Subscriber is.
func (s *Subscriber) Closed() <-chan struct{} { return s.ctx.Done() }

func (s *Subscriber) run() {
	defer close(s.done)
	backoff := subscribeMinBackoff
	for s.ctx.Err() == nil {
		confirmed := false
		err := s.session(s.ctx, func() {
			confirmed = true
			s.mu.Lock()
			s.down = false
			s.waiters.SetReady()
			s.mu.Unlock()
		}, s.waiters.Wake)
		s.mu.Lock()
		s.down = true
		s.waiters.SetNotReady()
		s.mu.Unlock()
		if s.ctx.Err() != nil {
			return
		}
		if s.lost != nil {
			s.lost(err)
		}
		if confirmed {
			backoff = subscribeMinBackoff
		}
		t := time.NewTimer(backoff)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
			backoff = min(2*backoff, subscribeMaxBackoff)
		}
	}
}

// Close ends the subscription and waits for its session to return.
func (s *Subscriber) Close() {
	s.mu.Lock()
	s.stop()
	started := s.started
	s.mu.Unlock()
	if started {
		<-s.done
	}
}
