package ledgertest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

func testExpiredLease(t *testing.T, h Harness) {
	l := h.New(t)
	p := params(short)
	r := reserve(t, l, p, ledger.Created)
	eventually(t, "the attempt's lease runs out", func() bool {
		j := job(t, l, r.Job.ID)
		return j.State == ledger.JobUnknown && attempt(t, j, 1).State == ledger.AttemptUnknown
	})
	u := reserve(t, l, p, ledger.Unknown)
	if u.Attempt == nil || u.Attempt.Deadline.After(u.Now) {
		t.Errorf("unknown reservation: attempt %+v now %v; want a deadline passed", u.Attempt, u.Now)
	}
	// Every read agrees, without a sweep.
	page, err := l.Jobs(ctx(t), ledger.JobQuery{State: ledger.JobUnknown})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, j := range page.Jobs {
		found = found || j.ID == r.Job.ID
	}
	if !found {
		t.Errorf("listing unknown jobs misses the expired lease's job")
	}
	if _, err := l.Fail(ctx(t), r.Attempt.Ref(), "503", nil); err == nil {
		t.Errorf("Fail after the lease ran out was accepted")
	}
	wantState(t, job(t, l, r.Job.ID), ledger.JobUnknown, ledger.AttemptUnknown)
}

func testWaiterWokenByPeer(t *testing.T, h Harness) {
	l := h.New(t)
	peer := h.Peer(t, l)
	r := reserve(t, l, params(long), ledger.Created)
	done := make(chan *ledger.Job, 1)
	errc := make(chan error, 1)
	go func() {
		j, err := l.Wait(ctx(t), r.Job.ID)
		if err != nil {
			errc <- err
			return
		}
		done <- j
	}()
	complete(t, peer, r.Attempt, "via peer", true)
	select {
	case j := <-done:
		if j.State != ledger.JobCompleted || string(j.Response.Body) != "via peer" {
			t.Errorf("waiter got %+v", j)
		}
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(20 * time.Second):
		t.Fatal("waiter was not woken")
	}
	// A settled job returns at once.
	j, err := peer.Wait(ctx(t), r.Job.ID)
	if err != nil || j.State != ledger.JobCompleted {
		t.Errorf("Wait on a completed job = %v, %v", j, err)
	}
	// Each settling transition wakes a waiter: unknown and failed too.
	for _, settle := range []func(a *ledger.Attempt) error{
		func(a *ledger.Attempt) error { return peer.MarkUnknown(context.Background(), a.Ref(), "timeout") },
		func(a *ledger.Attempt) error {
			_, err := peer.Fail(context.Background(), a.Ref(), "503", nil)
			return err
		},
	} {
		r := reserve(t, l, params(long), ledger.Created)
		go func() {
			j, err := l.Wait(ctx(t), r.Job.ID)
			if err != nil {
				errc <- err
				return
			}
			done <- j
		}()
		if err := settle(r.Attempt); err != nil {
			t.Fatal(err)
		}
		select {
		case j := <-done:
			if j.State == ledger.JobPending {
				t.Errorf("waiter returned a pending job")
			}
		case err := <-errc:
			t.Fatal(err)
		case <-time.After(20 * time.Second):
			t.Fatal("waiter was not woken")
		}
	}
	// A waiter gives up with its context.
	r = reserve(t, l, params(long), ledger.Created)
	c, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Wait(c, r.Job.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with an ended context: err = %v", err)
	}
}

func testWaiterLease(t *testing.T, h Harness) {
	l := h.New(t)
	r := reserve(t, l, params(short), ledger.Created)
	j, err := l.Wait(ctx(t), r.Job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != ledger.JobUnknown {
		t.Errorf("after the lease ran out, waiter got state %s, want unknown", j.State)
	}
}
