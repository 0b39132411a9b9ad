package cache

import (
	"container/list"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
)

// near is the cache's tier in this process: the replies it read from Redis
// or wrote there lately, most recently used first, bounded in count and in
// bytes. A completed job's reply never changes before it expires, so a
// copy here answers as well as Redis until the same moment (its expiry less
// the margin), without a round trip.
type near struct {
	mu       sync.Mutex
	max      int // entries; 0 disables the tier
	maxBytes int
	bytes    int
	order    *list.List // of *nearEntry, most recent first
	entries  map[string]*list.Element
}

type nearEntry struct {
	key   string
	job   *ledger.Job // read-only
	until time.Time
	size  int
}

func newNear(entries, maxBytes int) *near {
	return &near{max: max(entries, 0), maxBytes: maxBytes, order: list.New(), entries: make(map[string]*list.Element)}
}

// get returns the reply cached under key while it is valid at now.
func (n *near) get(key string, now time.Time) *ledger.Job {
	if n.max <= 0 {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	e, ok := n.entries[key]
	if !ok {
		return nil
	}
	ent := e.Value.(*nearEntry)
	if !now.Before(ent.until) {
		n.remove(e)
		return nil
	}
	n.order.MoveToFront(e)
	return ent.job
}

// put caches j under key until until, evicting the least recently used
// replies beyond the bounds.
func (n *near) put(key string, j *ledger.Job, until time.Time) {
	size := len(key) + len(j.Response.Body) + 512 // the job's other fields, roughly
	if n.max <= 0 || size > n.maxBytes {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.entries[key]; ok {
		n.remove(e)
	}
	n.entries[key] = n.order.PushFront(&nearEntry{key: key, job: j, until: until, size: size})
	n.bytes += size
	for len(n.entries) > n.max || n.bytes > n.maxBytes {
		n.remove(n.order.Back())
	}
}

func (n *near) remove(e *list.Element) {
	ent := n.order.Remove(e).(*nearEntry)
	delete(n.entries, ent.key)
	n.bytes -= ent.size
}

func (n *near) len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.entries)
}
