package redis

import (
	"bytes"
	"context"
	"fmt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/notify"
)

// purgeBatch is how many job ids one step of Purge reads, and at most how
// many jobs one purge script is given.
var purgeBatch = 500

// Purge implements ledger.Purger. The ledger has no index by owner (see
// the keyspace in doc.go), so Purge walks the job index (walk), reads
// each step's jobs as Jobs does (fields and attempts, never bodies), and
// gives the owner's to the purge script, which checks the owner and the
// state again, atomically, before it removes a job. Its cost grows with
// the whole ledger, not with the owner's jobs: an operator's call.
func (l *Ledger) Purge(ctx context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var st ledger.PurgeStats
	for cursor := ""; ; {
		refs, err := l.walk(ctx, cursor, purgeBatch)
		if err != nil {
			return st, fmt.Errorf("redis ledger: purge: %w", err)
		}
		if len(refs) == 0 {
			break
		}
		cursor = refs[len(refs)-1].id
		jobs, err := l.loadMany(ctx, refs)
		if err != nil {
			return st, err
		}
		// One script per bucket: on a cluster, a script's keys are in one
		// slot.
		keys, args := map[string][]string{}, map[string][]any{}
		for i, j := range jobs {
			if j == nil || !bytes.Equal(j.OwnerHash, ownerHash) {
				continue
			}
			bp := refs[i].bp
			if _, ok := keys[bp]; !ok {
				keys[bp] = []string{idxKey(bp), leasesKey(bp), expiryKey(bp)}
				args[bp] = []any{bp, ownerHash, notify.PurgeNotice(ownerHash)}
			}
			keys[bp] = append(keys[bp], jobKey(bp, j.ID), attemptsKey(bp, j.ID), identKey(bp, identity(j.OwnerHash, j.KeyHash)))
			args[bp] = append(args[bp], j.ID)
		}
		for bp := range keys {
			v, err := l.evalAcked(ctx, l.scripts.purge, keys[bp], args[bp]...).Result()
			if err != nil {
				return st, fmt.Errorf("redis ledger: purge: %w", err)
			}
			res, ok := array(v)
			if !ok || len(res) != 2 {
				return st, errReply("purge", v)
			}
			r, _ := res[0].(int64)
			k, _ := res[1].(int64)
			st.Removed += int(r)
			st.Kept += int(k)
		}
		if len(refs) < purgeBatch {
			break
		}
	}
	l.replays.ForgetOwner(ownerHash)
	return st, nil
}

var _ ledger.Purger = (*Ledger)(nil)
