// Package memory is a Ledger held in process memory: for tests and demos.
// Nothing survives a restart.
package memory

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/record"
	"github.com/onejob/onejob/ledger/notify"
)

// Ledger is an in-memory ledger. The zero value is not usable: call New.
type Ledger struct {
	fsm.Applier // the transitions of one job, over update

	now func() time.Time

	mu      sync.Mutex
	slab    slab
	byKey   table // by identity: owner hash + key hash
	byID    table
	index   index
	replays *near.Cache // settled jobs replayed lately, decoded, by identity
}

// entry is one job. A job that may still change is held as itself; once
// it settles (completed, its answer stored, no attempt in flight: how
// nearly every job spends its retention) it is held as its record, one
// slice with no pointers in it, which the garbage collector does not scan.
// A transition that changes a settled job (a lookup marking a late attempt
// lost, say) decodes it and stores it again.
type entry struct {
	expiresAt int64 // Unix nanoseconds; 0: no expiry yet
	job       *ledger.Job
	packed    []byte        // the job's record when job is nil
	changed   chan struct{} // made for the first waiter, closed on the next change
	place     uint32        // in the slab

	// The job's identity and id, one after the other: in text when they
	// fit, as the gateway's hashes and ids do, else in long.
	keyLen, idLen uint32
	long          string
	text          [112]byte
}

// key returns the job's identity, and id its id: both read from the
// entry, valid while it holds the job (a caller that keeps one copies it).
func (e *entry) key() string { return e.both()[:e.keyLen] }
func (e *entry) id() string  { return e.both()[e.keyLen:] }

func (e *entry) both() string {
	if e.long != "" {
		return e.long
	}
	return unsafe.String(&e.text[0], int(e.keyLen)+int(e.idLen))
}

// load returns the entry's job, decoded when it is settled: a caller that
// changes it calls store.
func (e *entry) load() (*ledger.Job, error) {
	if e.job != nil {
		return e.job, nil
	}
	j, err := record.Decode(e.packed)
	if err != nil {
		return nil, fmt.Errorf("memory ledger: job %s: %w", e.id(), err)
	}
	return j, nil
}

// store keeps j as the entry's job, packed when it is settled. l.mu must
// be held.
func (l *Ledger) store(e *entry, j *ledger.Job) {
	var rec []byte
	if fsm.AtRest(j) {
		rec = record.Encode(j)
	}
	l.hold(e, j, rec)
}

// expired is the job's Expired, read without decoding it.
func (e *entry) expired(now time.Time) bool {
	return e.expiresAt != 0 && now.UnixNano() >= e.expiresAt
}

// wait returns the channel closed on the job's next change.
func (e *entry) wait() <-chan struct{} {
	if e.changed == nil {
		e.changed = make(chan struct{})
	}
	return e.changed
}

// notify wakes the job's waiters. l.mu must be held.
func (e *entry) notify() {
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
}

// Option configures a Ledger.
type Option func(*Ledger)

// WithClock sets the ledger's clock, by which deadlines and expiry are
// judged. The default is time.Now.
func WithClock(now func() time.Time) Option {
	return func(l *Ledger) { l.now = now }
}

// New returns an empty in-memory ledger.
func New(opts ...Option) *Ledger {
	l := &Ledger{
		now:     time.Now,
		byKey:   newTable((*entry).key),
		byID:    newTable((*entry).id),
		index:   index{unsettled: make(map[*entry]struct{})},
		replays: near.New(10000, 64<<20),
	}
	l.Applier = fsm.Applier{Update: l.update}
	for _, o := range opts {
		o(l)
	}
	return l
}

// identity is the key of a job's (owner, key) in byKey.
func identity(owner, key []byte) string {
	return string(appendIdentity(nil, owner, key))
}

// appendIdentity appends the identity of (owner, key) to b: a lookup
// converts it to a string in the map index, without allocating.
func appendIdentity(b, owner, key []byte) []byte {
	b = append(b, owner...)
	b = append(b, 0)
	return append(b, key...)
}

