package redis

import (
	"bytes"
	"context"
	"fmt"

	"github.com/onejob/onejob/ledger"
)

// purgeBatch is how many job ids one step of Purge reads, and at most how
// many jobs one purge script is given.
var purgeBatch = 500

// Purge implements ledger.Purger. The ledger has no index by owner (see
// the keyspace in doc.go), so Purge walks the job index (indexPage), reads
// each step's jobs as Jobs does (fields and attempts, never bodies), and
// gives the owner's to the purge script, which checks the owner and the
// state again, atomically, before it removes a job. Its cost grows with
// the whole ledger, not with the owner's jobs: an operator's call.
func (l *Ledger) Purge(ctx context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var st ledger.PurgeStats
	for cursor := ""; ; {
		ids, err := l.indexPage(ctx, cursor, purgeBatch)
		if err != nil {
			return st, fmt.Errorf("redis ledger: purge: %w", err)
		}
		if len(ids) == 0 {
			break
		}
		cursor = ids[len(ids)-1]
		jobs, err := l.loadMany(ctx, ids)
		if err != nil {
			return st, err
		}
		keys := []string{l.idxKey(), l.leasesKey(), l.expiryKey()}
		args := []any{l.prefix, ownerHash}
		for _, j := range jobs {
			if bytes.Equal(j.OwnerHash, ownerHash) {
				keys = append(keys, l.jobKey(j.ID), l.attemptsKey(j.ID), l.identKey(identity(j.OwnerHash, j.KeyHash)))
				args = append(args, j.ID)
			}
		}
		if len(args) > 2 {
			v, err := scripts.purge.Run(ctx, l.client, keys, args...).Result()
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
		if len(ids) < purgeBatch {
			break
		}
	}
	l.replays.ForgetOwner(ownerHash)
	return st, nil
}

var _ ledger.Purger = (*Ledger)(nil)
