package file

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/record"
)

// removeIf removes the job jobID when keep, given the job with its leases
// applied at now, says no: under its key's lock, as every transition of
// it. It reports whether it removed the job; a job gone already is
// neither removed nor kept.
func (l *Ledger) removeIf(jobID string, now time.Time, keep func(j *ledger.Job) bool) (removed, kept bool, err error) {
	identity, unlock, err := l.lockJob(jobID)
	if err != nil || identity == nil {
		return false, false, err
	}
	defer unlock()
	j, _, err := l.read(identity, jobID)
	if err != nil || j == nil {
		return false, false, err
	}
	seen := j.Clone()
	fsm.ApplyLeases(seen, now)
	if keep(seen) {
		return false, true, nil
	}
	b := l.db.NewBatch()
	remove(b, identity, j)
	if err := write(b); err != nil {
		return false, false, err
	}
	l.replays.Forget(near.Key(j.OwnerHash, j.KeyHash))
	l.waiters.Wake(jobID)
	return true, false, nil
}

// Sweep implements ledger.Ledger: it reads the jobs whose expiry came (x)
// and the jobs not at rest (o), never the others.
func (l *Ledger) Sweep(_ context.Context, limit int) (ledger.SweepStats, error) {
	done, err := l.open()
	if err != nil {
		return ledger.SweepStats{}, err
	}
	defer done()
	var st ledger.SweepStats
	now := l.now()
	due, err := l.due(now, limit)
	if err != nil {
		return st, err
	}
	for _, id := range due {
		removed, _, err := l.removeIf(id, now, func(j *ledger.Job) bool { return !j.Expired(now) })
		if err != nil {
			return st, err
		}
		if removed {
			st.Removed++
		}
	}
	open, err := l.openIDs()
	if err != nil {
		return st, err
	}
	for _, id := range open {
		err := l.update(id, func(j *ledger.Job, now time.Time) error {
			st.Unknown += fsm.ApplyLeases(j, now)
			return nil
		})
		if err != nil && !errors.Is(err, ledger.ErrNotFound) {
			return st, err
		}
	}
	return st, nil
}

// due returns the ids of up to limit jobs whose expiry came by now (all of
// them when limit is 0 or less).
func (l *Ledger) due(now time.Time, limit int) ([]string, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{
		LowerBound: []byte{prefixExpiry},
		UpperBound: expiryKey(now.Add(time.Nanosecond), ""),
	})
	if err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	defer it.Close()
	var ids []string
	for ok := it.First(); ok && (limit <= 0 || len(ids) < limit); ok = it.Next() {
		ids = append(ids, string(it.Key()[9:]))
	}
	return ids, it.Error()
}

// Counts implements ledger.Counter. The jobs not at rest are read, with
// their leases applied; every other job is completed, and counted as the
// count of jobs less those and less the ones whose retention ended,
// which the next sweep removes.
func (l *Ledger) Counts(_ context.Context) (ledger.Counts, error) {
	done, err := l.open()
	if err != nil {
		return ledger.Counts{}, err
	}
	defer done()
	now := l.now()
	c := ledger.NewCounts(now)
	open, err := l.openIDs()
	if err != nil {
		return ledger.Counts{}, err
	}
	isOpen := make(map[string]bool, len(open))
	for _, id := range open {
		isOpen[id] = true
		j, err := l.current(id, now)
		if errors.Is(err, ledger.ErrNotFound) {
			continue
		}
		if err != nil {
			return ledger.Counts{}, err
		}
		c.Add(j)
	}
	total, err := l.total()
	if err != nil {
		return ledger.Counts{}, err
	}
	due, err := l.due(now, 0)
	if err != nil {
		return ledger.Counts{}, err
	}
	expired := int64(0)
	for _, id := range due {
		if !isOpen[id] {
			expired++
		}
	}
	c.ByState[ledger.JobCompleted] += max(total-int64(len(open))-expired, 0)
	return c, nil
}

// total returns the number of jobs stored, expired or not.
func (l *Ledger) total() (int64, error) {
	v, closer, err := l.db.Get([]byte(totalKey))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("file ledger: %w", err)
	}
	defer closer.Close()
	n, k := binary.Varint(v)
	if k <= 0 {
		return 0, errors.New("file ledger: the count of jobs is not a varint")
	}
	return n, nil
}

// Len returns the number of jobs stored, expired or not.
func (l *Ledger) Len() int {
	done, err := l.open()
	if err != nil {
		return 0
	}
	defer done()
	n, _ := l.total()
	return int(n)
}

// Purge implements ledger.Purger: an owner's keys are one range of the
// key space (k<owner>...), read in key order.
func (l *Ledger) Purge(_ context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	done, err := l.open()
	if err != nil {
		return ledger.PurgeStats{}, err
	}
	defer done()
	var st ledger.PurgeStats
	now := l.now()
	var ids []string
	lower := identityKey(ownerHash, nil)
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upperBound(lower)})
	if err != nil {
		return st, fmt.Errorf("file ledger: %w", err)
	}
	for ok := it.First(); ok; ok = it.Next() {
		j, err := record.Decode(bytes.Clone(it.Value()))
		if err != nil {
			it.Close()
			return st, fmt.Errorf("file ledger: the job of key %x: %w", it.Key(), err)
		}
		ids = append(ids, j.ID)
	}
	if err := it.Close(); err != nil {
		return st, fmt.Errorf("file ledger: %w", err)
	}
	for _, id := range ids {
		removed, kept, err := l.removeIf(id, now, func(j *ledger.Job) bool {
			return !j.Expired(now) && !ledger.Purgeable(j, now)
		})
		if err != nil {
			return st, err
		}
		switch {
		case removed:
			st.Removed++
		case kept:
			st.Kept++
		}
	}
	l.replays.ForgetOwner(ownerHash)
	return st, nil
}