// add places a new entry for job id with identity key, and names it.
// l.mu must be held.
func (l *Ledger) add(key []byte, id string) *entry {
	e := l.slab.place()
	e.keyLen, e.idLen = uint32(len(key)), uint32(len(id))
	if len(key)+len(id) <= len(e.text) {
		copy(e.text[copy(e.text[:], key):], id)
	} else {
		e.long = string(key) + id
	}
	l.byKey.put(&l.slab, e)
	l.byID.put(&l.slab, e)
	return e
}

// Reserve implements ledger.Ledger.
func (l *Ledger) Reserve(_ context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	now := l.now()
	var buf [160]byte
	key := appendIdentity(buf[:0], p.OwnerHash, p.KeyHash)
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byKey.get(&l.slab, unsafe.String(unsafe.SliceData(key), len(key)))
	if e != nil && e.expired(now) {
		l.remove(e)
		e = nil
	}
	if e == nil {
		j := fsm.NewJob(p, now)
		e = l.add(key, j.ID)
		l.store(e, j)
		a := j.Attempts[0]
		return ledger.Reservation{Outcome: ledger.Created, Job: j.Clone(), Attempt: &a, Now: now}, nil
	}
	if e.job == nil {
		// Settled: a replay, answered from the jobs replayed lately when
		// it is one of them.
		if j := l.replays.Get(e.key(), now); j != nil {
			if r, ok := near.Answer(j, &p, now); ok {
				return r, nil
			}
		}
	}
	j, err := e.load()
	if err != nil {
		return ledger.Reservation{}, err
	}
	r, changed := fsm.Reserve(j, p, now)
	switch {
	case changed:
		l.store(e, j)
		e.notify()
	case r.Outcome == ledger.Done && e.job == nil:
		// Under the entry's lock: a removal (Forget) cannot come between.
		l.replays.Put(strings.Clone(e.key()), j, j.ExpiresAt, l.replays.Gen())
	}
	return r, nil
}

// remove forgets the entry and wakes its waiters. l.mu must be held.
func (l *Ledger) remove(e *entry) {
	l.byKey.remove(e)
	l.byID.remove(e)
	l.unindex(e)
	l.replays.Forget(e.key())
	e.notify()
	l.slab.release(e)
}

// update runs fn on the job under the lock, stores what fn left and wakes
// waiters.
func (l *Ledger) update(jobID string, fn func(j *ledger.Job, now time.Time) error) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	// Read under the lock: transitions happen in the clock's order, so a
	// repeat's time (Completion.Job.ReadAt) is never before the state it
	// returns.
	now := l.now()
	e := l.byID.get(&l.slab, jobID)
	if e == nil || e.expired(now) {
		return ledger.ErrNotFound
	}
	if e.job == nil {
		l.replays.Forget(e.key()) // the copy replays read would be older
	}
	j, err := e.load()
	if err != nil {
		return err
	}
	outcome := fn(j, now)
	l.store(e, j)
	e.notify()
	return outcome
}

// current returns the entry's job with leases applied (waking its
// waiters when one ran out), for a read; the job may be the entry's own.
// l.mu must be held.
func (l *Ledger) current(e *entry, now time.Time) (*ledger.Job, error) {
	j, err := e.load()
	if err != nil {
		return nil, err
	}
	if e.job != nil && fsm.ApplyLeases(j, now) > 0 {
		l.store(e, j)
		e.notify()
	}
	return j, nil
}

// get returns a snapshot of the job with leases applied, and the channel
// that is closed on its next change.
func (l *Ledger) get(jobID string) (*ledger.Job, <-chan struct{}, error) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.byID.get(&l.slab, jobID)
	if e == nil || e.expired(now) {
		return nil, nil, ledger.ErrNotFound
	}
	j, err := l.current(e, now)
	if err != nil {
		return nil, nil, err
	}
	return snapshot(e, j), e.wait(), nil
}

