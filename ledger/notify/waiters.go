package notify

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
//
// Every event (a registration, a Wake, a SetReady) takes the next number of
// one sequence, and the registry remembers the number of each waiter's
// registration, of each job's last wake and of the last SetReady: a read
// that started after a waiter's events (stamp, since) tells it everything
// they could have told it, which is what lets waiters share reads.
type Waiters struct {
	mu      sync.Mutex
	waiters map[string]map[chan struct{}]uint64 // by job: each channel's registration
	woken   map[string]uint64                   // by job with waiters: its last Wake
	seq     uint64                              // the last event's number
	readied uint64                              // the last SetReady's number
	ready   chan struct{}                       // closed while the gate is open
	open    bool
}

// Register adds a waiter for jobID. The returned channel receives a value
// (one at most pending) on every Wake of the job and every SetReady; cancel
// removes the waiter and may be called more than once.
func (w *Waiters) Register(jobID string) (<-chan struct{}, func()) {
	ch, _, cancel := w.register(jobID)
	return ch, cancel
}

// register is Register, with the number of the registration.
func (w *Waiters) register(jobID string) (<-chan struct{}, uint64, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.waiters == nil {
		w.waiters = make(map[string]map[chan struct{}]uint64)
		w.woken = make(map[string]uint64)
	}
	set := w.waiters[jobID]
	if set == nil {
		set = make(map[chan struct{}]uint64)
		w.waiters[jobID] = set
	}
	w.seq++
	at := w.seq
	set[ch] = at
	w.mu.Unlock()
	cancel := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if set := w.waiters[jobID]; set != nil {
			delete(set, ch)
			if len(set) == 0 {
				delete(w.waiters, jobID)
				delete(w.woken, jobID)
			}
		}
	}
	return ch, at, cancel
}

// has reports whether jobID has waiters.
func (w *Waiters) has(jobID string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.waiters[jobID]) > 0
}

// Wake wakes the waiters of jobID.
func (w *Waiters) Wake(jobID string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	set := w.waiters[jobID]
	if len(set) == 0 {
		return // no waiter to tell: one that registers later reads after it
	}
	w.seq++
	w.woken[jobID] = w.seq
	for ch := range set {
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
	w.seq++
	w.readied = w.seq
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

// stamp returns the number of the last event: a read that starts after
// stamp returns started after every event numbered up to it.
func (w *Waiters) stamp() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seq
}

// need returns the stamp a read must have for the waiter of jobID with
// channel ch, registered as registered, to take its result, and empties ch,
// in one step. The stamp is the number of the last event that may have told
// the waiter something: its registration, the last SetReady and the job's
// last Wake, or, with expired (the waiter saw a lease deadline pass), a new
// event. A read stamped at least as high started after all of them, so the
// waiter misses nothing by taking its result, and a wake-up pending in ch
// came from one of them: it is spent. Taking both under the lock that Wake
// and SetReady hold keeps a wake-up from landing between them, where it
// would be left pending although the stamp covers it, and send the waiter
// to read again for nothing.
func (w *Waiters) need(ch <-chan struct{}, jobID string, registered uint64, expired bool) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-ch:
	default:
	}
	if expired {
		w.seq++
		return w.seq
	}
	return max(registered, w.readied, w.woken[jobID])
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
