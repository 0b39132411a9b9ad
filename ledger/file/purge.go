package file

import (
	"bytes"
	"context"

	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// Purge implements ledger.Purger: in one transaction, it walks the
// owner's identities (the keys bucket is ordered by owner hash first) and
// removes each settled job with its identity and index entries.
func (l *Ledger) Purge(_ context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var (
		st      ledger.PurgeStats
		changed []string
	)
	err := l.db.Update(func(tx *bolt.Tx) error {
		st, changed = ledger.PurgeStats{}, nil
		t := wrap(tx)
		now := l.now()
		prefix := identity(ownerHash, nil)
		var ids []string
		c := t.keys.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			ids = append(ids, string(v))
		}
		for _, id := range ids {
			old, err := t.load(id)
			if err != nil {
				return err
			}
			if old == nil || !bytes.Equal(old.OwnerHash, ownerHash) {
				continue
			}
			j := old.Clone()
			if fsm.ApplyLeases(j, now) > 0 {
				if err := t.put(old, j); err != nil {
					return err
				}
				changed = append(changed, id)
			}
			if !ledger.Purgeable(j) {
				st.Kept++
				continue
			}
			if err := t.remove(j); err != nil {
				return err
			}
			st.Removed++
			changed = append(changed, id)
		}
		return nil
	})
	if err != nil {
		return ledger.PurgeStats{}, err
	}
	l.completed.ForgetOwner(ownerHash)
	l.notify(changed...)
	return st, nil
}

var _ ledger.Purger = (*Ledger)(nil)
