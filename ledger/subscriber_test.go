package ledger

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
