package ledger

import (
	"context"
	"time"
)

// Counter is implemented by a ledger that can count its jobs by state:
// the backlog an operator watches (above all the unknown jobs, which only
// a person or reconciliation can settle). It is optional: a ledger that
// does not implement it is simply not counted.
//
// A count may cost a scan of the ledger: the caller bounds how often it
// asks (the gateway asks at most every few seconds, whatever the number
// of scrapes and pages), and each backend bounds what one call costs.
type Counter interface {
	// Counts returns how many jobs the ledger holds in each state, as Jobs
	// would list them: leases applied (a pending job whose lease ran out
	// counts as unknown), expired jobs left out.
	Counts(ctx context.Context) (Counts, error)
}

// Counts is a ledger's jobs by state.
type Counts struct {
	// ByState holds every JobState, with 0 for the states no job is in.
	ByState map[JobState]int64
	// OldestUnknown is the creation time of the oldest unknown job, zero
	// when no job is unknown.
	OldestUnknown time.Time
	// Now is the ledger's clock at the count: the age of OldestUnknown is
	// Now minus it, judged by one clock.
	Now time.Time
	// Partial is true when the count covers only part of the ledger (a
	// backend that counts in bounded steps has not finished its first
	// pass); the numbers are then lower bounds.
	Partial bool
}

// JobStates are the states of a job, in the order an operator reads them:
// the one to act on first.
var JobStates = []JobState{JobUnknown, JobPending, JobFailed, JobCompleted}

// NewCounts returns an empty count at now, by the ledger's clock.
func NewCounts(now time.Time) Counts {
	c := Counts{ByState: make(map[JobState]int64, len(JobStates)), Now: now}
	for _, s := range JobStates {
		c.ByState[s] = 0
	}
	return c
}

// Add counts j, whose leases the caller applied and which has not expired.
func (c *Counts) Add(j *Job) {
	c.ByState[j.State]++
	if j.State == JobUnknown && (c.OldestUnknown.IsZero() || j.CreatedAt.Before(c.OldestUnknown)) {
		c.OldestUnknown = j.CreatedAt
	}
}

// Clone returns a copy of c that shares nothing with it.
func (c Counts) Clone() Counts {
	if c.ByState != nil {
		m := make(map[JobState]int64, len(c.ByState))
		for s, n := range c.ByState {
			m[s] = n
		}
		c.ByState = m
	}
	return c
}

// Merge adds the counts of another ledger to c: the sums by state, the
// older of the oldest unknown jobs, the earlier clock.
func (c *Counts) Merge(o Counts) {
	if c.ByState == nil {
		*c = NewCounts(o.Now)
	}
	for s, n := range o.ByState {
		c.ByState[s] += n
	}
	if !o.OldestUnknown.IsZero() && (c.OldestUnknown.IsZero() || o.OldestUnknown.Before(c.OldestUnknown)) {
		c.OldestUnknown = o.OldestUnknown
	}
	if c.Now.IsZero() || (!o.Now.IsZero() && o.Now.Before(c.Now)) {
		c.Now = o.Now
	}
	c.Partial = c.Partial || o.Partial
}

// OldestUnknownAge is how long ago, by the ledger's clock at the count,
// the oldest unknown job was created; 0 when none is unknown.
func (c Counts) OldestUnknownAge() time.Duration {
	if c.OldestUnknown.IsZero() {
		return 0
	}
	return max(c.Now.Sub(c.OldestUnknown), 0)
}

// Listener is implemented by a ledger whose waiters are woken through a
// change listener (a PostgreSQL LISTEN, a Redis subscription): a ledger
// health check.
type Listener interface {
	// ListenerUp reports whether the change listener can wake waiters: it
	// is false while the listener's connection is lost (its last session
	// failed and it has not subscribed again), true while it is
	// subscribed and also before anything needed it (the listener starts
	// with the first waiter).
	ListenerUp() bool
}

// WaitReader is implemented by a ledger whose waiters (Ledger.Wait) share
// their reads of a job (Subscriber.Wait): a metric of what duplicates cost.
type WaitReader interface {
	// WaitReads returns how many reads of jobs the ledger made for its
	// waiters since it was opened: one per read, however many waiters
	// shared it.
	WaitReads() uint64
}

// StorageReporter is implemented by a ledger that keeps its jobs on the
// gateway's own disk (the file ledger): what it takes there, and how well
// its cache of jobs in memory serves reads.
type StorageReporter interface {
	Storage() (Storage, error)
}

// Storage is a ledger's use of disk and of its cache.
type Storage struct {
	DiskBytes   int64  // the ledger's files
	CacheBytes  int64  // the caches' memory in use
	CacheSize   int64  // the caches' bound
	CacheHits   uint64 // reads of stored blocks the cache served, since the ledger opened
	CacheMisses uint64 // reads that went to disk
	Syncs       uint64 // syncs of the ledger's log (fdatasync), since the ledger opened
}

// Add adds o's sizes and counts to s (the storage of several ledgers).
func (s *Storage) Add(o Storage) {
	s.DiskBytes += o.DiskBytes
	s.CacheBytes += o.CacheBytes
	s.CacheSize += o.CacheSize
	s.CacheHits += o.CacheHits
	s.CacheMisses += o.CacheMisses
	s.Syncs += o.Syncs
}

// HitRate is the share of reads the cache served, 0 before any read.
func (s Storage) HitRate() float64 {
	if n := s.CacheHits + s.CacheMisses; n > 0 {
		return float64(s.CacheHits) / float64(n)
	}
	return 0
}
