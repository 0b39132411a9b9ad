package notify

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
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

	waiters  Waiters     // ready while a session is confirmed
	reads    sharedReads // the reads of Wait
	watchers []Watcher   // set before the subscription starts

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

// A Watcher keeps copies of jobs outside the ledger (near.Cache), which a
// purge must reach on every instance: a Subscriber tells it each purge
// the subscription carries (PurgeNotice), and whether the subscription is
// up, since purges published while it is down are never heard.
type Watcher interface {
	// Live is called with true when a session is confirmed and with false
	// when it ends.
	Live(up bool)
	// ForgetOwner is called with the owner of each purge heard.
	ForgetOwner(ownerHash []byte)
}

// purgePrefix starts a PurgeNotice; job ids never start with it.
const purgePrefix = "purge:"

// PurgeNotice is the notification a purge of the owner ownerHash
// publishes on the channel of the ledger's job ids, once the jobs are
// gone: "purge:" and the owner's hash in hex.
func PurgeNotice(ownerHash []byte) string { return purgePrefix + hex.EncodeToString(ownerHash) }

// purgedOwner returns the owner of a PurgeNotice.
func purgedOwner(payload string) ([]byte, bool) {
	h, ok := strings.CutPrefix(payload, purgePrefix)
	if !ok {
		return nil, false
	}
	owner, err := hex.DecodeString(h)
	return owner, err == nil
}

// Watch adds w to hear the purges and the state of the subscription; it
// must be called before the subscription starts (Start, or the first
// waiter). A purge is heard only while the subscription runs: call Start
// before relying on it.
func (s *Subscriber) Watch(w Watcher) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, w)
}

// Start starts the subscription if it has not started, waiter or not.
func (s *Subscriber) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.started && s.ctx.Err() == nil {
		s.started = true
		go s.run()
	}
}

// notice hands a payload to the watchers if it is a PurgeNotice, else to
// the waiters of the job it names.
func (s *Subscriber) notice(payload string) {
	if owner, ok := purgedOwner(payload); ok {
		for _, w := range s.watchers {
			w.ForgetOwner(owner)
		}
		return
	}
	s.waiters.Wake(payload)
}

// Register adds a waiter for jobID, starting the subscription if needed.
// ch receives a value on every notification for the job and after every
// (re)subscription; cancel removes the waiter. ready is closed once a
// session is confirmed (at once if one is): a read made after it cannot
// miss a notification. down reports that the last session failed, so a
// caller that may go on without notifications need not wait for ready.
func (s *Subscriber) Register(jobID string) (ch <-chan struct{}, cancel func(), ready <-chan struct{}, down bool, err error) {
	ch, _, cancel, ready, down, err = s.register(jobID)
	return ch, cancel, ready, down, err
}

// register is Register, with the number of the registration (Waiters).
func (s *Subscriber) register(jobID string) (ch <-chan struct{}, registered uint64, cancel func(), ready <-chan struct{}, down bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, 0, nil, nil, true, ErrClosed
	}
	ch, registered, cancel = s.waiters.register(jobID)
	if !s.started {
		s.started = true
		go s.run()
	}
	return ch, registered, cancel, s.waiters.Ready(), s.down, nil
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
			// The watchers first: a waiter told the subscription is
			// up may count on them.
			for _, w := range s.watchers {
				w.Live(true)
			}
			s.mu.Lock()
			s.down = false
			s.waiters.SetReady()
			s.mu.Unlock()
		}, s.notice)
		s.mu.Lock()
		s.down = true
		s.waiters.SetNotReady()
		s.mu.Unlock()
		if confirmed {
			for _, w := range s.watchers {
				w.Live(false)
			}
		}
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

// Wait is the loop behind Ledger.Wait for a ledger whose waiters share this
// subscription: it subscribes before the first read, so that no
// notification between a read and the wait is missed, reads the job until
// it settles (WaitSettled), and unsubscribes at the end. The waiters of one
// job share reads (sharedReads says when one may join another's): N
// duplicates woken by one notification make one read, not N. read reads
// the job with leases applied and returns the ledger's clock at the read;
// it runs with a context of its own, which ends when no waiter wants its
// result any more.
func (s *Subscriber) Wait(ctx context.Context, jobID string, read func(context.Context) (*ledger.Job, time.Time, error)) (*ledger.Job, error) {
	ch, registered, cancel, ready, _, err := s.register(jobID)
	if err != nil {
		return nil, err
	}
	defer func() {
		if cancel(); !s.waiters.has(jobID) {
			s.reads.drop(jobID)
		}
	}()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.ctx.Done():
		return nil, ErrClosed
	}
	return waitSettled(ctx, func(expired bool) (*ledger.Job, time.Time, <-chan struct{}, error) {
		need := s.waiters.need(ch, jobID, registered, expired)
		j, now, err := s.reads.read(ctx, jobID, need, s.waiters.stamp, read)
		return j, now, ch, err
	})
}

// WaitReads returns how many reads the waiters of Wait made: one per read
// shared, however many shared it.
func (s *Subscriber) WaitReads() uint64 { return s.reads.count.Load() }

// Up reports whether the subscription can wake waiters (see
// ledger.Listener): false only when it was started and its last
// session failed or has not been confirmed since.
func (s *Subscriber) Up() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.started || !s.down
}
