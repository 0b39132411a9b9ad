package memory

import (
	"bytes"
	"fmt"

	"github.com/onejob/onejob/ledger/internal/fsm"
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
	l.unload(j.ID)
	if j.Expired(now) {
		return nil
	}
	key := appendIdentity(nil, j.OwnerHash, j.KeyHash)
	if old := l.byKey.get(&l.slab, string(key)); old != nil {
		l.drop(old)
	}
	e := l.add(key, j.ID)
	var packed []byte // nil: held as itself
	if fsm.AtRest(j) {
		packed = rec
	}
	l.hold(e, j, packed)
	return nil
}

// Unload removes the job jobID, if the ledger holds it, without journaling
// it: a removal read from the journal.
func (l *Ledger) Unload(jobID string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.unload(jobID)
}

// unload forgets the job jobID, if the ledger holds it. l.mu must be held.
func (l *Ledger) unload(jobID string) {
	if e := l.byID.get(&l.slab, jobID); e != nil {
		l.drop(e)
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
	recs := make([][]byte, 0, l.byID.len())
	for e := range l.byID.all(&l.slab) {
		if e.job != nil {
			recs = append(recs, record.Encode(e.job))
		} else {
			recs = append(recs, e.packed) // never changed in place
		}
	}
	return recs, nil
}
