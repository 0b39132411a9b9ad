// Package near keeps completed jobs in the process, for replays without a
// round trip to the ledger: a completed job's answer never changes before
// the job expires, so a copy answers as well as the ledger until then.
package near

import (
	"bytes"
	"container/list"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/notify"
)

// Cache holds completed jobs by key (their owner and key), most recently
// used first, bounded in count and in bytes. It is safe for concurrent
// use; the jobs it holds are shared and read-only.
//
// A purge removes an owner's jobs from the ledger, so a copy must not
// outlive it: the instance that purges forgets the owner at once, and
// one that follows the ledger's notifications (Follow, notify.Watcher)
// forgets it when it hears the purge, and keeps nothing while it could
// miss one. A copy read from the ledger before a purge was heard is never
// kept after it (Gen).
type Cache struct {
	mu       sync.Mutex
	max      int // entries; 0 disables the tier
	maxBytes int
	bytes    int
	order    *list.List // of *nearEntry, most recent first
	entries  map[string]*list.Element

	gen   atomic.Uint64 // changed, under mu, by every purge heard and every change of live
	live  bool          // false while the notifications followed are not confirmed: nothing is kept
	start func()        // starts the notifications followed, at the first Get; nil once called
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
	return &Cache{max: max(entries, 0), maxBytes: maxBytes, order: list.New(), entries: make(map[string]*list.Element), live: true}
}

// Follow has the cache hear the purges that the ledger's notifications
// sub carries, and keep jobs only while sub's subscription is confirmed;
// the first Get starts it. Call it before sub starts and the cache is
// used.
func (n *Cache) Follow(sub *notify.Subscriber) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.live, n.start = false, sub.Start
	sub.Watch(n)
}

// Live implements notify.Watcher: while up is false, purges may go
// unheard, so the cache drops what it holds and keeps nothing.
func (n *Cache) Live(up bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gen.Add(1)
	if n.live = up; !up {
		n.order.Init()
		clear(n.entries)
		n.bytes = 0
	}
}

// Up reports whether the cache keeps jobs: it follows no notifications,
// or they are confirmed.
func (n *Cache) Up() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.live
}

// Gen returns the cache's generation: read it before reading a job from
// the ledger, and Put refuses the job if a purge was heard since.
func (n *Cache) Gen() uint64 { return n.gen.Load() }

// Keeps reports whether a job read from the ledger after Gen returned gen
// may be kept, here or in a tier shared with other instances: no purge
// was heard since, and none could have gone unheard.
func (n *Cache) Keeps(gen uint64) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.keeps(gen)
}

func (n *Cache) keeps(gen uint64) bool { return n.live && n.gen.Load() == gen }

// Get returns the job cached under key while it is valid at now.
func (n *Cache) Get(key string, now time.Time) *ledger.Job {
	n.mu.Lock()
	if !n.live || n.max <= 0 {
		start := n.start
		n.start = nil
		n.mu.Unlock()
		if start != nil {
			start()
		}
		return nil
	}
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
// least recently used jobs beyond the bounds, unless the generation is no
// longer gen (Gen, read before j was).
func (n *Cache) Put(key string, j *ledger.Job, until time.Time, gen uint64) {
	size := len(key) + len(j.Response.Body) + 512 // the job's other fields, roughly
	if n.max <= 0 || size > n.maxBytes {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.keeps(gen) {
		return
	}
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

var _ notify.Watcher = (*Cache)(nil)

// Forget drops the job cached under key, if there is one: the ledger
// removed it, or changed it.
func (n *Cache) Forget(key string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if e, ok := n.entries[key]; ok {
		n.remove(e)
	}
}

// ForgetOwner implements notify.Watcher: it drops every job of the owner
// ownerHash, which a purge removed from the ledger, and refuses the Put of
// any job read before.
func (n *Cache) ForgetOwner(ownerHash []byte) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.gen.Add(1)
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

// Bytes returns about how much memory the jobs held take.
func (n *Cache) Bytes() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.bytes
}

// Answer is the reservation of p answered by j, a completed job for p's
// owner and key that has not expired: its answer, or a mismatch when p is
// another request. ok is false when p repeats the call that started one of
// j's attempts (the gateway repeats a call whose reply it lost): a repeat
// is answered as the first call was (fsm.Reserve), by the ledger. p says
// so itself (Repeat), since a job cached without its attempts
// (PostgreSQL's reserve answers none) tells only the winner's own call, by
// CompletedBy.
func Answer(j *ledger.Job, p *ledger.ReserveParams, now time.Time) (r ledger.Reservation, ok bool) {
	if p.Repeat || p.Attempt.ID == j.CompletedBy {
		return ledger.Reservation{}, false
	}
	for i := range j.Attempts {
		if j.Attempts[i].ID == p.Attempt.ID {
			return ledger.Reservation{}, false
		}
	}
	if !p.Matches(j) {
		r = ledger.Mismatched(j, now)
	} else {
		r = ledger.Reservation{Outcome: ledger.Done, Job: j, Now: now}
	}
	r.Tier = ledger.TierProcess
	return r, true
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
// the two clocks need not agree; gen is Gen from before the reservation.
// It returns the reservation unchanged.
func (n *Cache) Remember(key string, r ledger.Reservation, p *ledger.ReserveParams, margin time.Duration, gen uint64) ledger.Reservation {
	if r.Outcome != ledger.Done || !Replayable(r.Job) || r.Now.IsZero() {
		return r
	}
	left := r.Job.ExpiresAt.Sub(r.Now) - margin
	if left <= 0 {
		return r
	}
	j := *r.Job
	p.Identify(&j)
	n.Put(key, &j, time.Now().Add(left), gen)
	return r
}
