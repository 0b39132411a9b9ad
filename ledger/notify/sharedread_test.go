package notify

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// The tests of Subscriber.Wait drive a fake store: each read the waiters
// make arrives on calls, and waits for the test's reply. The tests wait for
// conditions (nothing is timed): a read that should not happen would
// leave a test waiting, and the checks below look for it first.

type readReply struct {
	job *ledger.Job
	err error
}

type readCall struct{ reply chan readReply }

type fakeStore struct{ calls chan readCall }

func newFakeStore() *fakeStore { return &fakeStore{calls: make(chan readCall)} }

func (f *fakeStore) read(ctx context.Context) (*ledger.Job, time.Time, error) {
	c := readCall{reply: make(chan readReply, 1)}
	select {
	case f.calls <- c:
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
	select {
	case r := <-c.reply:
		return r.job, time.Now(), r.err
	case <-ctx.Done():
		return nil, time.Time{}, ctx.Err()
	}
}

func pendingJob() *ledger.Job   { return &ledger.Job{ID: "j", State: ledger.JobPending} }
func completedJob() *ledger.Job { return &ledger.Job{ID: "j", State: ledger.JobCompleted} }

// fakeSubscriber returns a Subscriber whose session confirms once confirm
// is closed (nil: at once) and wakes the ids sent on notes.
func fakeSubscriber(t *testing.T, confirm chan struct{}, notes chan string) *Subscriber {
	s := NewSubscriber(func(ctx context.Context, ready func(), wake func(string)) error {
		if confirm != nil {
			select {
			case <-confirm:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		ready()
		for {
			select {
			case id := <-notes:
				wake(id)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}, nil)
	t.Cleanup(s.Close)
	return s
}

// sharers returns how many waiters wait for the latest read of jobID in
// flight (0: none in flight).
func sharers(s *Subscriber, jobID string) int {
	s.reads.mu.Lock()
	defer s.reads.mu.Unlock()
	if f := s.reads.flights[jobID]; f != nil {
		return f.sharers
	}
	return 0
}

// registered returns how many waiters of jobID are registered.
func registered(s *Subscriber, jobID string) int {
	s.waiters.mu.Lock()
	defer s.waiters.mu.Unlock()
	return len(s.waiters.waiters[jobID])
}

// nextRead returns the next read of the store, failing the test if the
// waiters of jobID join the read in flight (which then has want sharers)
// instead of starting it.
func nextRead(t *testing.T, s *Subscriber, store *fakeStore, jobID string, want int) readCall {
	t.Helper()
	for {
		select {
		case c := <-store.calls:
			return c
		default:
		}
		if sharers(s, jobID) >= want {
			t.Fatalf("a waiter joined a read that started before what it reacts to")
		}
		time.Sleep(time.Millisecond)
	}
}

type waitResult struct {
	job *ledger.Job
	err error
}

func wait(ctx context.Context, s *Subscriber, store *fakeStore, out chan<- waitResult) {
	go func() {
		j, err := s.Wait(ctx, "j", store.read)
		out <- waitResult{j, err}
	}()
}

// 1,000 waiters of one job, confirmed together and woken by one
// notification, make one read for the confirmation and one for the
// notification, and each gets the job.
func TestSubscriberWaitersShareOneRead(t *testing.T) {
	const n = 1000
	confirm, notes := make(chan struct{}), make(chan string)
	s := fakeSubscriber(t, confirm, notes)
	store := newFakeStore()
	out := make(chan waitResult, n)
	for range n {
		wait(context.Background(), s, store, out)
	}
	waitFor(t, "every waiter registered", func() bool { return registered(s, "j") == n })
	close(confirm)
	c := <-store.calls
	waitFor(t, "every waiter shares the read", func() bool { return sharers(s, "j") == n })
	c.reply <- readReply{job: pendingJob()}

	notes <- "j"
	c = <-store.calls
	waitFor(t, "every waiter shares the read", func() bool { return sharers(s, "j") == n })
	c.reply <- readReply{job: completedJob()}

	seen := map[*ledger.Job]bool{}
	for range n {
		r := <-out
		if r.err != nil || r.job.State != ledger.JobCompleted {
			t.Fatalf("waiter: %v %+v", r.err, r.job)
		}
		if seen[r.job] {
			t.Fatal("two waiters got the same copy of the job")
		}
		seen[r.job] = true
	}
	if got := s.WaitReads(); got != 2 {
		t.Errorf("%d reads for %d waiters, want 2 (the confirmation's and the notification's)", got, n)
	}
	waitFor(t, "the last read forgotten once every waiter left", func() bool {
		s.reads.mu.Lock()
		defer s.reads.mu.Unlock()
		return len(s.reads.flights) == 0
	})
}

// A waiter that subscribed after a read of its job started does not join
// it: the read may have seen the job before the waiter could hear of a
// change.
func TestSubscriberWaitNotJoiningEarlierRead(t *testing.T) {
	s := fakeSubscriber(t, nil, nil)
	store := newFakeStore()
	out := make(chan waitResult, 2)
	wait(context.Background(), s, store, out)
	first := <-store.calls
	wait(context.Background(), s, store, out)
	second := nextRead(t, s, store, "j", 2)
	first.reply <- readReply{job: completedJob()}
	second.reply <- readReply{job: completedJob()}
	for range 2 {
		if r := <-out; r.err != nil || r.job.State != ledger.JobCompleted {
			t.Fatalf("waiter: %v %+v", r.err, r.job)
		}
	}
	if got := s.WaitReads(); got != 2 {
		t.Errorf("%d reads, want 2", got)
	}
}

// A notification that comes while a read is in flight makes the next read
// of a waiter it woke a new one.
func TestSubscriberWaitWokenDuringRead(t *testing.T) {
	notes := make(chan string)
	s := fakeSubscriber(t, nil, notes)
	store := newFakeStore()
	out := make(chan waitResult, 2)
	wait(context.Background(), s, store, out)
	(<-store.calls).reply <- readReply{job: pendingJob()} // the first waiter waits
	wait(context.Background(), s, store, out)
	inFlight := <-store.calls // the second waiter's first read
	notes <- "j"
	woken := nextRead(t, s, store, "j", 2)
	woken.reply <- readReply{job: completedJob()}
	inFlight.reply <- readReply{job: completedJob()}
	for range 2 {
		if r := <-out; r.err != nil || r.job.State != ledger.JobCompleted {
			t.Fatalf("waiter: %v %+v", r.err, r.job)
		}
	}
}

// A waiter whose lease deadline passed while a read was in flight does not
// join that read: it started before the waiter saw the deadline pass.
func TestSubscriberWaitExpiredDuringRead(t *testing.T) {
	s := fakeSubscriber(t, nil, nil)
	store := newFakeStore()
	out := make(chan waitResult, 2)
	wait(context.Background(), s, store, out)
	first := <-store.calls
	wait(context.Background(), s, store, out)
	inFlight := nextRead(t, s, store, "j", 2)
	// The first waiter's job has a lease that ran out already.
	leased := pendingJob()
	leased.Attempts = []ledger.Attempt{{State: ledger.AttemptStarting, Deadline: time.Now().Add(-time.Second)}}
	first.reply <- readReply{job: leased}
	expired := nextRead(t, s, store, "j", 2)
	expired.reply <- readReply{job: completedJob()}
	inFlight.reply <- readReply{job: completedJob()}
	for range 2 {
		if r := <-out; r.err != nil || r.job.State != ledger.JobCompleted {
			t.Fatalf("waiter: %v %+v", r.err, r.job)
		}
	}
}

// The error of a shared read reaches every waiter that shared it.
func TestSubscriberWaitSharedError(t *testing.T) {
	confirm := make(chan struct{})
	s := fakeSubscriber(t, confirm, nil)
	store := newFakeStore()
	out := make(chan waitResult, 2)
	wait(context.Background(), s, store, out)
	wait(context.Background(), s, store, out)
	waitFor(t, "both waiters registered", func() bool { return registered(s, "j") == 2 })
	close(confirm)
	c := <-store.calls
	waitFor(t, "both waiters share the read", func() bool { return sharers(s, "j") == 2 })
	broken := errors.New("connection reset")
	c.reply <- readReply{err: broken}
	for range 2 {
		if r := <-out; !errors.Is(r.err, broken) {
			t.Fatalf("waiter: %v, want %v", r.err, broken)
		}
	}
	if got := s.WaitReads(); got != 1 {
		t.Errorf("%d reads, want 1", got)
	}
}

// A waiter that gives up leaves a shared read to the others; the read ends
// only when every sharer gave up.
func TestSubscriberWaitSharerGivesUp(t *testing.T) {
	confirm := make(chan struct{})
	s := fakeSubscriber(t, confirm, nil)
	store := newFakeStore()
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp, stayed := make(chan waitResult, 1), make(chan waitResult, 1)
	wait(ctx, s, store, gaveUp)
	wait(context.Background(), s, store, stayed)
	waitFor(t, "both waiters registered", func() bool { return registered(s, "j") == 2 })
	close(confirm)
	c := <-store.calls
	waitFor(t, "both waiters share the read", func() bool { return sharers(s, "j") == 2 })
	cancel()
	if r := <-gaveUp; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the waiter that gave up: %v", r.err)
	}
	c.reply <- readReply{job: completedJob()}
	if r := <-stayed; r.err != nil || r.job.State != ledger.JobCompleted {
		t.Fatalf("the waiter that stayed: %v %+v", r.err, r.job)
	}

	// Alone, a waiter that gives up ends the read.
	ctx, cancel = context.WithCancel(context.Background())
	wait(ctx, s, store, gaveUp)
	<-store.calls
	cancel()
	if r := <-gaveUp; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the waiter alone: %v", r.err)
	}
	waitFor(t, "the read ended", func() bool { return sharers(s, "j") == 0 })
}

// A waiter that comes to a read after it ended takes its result when the
// read started late enough for it, as it would have joined it in flight:
// the waiters woken by one notification make one read, however slowly
// they get to it. A read that failed is not kept, and the result goes once
// the job's last waiter left.
func TestSharedReadsKeepsFinishedRead(t *testing.T) {
	var r sharedReads
	fail := false
	read := func(context.Context) (*ledger.Job, time.Time, error) {
		if fail {
			return nil, time.Time{}, errors.New("connection reset")
		}
		return pendingJob(), time.Now(), nil
	}
	at := func(n uint64) func() uint64 { return func() uint64 { return n } }
	ctx := context.Background()
	first, _, _ := r.read(ctx, "j", 7, at(7), read)
	late, _, err := r.read(ctx, "j", 7, at(7), read)
	if err != nil || late == nil || late == first {
		t.Fatalf("late waiter: %v %p (first %p): want its own copy", err, late, first)
	}
	if got := r.count.Load(); got != 1 {
		t.Fatalf("%d reads, want 1: the late waiter read again", got)
	}
	r.read(ctx, "j", 8, at(8), read) // told of a later event: a read of its own
	if got := r.count.Load(); got != 2 {
		t.Fatalf("%d reads, want 2", got)
	}
	fail = true
	r.read(ctx, "j", 9, at(9), read)
	r.read(ctx, "j", 9, at(9), read)
	if got := r.count.Load(); got != 4 {
		t.Fatalf("%d reads, want 4: a failed read was kept", got)
	}
	fail = false
	r.read(ctx, "j", 9, at(9), read)
	r.drop("j")
	r.read(ctx, "j", 9, at(9), read)
	if got := r.count.Load(); got != 6 {
		t.Fatalf("%d reads, want 6: the result outlived the waiters", got)
	}
}
