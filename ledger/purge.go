package ledger

import "context"

// Purger is implemented by a ledger that can remove one owner's jobs at an
// operator's request (an account deleted, its data to be erased). It is
// optional: the admin API purges every open ledger that implements it and
// says which do not.
//
// A purge removes what a retry would otherwise replay, so a purged key is
// a new intent, as after its retention: purge the jobs of an owner whose
// requests are not coming back. Jobs that still guard a request that may
// have reached a provider (pending, unknown) are kept, never guessed away:
// an operator settles them first (Resolve), then purges again.
type Purger interface {
	// Purge removes the settled (completed or failed) jobs of the owner
	// ownerHash, expired or not, with their attempts and stored answers,
	// and counts the pending and unknown jobs it kept (leases applied).
	// Another owner's jobs are never touched. A repeat removes nothing
	// more.
	Purge(ctx context.Context, ownerHash []byte) (PurgeStats, error)
}

// PurgeStats counts what one purge did.
type PurgeStats struct {
	Removed int // settled jobs removed
	Kept    int // pending and unknown jobs kept
}

// Purgeable reports whether a purge removes job j, read with its leases
// applied: it is settled.
func Purgeable(j *Job) bool {
	return j.State == JobCompleted || j.State == JobFailed
}
