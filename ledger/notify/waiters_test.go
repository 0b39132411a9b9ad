package notify

import (
	"sync"
	"testing"
)

func woken(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func isOpen(ready <-chan struct{}) bool { return woken(ready) }

func TestWaitersWake(t *testing.T) {
	var w Waiters
	a1, cancelA1 := w.Register("a")
	a2, cancelA2 := w.Register("a")
	b, cancelB := w.Register("b")
	defer cancelA2()
	defer cancelB()

	w.Wake("a")
	w.Wake("a") // a wake-up already pending: at most one is kept
	if !woken(a1) || !woken(a2) {
		t.Fatal("waiters of a not woken")
	}
	if woken(a1) || woken(a2) {
		t.Fatal("more than one wake-up pending")
	}
	if woken(b) {
		t.Fatal("waiter of b woken by a")
	}
	w.Wake("nobody") // no waiters: nothing happens

	cancelA1()
	cancelA1() // a second cancel is harmless
	w.Wake("a")
	if woken(a1) {
		t.Fatal("cancelled waiter woken")
	}
	if !woken(a2) {
		t.Fatal("remaining waiter of a not woken")
	}
}

func TestWaitersCancelForgetsJob(t *testing.T) {
	var w Waiters
	_, cancel1 := w.Register("a")
	_, cancel2 := w.Register("a")
	cancel1()
	if len(w.waiters["a"]) != 1 {
		t.Fatalf("waiters of a = %d, want 1", len(w.waiters["a"]))
	}
	cancel2()
	if _, ok := w.waiters["a"]; ok {
		t.Fatal("job kept after its last waiter left")
	}
}

func TestWaitersReadyGate(t *testing.T) {
	var w Waiters
	shut := w.Ready()
	if isOpen(shut) {
		t.Fatal("gate open before SetReady")
	}
	w.SetNotReady() // already shut: nothing happens
	if w.Ready() != shut {
		t.Fatal("SetNotReady replaced a shut gate")
	}

	a, cancelA := w.Register("a")
	b, cancelB := w.Register("b")
	defer cancelA()
	defer cancelB()
	w.SetReady()
	if !isOpen(shut) || !isOpen(w.Ready()) {
		t.Fatal("gate shut after SetReady")
	}
	if !woken(a) || !woken(b) {
		t.Fatal("SetReady did not wake every waiter")
	}
	w.SetReady() // already open: wakes again, the gate stays open
	if !woken(a) || !woken(b) || !isOpen(w.Ready()) {
		t.Fatal("second SetReady")
	}

	w.SetNotReady()
	next := w.Ready()
	if isOpen(next) {
		t.Fatal("gate open after SetNotReady")
	}
	if !isOpen(shut) {
		t.Fatal("SetNotReady shut a gate already opened")
	}
	w.SetReady()
	if !isOpen(next) {
		t.Fatal("gate taken while shut not opened by SetReady")
	}
}

func TestWaitersConcurrent(t *testing.T) {
	var w Waiters
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				ch, cancel := w.Register("a")
				<-w.Ready()
				w.Wake("a")
				<-ch
				cancel()
			}
		}()
		go func() {
			defer wg.Done()
			for j := 0; j < 200; j++ {
				w.SetReady()
				w.SetNotReady()
				w.SetReady()
				w.Wake("b")
			}
		}()
	}
	wg.Wait()
	if len(w.waiters) != 0 {
		t.Fatalf("%d jobs left registered", len(w.waiters))
	}
}
