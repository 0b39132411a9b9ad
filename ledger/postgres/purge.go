package postgres

import (
	"context"
	"fmt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/notify"
)

// purgeQuery removes an owner's settled jobs (their attempts go with them:
// ON DELETE CASCADE) but an answer still streaming (ledger.Purgeable: its
// body not saved, its attempt's lease running), and counts the ones it
// keeps, in one statement (the main query sees the rows as they were
// before the DELETE: kept is all of the owner's less the removed). The
// DELETE takes each row's lock, so it waits for a transition under way and
// then sees the job's state after it; the unique index (owner_hash,
// key_hash) finds the owner's rows. It notifies the channel $2 with the
// purge's notice $3 (notify.PurgeNotice), which every instance hears once
// the statement commits: each forgets the owner's answers it kept in
// memory.
const purgeQuery = `WITH gone AS (
	DELETE FROM jobs j WHERE owner_hash = $1 AND state IN ('completed', 'failed')
		AND NOT (response_size < 0 AND NOT response_stored AND EXISTS (
			SELECT 1 FROM attempts a WHERE a.id = j.completed_by AND a.deadline > ledger_clock()))
	RETURNING id),
	notice AS (SELECT pg_notify($2, $3))
	SELECT (SELECT count(*) FROM gone),
		(SELECT count(*) FROM jobs WHERE owner_hash = $1) - (SELECT count(*) FROM gone),
		(SELECT count(*) FROM notice)`

// Purge implements ledger.Purger.
func (l *Ledger) Purge(ctx context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	var removed, kept, noticed int64
	if err := l.pool.QueryRow(ctx, purgeQuery, ownerHash, l.channel, notify.PurgeNotice(ownerHash)).Scan(&removed, &kept, &noticed); err != nil {
		return ledger.PurgeStats{}, fmt.Errorf("postgres ledger: purge: %w", err)
	}
	l.replays.ForgetOwner(ownerHash)
	return ledger.PurgeStats{Removed: int(removed), Kept: int(kept)}, nil
}

var _ ledger.Purger = (*Ledger)(nil)
