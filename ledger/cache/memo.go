package cache

import (
	"bytes"
	"sync"
	"time"

	"github.com/onejob/onejob/ledger"
)

// identity is what a cache entry needs besides the completion itself: who
// the job belongs to and which request it answers. A job id's identity
// never changes (an expired job is replaced under a new id, and only a
// request with the same fingerprint re-opens a failed one), so a
// remembered identity cannot go stale.
type identity struct {
	request   ledger.ReserveParams // owner, key and fingerprint (ReserveParams.Identify)
	retention time.Duration
	createdAt time.Time
	until     time.Time // forget it after this (local clock)
}

// memo remembers the identity of the jobs this process started attempts
// for, so that caching their completion needs no read of the truth: a
// backend's Complete need not return the job's identity (PostgreSQL's does
// not). It is bounded; a job it does not know is read from the truth.
type memo struct {
	mu     sync.Mutex
	max    int
	jobs   map[string]*identity
	pruned time.Time // last full scan for expired identities
}

// memoGrace keeps an identity past its attempts' deadline, which is judged
// by the ledger's clock: locally only the time left is counted down.
const memoGrace = time.Minute

func newMemo(max int) *memo {
	return &memo{max: max, jobs: make(map[string]*identity)}
}

// remember records the identity of p's job, which a reservation created or
// re-opened with an attempt that has left to run (by the ledger's clock);
// now is the local clock.
func (m *memo) remember(jobID string, p *ledger.ReserveParams, j *ledger.Job, left time.Duration, now time.Time) {
	until := now.Add(max(left, 0) + memoGrace)
	m.mu.Lock()
	defer m.mu.Unlock()
	if id := m.jobs[jobID]; id != nil {
		if until.After(id.until) {
			id.until = until
		}
		return
	}
	if len(m.jobs) >= m.max && now.Sub(m.pruned) >= time.Second {
		m.pruned = now
		for k, id := range m.jobs {
			if !now.Before(id.until) {
				delete(m.jobs, k)
			}
		}
	}
	if len(m.jobs) >= m.max {
		return // full: completions of this job read the truth
	}
	m.jobs[jobID] = &identity{
		request: ledger.ReserveParams{
			OwnerHash:          bytes.Clone(p.OwnerHash),
			KeyHash:            bytes.Clone(p.KeyHash),
			Fingerprint:        bytes.Clone(p.Fingerprint),
			FingerprintVersion: p.FingerprintVersion,
			FingerprintScheme:  p.FingerprintScheme,
		},
		retention: j.Retention,
		createdAt: j.CreatedAt,
		until:     until,
	}
}

// extend keeps a job's identity while a new attempt has left to run.
func (m *memo) extend(jobID string, left time.Duration, now time.Time) {
	until := now.Add(max(left, 0) + memoGrace)
	m.mu.Lock()
	defer m.mu.Unlock()
	if id := m.jobs[jobID]; id != nil && until.After(id.until) {
		id.until = until
	}
}

// take returns and forgets the identity of a job that just completed.
func (m *memo) take(jobID string) (*identity, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id, ok := m.jobs[jobID]
	delete(m.jobs, jobID)
	return id, ok
}

// forget drops a job's identity.
func (m *memo) forget(jobID string) {
	m.mu.Lock()
	delete(m.jobs, jobID)
	m.mu.Unlock()
}

// len returns the number of identities held.
func (m *memo) len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.jobs)
}
