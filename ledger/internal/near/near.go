// Package near keeps completed jobs in the process, for replays without a
// round trip to the ledger: a completed job's answer never changes before
// the job expires, so a copy answers as well as the ledger until then.
package near

import (
	"bytes"
	"container/list"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
)

// Cache holds completed jobs by key (their owner and key), most recently
// used first, bounded in count and in bytes. It is safe for concurrent
// use; the jobs it holds are shared and read-only.
type Cache struct {
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

// New returns a Cache of at most entries jobs (0 or less: it keeps
// nothing) and about maxBytes bytes.
func New(entries, maxBytes int) *Cache {
	return &Cache{max: max(entries, 0), maxBytes: maxBytes, order: list.New(), entries: make(map[string]*list.Element)}
}

// Get returns the job cached under key while it is valid at now.
func (n *Cache) Get(key string, now time.Time) *ledger.Job {
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

// Put caches j, which has a response, under key until until, evicting the
// least recently used jobs beyond the bounds.
func (n *Cache) Put(key string, j *ledger.Job, until time.Time) {
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

func (n *Cache) remove(e *list.Element) {
	ent := n.order.Remove(e).(*nearEntry)
	delete(n.entries, ent.key)
	n.bytes -= ent.size
}

// Forget drops the job cached under key, if there is one: the ledger
// removed it, or changed it.
func (n *Cache) Forget(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.entries[key]; ok {
		n.remove(e)
	}
}

// ForgetOwner drops every job of the owner ownerHash: a purge removed
// them from the ledger, so they no longer answer as the ledger would.
func (n *Cache) ForgetOwner(ownerHash []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, e := range n.entries {
		if bytes.Equal(e.Value.(*nearEntry).job.OwnerHash, ownerHash) {
			n.remove(e)
		}
	}
}

// Len returns the number of jobs held.
func (n *Cache) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.entries)
}

// Answer is the reservation of p answered by j, a completed job for p's
// owner and key that has not expired: its answer, or a mismatch when p is
// another request. ok is false when p repeats the call that started one of
// j's attempts (the gateway repeats a call whose reply it lost): a repeat
// is answered as the first call was (fsm.Reserve), by the ledger. A job
// cached without its attempts (PostgreSQL's reserve answers none) still
// tells the winner's own call by CompletedBy.
func Answer(j *ledger.Job, p *ledger.ReserveParams, now time.Time) (r ledger.Reservation, ok bool) {
	if p.Attempt.ID == j.CompletedBy {
		return ledger.Reservation{}, false
	}
	for i := range j.Attempts {
		if j.Attempts[i].ID == p.Attempt.ID {
			return ledger.Reservation{}, false
		}
	}
	if !p.Matches(j) {
		return ledger.Mismatched(j, now), true
	}
	return ledger.Reservation{Outcome: ledger.Done, Job: j, Now: now}, true
}

// Margin is how long before a job's expiry a ledger shared by several
// gateways stops answering it from the process: it covers the round trip
// between the ledger's reading of its clock and this process's.
const Margin = 5 * time.Second

// Key is the cache key of an owner's key.
func Key(ownerHash, keyHash []byte) string {
	b := make([]byte, 0, len(ownerHash)+1+len(keyHash))
	b = append(append(append(b, ownerHash...), 0), keyHash...)
	return string(b)
}

// Replayable reports whether j is completed with its whole answer stored:
// then it never changes before it expires.
func Replayable(j *ledger.Job) bool {
	return j != nil && j.State == ledger.JobCompleted && j.Response != nil && j.Response.Stored && !j.ExpiresAt.IsZero()
}

// Remember caches under key (Key of p's owner and key) the job of a
// reservation that was answered Done for p,
// with p's identity (Done means p's fingerprint matched), until margin
// before it expires. The time it has left is measured by the ledger's
// clock (the reservation's Now) and counted down on this process's, so
// the two clocks need not agree. It returns the reservation unchanged.
func (n *Cache) Remember(key string, r ledger.Reservation, p *ledger.ReserveParams, margin time.Duration) ledger.Reservation {
	if r.Outcome != ledger.Done || !Replayable(r.Job) || r.Now.IsZero() {
		return r
	}
	left := r.Job.ExpiresAt.Sub(r.Now) - margin
	if left <= 0 {
		return r
	}
	j := *r.Job
	p.Identify(&j)
	n.Put(key, &j, time.Now().Add(left))
	return r
}
