package memory

import (
	"container/heap"
	"slices"

	"github.com/onejob/onejob/ledger"
)

// index holds what a sweep looks at, so that it does not walk every job:
// the jobs that may still change by themselves (not settled: an attempt's
// lease can run out) and the jobs by expiry, earliest first. An expiry
// that changed or a job removed leaves its old entry in the heap, dropped
// when it comes up.
type index struct {
	unsettled map[*entry]struct{}
	expiry    expiryHeap
}

type expiring struct {
	at    int64  // Unix nanoseconds
	place uint32 // the entry's, in the slab
}

type expiryHeap []expiring

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].at < h[j].at }
func (h expiryHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)        { *h = append(*h, x.(expiring)) }
func (h *expiryHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// hold makes j the entry's job, as itself or (settled) as its record rec,
// and indexes it. l.mu must be held.
func (l *Ledger) hold(e *entry, j *ledger.Job, rec []byte) {
	before := e.expiresAt
	e.expiresAt = 0
	if !j.ExpiresAt.IsZero() {
		e.expiresAt = j.ExpiresAt.UnixNano()
	}
	if e.expiresAt != 0 && e.expiresAt != before {
		heap.Push(&l.index.expiry, expiring{at: e.expiresAt, place: e.place})
	}
	if rec != nil {
		e.job, e.packed = nil, rec
		delete(l.index.unsettled, e)
	} else {
		e.job, e.packed = j, nil
		l.index.unsettled[e] = struct{}{}
	}
}

// unindex forgets a removed entry. l.mu must be held.
func (l *Ledger) unindex(e *entry) {
	delete(l.index.unsettled, e)
}

// removeDue removes the entries whose expiry has come, at most limit of
// them, and returns how many it removed. A popped expiry that is not its place's entry's (the
// expiry changed since, or the entry was removed, its place perhaps taken
// by another since) is dropped. l.mu must be held.
func (l *Ledger) removeDue(now int64, limit int) (removed int) {
	h := &l.index.expiry
	for h.Len() > 0 && (*h)[0].at <= now && removed < limit {
		x := heap.Pop(h).(expiring)
		if !l.slab.held(x.place) {
			continue // a place the slab gave up (shrink)
		}
		if e := l.slab.at(x.place); e.expiresAt == x.at {
			l.remove(e)
			removed++
		}
	}
	return removed
}

// shrink moves the entries past the whole chunks that the entries held
// need into free places before them, and gives up the chunks left empty:
// after a burst of jobs has expired, the slab holds about as many places
// as jobs. An entry moved is named and indexed at its new place; the
// expiry index's entries for the old places are dropped when they come
// up. l.mu must be held.
func (l *Ledger) shrink() {
	s := &l.slab
	held := s.next - uint32(len(s.free))
	keep := (held + chunkEntries - 1) / chunkEntries * chunkEntries
	var holes []uint32 // free places before keep
	for _, n := range s.free {
		if n < keep {
			holes = append(holes, n)
		}
	}
	for n := keep; n < s.next; n++ {
		if !s.held(n) {
			continue
		}
		hole := holes[len(holes)-1]
		holes = holes[:len(holes)-1]
		from, to := s.at(n), s.at(hole)
		*to = *from
		to.place = hole
		l.byKey.put(s, to)
		l.byID.put(s, to)
		if _, ok := l.index.unsettled[from]; ok {
			delete(l.index.unsettled, from)
			l.index.unsettled[to] = struct{}{}
		}
		if to.expiresAt != 0 {
			heap.Push(&l.index.expiry, expiring{at: to.expiresAt, place: to.place})
		}
		*from = entry{}
	}
	s.chunks = slices.Clip(s.chunks[:keep/chunkEntries])
	s.next, s.free = keep, holes
}
