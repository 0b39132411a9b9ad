package ledger

import "sync"

// Waiters is a registry of the goroutines waiting on jobs, for a backend
// that hears of changes on one shared connection (a LISTEN, a pub/sub
// subscription). Each waiter registers a channel for a job id; the
// connection's loop wakes the channels of a job when it hears of it, and
// wakes every channel after each (re)connect, so that each waiter reads its
// job again and nothing said while it was away is missed.
//
// Waiters also keeps a ready gate, open while the connection listens: a
// waiter registers, then waits for Ready before it reads, so that its read
// cannot miss a change. The zero value is ready for use, with the gate
// shut. Its methods are safe for concurrent use and never block.
type Waiters struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{}
	ready   chan struct{} // closed while the gate is open
	open    bool
}

// Register adds a waiter for jobID. The returned channel receives a value
// (one at most pending) on every Wake of the job and every SetReady; cancel
// removes the waiter and may be called more than once.
func (w *Waiters) Register(jobID string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.waiters == nil {
		w.waiters = make(map[string]map[chan struct{}]struct{})
	}
	set := w.waiters[jobID]
	if set == nil {
		set = make(map[chan struct{}]struct{})
		w.waiters[jobID] = set
	}
	set[ch] = struct{}{}
	w.mu.Unlock()
	cancel := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if set := w.waiters[jobID]; set != nil {
			delete(set, ch)
			if len(set) == 0 {
				delete(w.waiters, jobID)
			}
		}
	}
	return ch, cancel
}

// Wake wakes the waiters of jobID.
func (w *Waiters) Wake(jobID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.waiters[jobID] {
		wake(ch)
	}
}

// SetReady opens the gate, if it is shut, and wakes every waiter, in one
// step: call it after each (re)connect.
func (w *Waiters) SetReady() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.open {
		close(w.gate())
		w.open = true
	}
	for _, set := range w.waiters {
		for ch := range set {
			wake(ch)
		}
	}
}

// SetNotReady shuts the gate, if it is open: call it when the connection
// is lost.
func (w *Waiters) SetNotReady() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.open {
		w.ready = make(chan struct{})
		w.open = false
	}
}

// Ready returns a channel that is closed once the gate is open: at once if
// it is open now, else at the next SetReady.
func (w *Waiters) Ready() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.gate()
}

// gate returns the current gate channel, making the first; w.mu is held.
func (w *Waiters) gate() chan struct{} {
	if w.ready == nil {
		w.ready = make(chan struct{})
	}
	return w.ready
}

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default: // a wake-up is already pending
	}
}
