package file

import (
	"fmt"
	"sync"

	bolt "go.etcd.io/bbolt"
)

// groupCommit commits writes in groups: each write joins the queue, and one
// goroutine commits everything queued in one transaction as soon as the
// previous commit is done. A commit costs two fsyncs whatever it holds, so
// under load many writes share them; alone, a write waits for no timer
// (bbolt's Batch waits up to MaxBatchDelay to fill a batch).
type groupCommit struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*pendingWrite
	running bool // a goroutine is committing
}

type pendingWrite struct {
	fn   func(*bolt.Tx) error
	done chan error
}

// do runs fn in a read-write transaction shared with other writes and
// returns once it is committed. fn may run more than once (when a group
// fails, each of its writes is retried alone, so that one failing write
// fails only itself): it must set its results afresh each time.
func (g *groupCommit) do(fn func(*bolt.Tx) error) error {
	w := &pendingWrite{fn: fn, done: make(chan error, 1)}
	g.mu.Lock()
	g.queue = append(g.queue, w)
	if !g.running {
		g.running = true
		go g.commitAll()
	}
	g.mu.Unlock()
	return <-w.done
}

// commitAll commits the queue, group after group, until it is empty.
func (g *groupCommit) commitAll() {
	for {
		g.mu.Lock()
		group := g.queue
		g.queue = nil
		if len(group) == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		g.mu.Unlock()
		g.commit(group)
	}
}

func (g *groupCommit) commit(group []*pendingWrite) {
	err := g.db.Update(func(tx *bolt.Tx) error {
		for _, w := range group {
			if err := call(w.fn, tx); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil || len(group) == 1 {
		for _, w := range group {
			w.done <- err
		}
		return
	}
	for _, w := range group {
		w.done <- g.db.Update(func(tx *bolt.Tx) error { return call(w.fn, tx) })
	}
}

// call runs fn, turning a panic into an error: the committing goroutine
// serves every writer and must not die with one.
func call(fn func(*bolt.Tx) error, tx *bolt.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("file ledger: write panicked: %v", p)
		}
	}()
	return fn(tx)
}
