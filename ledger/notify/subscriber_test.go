package notify

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A subscriber reconnects after failed sessions, confirms waiters only once
// a session is confirmed, wakes them after every resubscription, and stops
// on Close.
func TestSubscriberReconnects(t *testing.T) {
	var sessions atomic.Int32
	notes := make(chan string)
	lost := make(chan error, 8)
	s := NewSubscriber(func(ctx context.Context, ready func(), wake func(string)) error {
		n := sessions.Add(1)
		if n <= 2 {
			return errors.New("connection refused") // never confirmed
		}
		ready()
		for {
			select {
			case id := <-notes:
				if id == "" {
					return errors.New("connection reset")
				}
				wake(id)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}, func(err error) { lost <- err })

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ch, unsubscribe, err := s.Subscribe(ctx, "job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer unsubscribe()
	if n := sessions.Load(); n != 3 {
		t.Fatalf("confirmed after %d sessions, want 3", n)
	}
	<-ch // the confirmation wakes every waiter
	notes <- "job-2"
	notes <- "job-1"
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("not woken by its job's notification")
	}
	notes <- "" // the connection breaks: the next session wakes the waiter
	select {
	case <-ch:
	case <-ctx.Done():
		t.Fatal("not woken after the resubscription")
	}
	if n := sessions.Load(); n != 4 {
		t.Errorf("%d sessions, want 4", n)
	}
	if len(lost) != 3 {
		t.Errorf("%d sessions reported lost, want 3", len(lost))
	}
	s.Close()
	if _, _, err := s.Subscribe(ctx, "job-3"); !errors.Is(err, ErrClosed) {
		t.Errorf("Subscribe after Close: %v", err)
	}
}

// watchLog records what a Watcher hears.
type watchLog chan string

func (w watchLog) Live(up bool)                 { w <- map[bool]string{true: "up", false: "down"}[up] }
func (w watchLog) ForgetOwner(ownerHash []byte) { w <- "purge " + string(ownerHash) }

// A purge notice reaches the watchers, never a waiter; a job id reaches
// its waiters; the watchers hear when the subscription is up and when it
// ends; Start runs the subscription with no waiter.
func TestSubscriberTellsWatchers(t *testing.T) {
	notes := make(chan string)
	s := NewSubscriber(func(ctx context.Context, ready func(), wake func(string)) error {
		ready()
		for {
			select {
			case id := <-notes:
				if id == "" {
					return errors.New("connection reset")
				}
				wake(id)
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}, nil)
	defer s.Close()
	heard := make(watchLog, 8)
	s.Watch(heard)
	s.Start()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("the watcher heard %q, want %q", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the watcher heard nothing, want %q", want)
		}
	}
	expect("up")

	ch, cancel, _, _, err := s.Register(PurgeNotice([]byte("alice"))[len(purgePrefix):])
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	notes <- PurgeNotice([]byte("alice"))
	expect("purge alice")
	select {
	case <-ch:
		t.Fatal("a purge notice woke a waiter")
	default:
	}
	notes <- "" // the session ends
	expect("down")
	expect("up")
}

// TestSubscriberUp: a subscription nothing started yet reads as up; one
// whose connection fails reads as down until a session is confirmed again.
func TestSubscriberUp(t *testing.T) {
	fail := make(chan bool, 1)
	fail <- true
	s := NewSubscriber(func(ctx context.Context, ready func(), _ func(string)) error {
		select {
		case f := <-fail:
			if f {
				return errors.New("connection refused")
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		ready()
		<-ctx.Done()
		return ctx.Err()
	}, nil)
	defer s.Close()
	if !s.Up() {
		t.Fatal("an idle subscriber reads as down")
	}
	_, cancel, _, _, err := s.Register("job-1")
	if err != nil {
		t.Fatal(err)
	}
	defer cancel()
	waitFor(t, "the failed session reads as down", func() bool { return !s.Up() })
	fail <- false
	waitFor(t, "the next session reads as up", s.Up)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
