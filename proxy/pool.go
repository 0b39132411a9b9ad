package proxy

import (
	"time"
)

// attemptStack is about the stack an attempt's handlers need (Caddy's
// reverse_proxy calls run deep).
const attemptStack = 16 << 10

// growStack gives a new goroutine that will run an attempt its stack in
// one step, while the stack is still shallow and cheap to copy, instead of
// doubling it four or five times deep inside the handlers, each time
// copying every frame: that was 8% of a fresh request's CPU.
//
//go:noinline
func growStack(i int) byte {
	var frame [attemptStack]byte
	return frame[i]
}

// A Middleware's runners run its runs and tries on goroutines kept
// between them, so that each does not start a goroutine and grow its
// stack again: a stack of that size (32 KiB with growStack's frame) is
// past the ones Go keeps cached per processor, and each took a lock on
// the heap to allocate and a copy of its frames, 3.5% of a fresh
// request's CPU in the profile. A goroutine left idle for runnerIdle ends.
// The pool is the Middleware's, not the process's: its goroutines live
// with the Middleware's own (in a testing/synctest bubble, a channel made
// outside it would hold the bubble's clock still).

const runnerIdle = 10 * time.Second

// pool hands functions to idle goroutines of its own, starting one when
// none is idle: a function never waits for another to end.
type pool struct {
	tasks chan func() // unbuffered: a send succeeds only to an idle goroutine
}

// run runs f on an idle goroutine, or on a new one.
func (p *pool) run(f func()) {
	select {
	case p.tasks <- f:
	default:
		go p.work(f)
	}
}

func (p *pool) work(f func()) {
	growStack(0)
	idle := time.NewTimer(runnerIdle)
	defer idle.Stop()
	for {
		f()
		f = nil // nothing of the last run is kept while idle
		idle.Reset(runnerIdle)
		select {
		case f = <-p.tasks:
		case <-idle.C:
			return
		}
	}
}
