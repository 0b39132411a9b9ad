package ledger

import (
	"context"
	"time"
)

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
	// and counts the jobs it kept (leases applied): pending, unknown, and
	// completed by an answer still streaming (Purgeable).
	// Another owner's jobs are never touched. A repeat removes nothing
	// more.
	Purge(ctx context.Context, ownerHash []byte) (PurgeStats, error)
}

// PurgeStats counts what one purge did.
type PurgeStats struct {
	Removed int // settled jobs removed
	Kept    int // pending, unknown and still-streaming jobs kept
}

// Purgeable reports whether a purge removes job j, read with its leases
// applied at now: it is settled, and not an answer still streaming to its
// first client (its body not saved, and the lease of the attempt that
// sends it still running: a stream ends with its attempt's lease).
// Removing that one would let its key become a new intent while the first
// client still reads it.
func Purgeable(j *Job, now time.Time) bool {
	if j.State != JobCompleted && j.State != JobFailed {
		return false
	}
	if j.Streaming() {
		for _, a := range j.Attempts {
			if a.ID == j.CompletedBy && now.Before(a.Deadline) {
				return false
			}
		}
	}
	return true
}
