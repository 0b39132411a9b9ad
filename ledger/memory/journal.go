package memory

import (
	"bytes"
	"fmt"

	"github.com/onejob/onejob/ledger/internal/record"
)

// Load puts a job into the ledger as its record says, in place of the job
// of the same id or the same identity, without journaling it: a ledger
// rebuilt from its journal reads the journal's records in order, and
// leaves out the jobs that expired.
func (l *Ledger) Load(rec []byte) error {
	rec = bytes.Clone(rec) // kept, or decoded into a job that may share it
	j, err := record.Decode(rec)
	if err != nil {
		return fmt.Errorf("memory ledger: %w", err)
	}
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop(j.ID)
	if j.Expired(now) {
		return nil
	}
	key := appendIdentity(nil, j.OwnerHash, j.KeyHash)
	if old := l.byKey[string(key)]; old != nil {
		l.drop(old.id)
	}
	e := newEntry(key, j.ID)
	var packed []byte // nil: held as itself
	if settled(j) {
		packed = rec
	}
	l.hold(e, j, packed)
	l.byKey[e.key] = e
	l.byID[e.id] = e
	return nil
}

// Unload removes the job jobID, if the ledger holds it, without journaling
// it: a removal read from the journal.
func (l *Ledger) Unload(jobID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.drop(jobID)
}

// drop forgets the job jobID. l.mu must be held.
func (l *Ledger) drop(jobID string) {
	if e := l.byID[jobID]; e != nil {
		delete(l.byID, jobID)
		if l.byKey[e.key] == e {
			delete(l.byKey, e.key)
		}
		l.unindex(e)
		l.replays.Forget(e.key)
	}
}

// Checkpoint calls mark, then returns the record of every job as it was
// when mark was called: with the lock held throughout, no change comes
// between. The file ledger's mark starts a new journal segment, so that
// the records are a snapshot as of that segment's start.
func (l *Ledger) Checkpoint(mark func() error) ([][]byte, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err := mark(); err != nil {
		return nil, err
	}
	recs := make([][]byte, 0, len(l.byID))
	for _, e := range l.byID {
		if e.job != nil {
			recs = append(recs, record.Encode(e.job))
		} else {
			recs = append(recs, e.packed) // never changed in place
		}
	}
	return recs, nil
}