// snapshot returns j, the job of e, as a copy the caller may keep: a job
// decoded for the read is one already.
func snapshot(e *entry, j *ledger.Job) *ledger.Job {
	if j == e.job {
		return j.Clone()
	}
	return j
}

// Job implements ledger.Ledger.
func (l *Ledger) Job(_ context.Context, jobID string) (*ledger.Job, error) {
	now := l.now()
	j, _, err := l.get(jobID)
	if j != nil {
		j.ReadAt = now
	}
	return j, err
}

// Find implements ledger.Ledger.
func (l *Ledger) Find(_ context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	now := l.now()
	l.mu.Lock()
	e := l.byKey.get(&l.slab, identity(ownerHash, keyHash))
	if e == nil || e.expired(now) {
		l.mu.Unlock()
		return nil, ledger.ErrNotFound
	}
	j, err := l.current(e, now)
	if err == nil {
		j = snapshot(e, j)
	}
	l.mu.Unlock()
	if err != nil {
		return nil, err
	}
	j.ReadAt = now
	return j, nil
}

// Jobs implements ledger.Ledger. The candidates are gathered under the
// lock without decoding a settled job (it is completed: a query for
// another state passes it by), sorted newest first without the lock, and
// read under the lock again until the page is full.
func (l *Ledger) Jobs(_ context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	limit := ledger.EffectiveLimit(q.Limit)
	now := l.now()
	settledToo := q.State == "" || q.State == ledger.JobCompleted
	var candidates []string // ids
	l.mu.Lock()
	for e := range l.byID.all(&l.slab) {
		if id := e.id(); (q.Before == "" || id < q.Before) && (settledToo || e.job != nil) {
			candidates = append(candidates, strings.Clone(id))
		}
	}
	l.mu.Unlock()
	slices.SortFunc(candidates, func(a, b string) int { return strings.Compare(b, a) })

	var page ledger.JobPage
	l.mu.Lock()
	for _, id := range candidates {
		e := l.byID.get(&l.slab, id)
		if e == nil || e.expired(now) {
			continue // removed since
		}
		j, err := l.current(e, now)
		if err != nil {
			l.mu.Unlock()
			return ledger.JobPage{}, err
		}
		if !fsm.Matches(j, q) {
			continue
		}
		if len(page.Jobs) == limit {
			page.Next = page.Jobs[limit-1].ID
			break
		}
		page.Jobs = append(page.Jobs, snapshot(e, j))
	}
	l.mu.Unlock()
	return page, nil
}

// Wait implements ledger.Ledger.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	return notify.WaitSettled(ctx, func() (*ledger.Job, time.Time, <-chan struct{}, error) {
		j, changed, err := l.get(jobID)
		return j, l.now(), changed, err
	})
}

// Sweep implements ledger.Ledger: it reads the jobs whose expiry came and
// the jobs not settled (see index), not every job.
func (l *Ledger) Sweep(_ context.Context, limit int) (ledger.SweepStats, error) {
	var st ledger.SweepStats
	now := l.now()
	l.mu.Lock()
	st.Removed = l.removeDue(now.UnixNano(), limit)
	if l.slab.sparse() {
		l.shrink()
	}
	for e := range l.index.unsettled {
		if e.expired(now) {
			continue // removed by a later sweep
		}
		if n := fsm.ApplyLeases(e.job, now); n > 0 {
			st.Unknown += n
			l.store(e, e.job)
			e.notify()
		}
	}
	l.mu.Unlock()
	return st, nil
}

// Close implements ledger.Ledger.
func (l *Ledger) Close() error { return nil }

// Local reports that the ledger runs in the gateway's process (ledger.Local).
func (l *Ledger) Local() bool { return true }

// Len returns the number of jobs held, expired or not.
func (l *Ledger) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byID.len()
}

var _ ledger.Ledger = (*Ledger)(nil)
