// Package ledger holds the durable record of idempotent work: jobs (one per
// intent, unique by owner and key) and their attempts (one per try against a
// provider). A Ledger decides who is first by a uniqueness constraint and who
// wins the result by compare-and-swap; the backends live in sub-packages and
// pass one conformance suite, ledger/ledgertest.
package ledger

import (
	"bytes"
	"context"
	"errors"
	"time"
)

// Ledger is the storage contract of the idempotent request flow. Every method
// is safe for concurrent use by many goroutines and, for the shared backends,
// by many gateway processes. Deadlines and expiry are judged by the ledger's
// own clock.
//
// Every transition is idempotent by the ids the caller chose (the job id and
// attempt ids in ReserveParams, NextAttempt and Resolution): applied twice,
// concurrently or one after the other, it has the effect of once and returns
// what the first application returned. A caller that did not get a reply may
// therefore repeat the call; a ledger's client library must never repeat
// one on its own, as only the caller knows the ids.
type Ledger interface {
	// Reserve creates the job p.JobID for (owner, key) with attempt
	// p.Attempt starting, or reports what already exists. A failed job is
	// re-opened with attempt p.Attempt (only one concurrent caller
	// succeeds); an expired job is replaced in place by the job p.JobID.
	// A repeat finds p.Attempt in the job and answers Created or Reopened
	// again, with that attempt as it is now.
	Reserve(ctx context.Context, p ReserveParams) (Reservation, error)

	// Hedge starts the concurrent attempt next for a pending job, without
	// changing its version: both attempts then race for the result slot.
	Hedge(ctx context.Context, ref AttemptRef, next NextAttempt) (Attempt, error)

	// Resend starts next, marked Resend: the job's request sent again to a
	// provider that deduplicates, with the same value in its idempotency
	// header, to reconcile ref, an attempt that blocks the job (unknown,
	// or lost with no winner). It is allowed only while no attempt is
	// starting, no result won and the job is still at ref.Version (no
	// operator settled it since), and the job is pending again until next
	// ends; otherwise ErrStale. Its answer settles the job by the usual
	// CAS. A repeat returns the attempt the first call started.
	Resend(ctx context.Context, ref AttemptRef, next NextAttempt) (Attempt, error)

	// Complete offers the attempt's result to the job by compare-and-swap on
	// (id, version, completed_by IS NULL) within the attempt's deadline. The
	// loser's result is discarded and the attempt becomes lost (a cancelled
	// attempt stays cancelled); the returned job then holds the winner's
	// answer (or none, if the job was resolved otherwise). A repeat by the
	// winner reports that it won.
	Complete(ctx context.Context, ref AttemptRef, resp Response) (Completion, error)

	// SaveBody stores the body of an answer whose result slot the attempt
	// already won with Complete (a stream, or an answer sent before it
	// ended). size is the length of the whole body; stored is false when
	// the body was cut short or too large, and body is then dropped.
	SaveBody(ctx context.Context, ref AttemptRef, body []byte, size int64, stored bool) error

	// Fail records a definitive failure of the attempt. With next set, the
	// attempt next starts in the same step (failover), unless another
	// attempt of the job blocks new ones (starting, unknown, or lost while
	// no attempt has won) or the job was settled meanwhile (ErrBlocked; the
	// failure is recorded all the same). Without next, the job becomes
	// failed once nothing blocks it.
	Fail(ctx context.Context, ref AttemptRef, reason string, next *NextAttempt) (*Attempt, error)

	// Unsent records that the gateway never sent attempt ref (the ledger
	// stopped answering before the request was forwarded, or the dial
	// failed): the attempt becomes failed, even after it became unknown
	// (its lease ran out, or its attempt_timeout ended before the dial
	// failed), whatever happened to the job since (a re-send may have
	// completed it); the job becomes failed when nothing else settled or
	// blocks it. ErrStale when the attempt is settled otherwise.
	Unsent(ctx context.Context, ref AttemptRef) error

	// MarkUnknown records that the attempt's outcome is unknown. The job
	// becomes unknown unless a result already won; its version is kept, so a
	// late result can still complete it.
	MarkUnknown(ctx context.Context, ref AttemptRef, reason string) error

	// ClaimLookup leases attempt ref to the reconciler holder (an id the
	// reconciler chose for this claim) until the ledger's clock plus lease,
	// so that one reconciler at a time asks the provider whether the
	// attempt acted. The attempt must be unknown, its deadline passed, its
	// next lookup due and no other holder's lease running; otherwise
	// ErrStale. A repeat by the holder while its lease runs succeeds again.
	ClaimLookup(ctx context.Context, ref AttemptRef, holder string, lease time.Duration) (*Job, error)

	// SettleLookup records what holder's lookup of attempt ref found and
	// releases the lease; the attempt must still be unknown and leased to
	// holder (otherwise ErrStale). A found answer completes the job with
	// it (the attempt succeeded, the version incremented; if a result won
	// meanwhile, the attempt is lost instead); an absent one fails the
	// attempt (the job fails when nothing else blocks it); anything else
	// leaves it unknown, its next lookup due after r.Retry. A repeat
	// returns the job as the first call left it.
	SettleLookup(ctx context.Context, ref AttemptRef, holder string, r LookupResult) (*Job, error)

	// Resolve settles a job out of band: cancel (the job becomes failed, its
	// starting and unknown attempts cancelled) or complete (by CAS, with an
	// attempt whose provider is "admin"). ErrCompleted if it already completed.
	Resolve(ctx context.Context, jobID string, r Resolution) (*Job, error)

	// Job returns one job with its attempts, or ErrNotFound.
	Job(ctx context.Context, jobID string) (*Job, error)

	// Find returns the job of (owner, key) with its attempts, leases
	// applied, as Job returns it (ReadAt set to the ledger's clock at the
	// read), or ErrNotFound when there is none or it expired. The lookup
	// is by owner and key together, as the uniqueness constraint names
	// them: another owner's job with the same key costs the same work as
	// no job and is equally not found. Like Job, it is a read: one round
	// trip on the shared backends.
	Find(ctx context.Context, ownerHash, keyHash []byte) (*Job, error)

	// Jobs lists jobs newest first, one page at a time.
	Jobs(ctx context.Context, q JobQuery) (JobPage, error)

	// Wait blocks until the job is no longer pending (completed, failed or
	// unknown, including a lease that ran out) and an answer that won while
	// streaming has its body saved, or ctx ends, and returns it. It is
	// woken by a notification (SaveBody notifies too), not by polling.
	Wait(ctx context.Context, jobID string) (*Job, error)

	// Sweep records expired leases as unknown and removes up to limit jobs
	// whose retention has passed.
	Sweep(ctx context.Context, limit int) (SweepStats, error)

	// Close releases the ledger's resources.
	Close() error
}

// ReserveParams identify a request and the first attempt to start for it.
type ReserveParams struct {
	// JobID is the id of the job, if this call creates it: a UUIDv7 the
	// caller chose (NewID), the same in every repeat of the call.
	JobID string
	// OwnerHash and KeyHash identify the job; they are hashes, never the
	// owner or the key in clear.
	OwnerHash []byte
	KeyHash   []byte
	// Fingerprint is the hash of the request; FingerprintVersion the
	// version of its encoding and FingerprintScheme what it covered (the
	// gateway's own text: body mode, headers, selected members), kept so a
	// retry can be fingerprinted as its job was. Two requests are the same
	// when their versions and hashes are equal.
	Fingerprint        []byte
	FingerprintVersion int
	FingerprintScheme  string
	// Retention is how long the job is kept once it completed or failed.
	Retention time.Duration
	// Attempt is the attempt to start when the job is created or re-opened.
	Attempt NextAttempt
	// Repeat marks a call that may repeat one whose reply was lost: the
	// ledger answers it, never a memory of completed jobs in the process,
	// which may not know that this call's attempt exists.
	Repeat bool
}

// WithNewIDs returns p with a new job id and a new attempt id: the
// parameters of another request for the same identity, not a repeat.
func (p ReserveParams) WithNewIDs() ReserveParams {
	p.JobID, p.Attempt.ID = NewID(), NewID()
	return p
}

// Matches reports whether job j was reserved by the request p describes:
// the same fingerprint version and hash. The scheme only says how the hash
// was made.
func (p *ReserveParams) Matches(j *Job) bool {
	return j.FingerprintVersion == p.FingerprintVersion && bytes.Equal(j.Fingerprint, p.Fingerprint)
}

// Identify gives j the identity of the request p describes: owner, key and
// fingerprint.
func (p *ReserveParams) Identify(j *Job) {
	j.OwnerHash, j.KeyHash = p.OwnerHash, p.KeyHash
	j.Fingerprint, j.FingerprintVersion, j.FingerprintScheme = p.Fingerprint, p.FingerprintVersion, p.FingerprintScheme
}

// Mismatched is the reservation of a request whose key job j holds for
// another request: the job's id, state and creation, and how its
// fingerprint was made (so the caller can fingerprint the request the
// same way and ask again), never its answer.
func Mismatched(j *Job, now time.Time) Reservation {
	return Reservation{
		Outcome: Mismatch,
		Job: &Job{ID: j.ID, State: j.State, CreatedAt: j.CreatedAt,
			FingerprintVersion: j.FingerprintVersion, FingerprintScheme: j.FingerprintScheme},
		Now: now,
	}
}

// NewAttempt returns the next attempt to start on provider, with a new id.
func NewAttempt(provider string, lease time.Duration) NextAttempt {
	return NextAttempt{ID: NewID(), Provider: provider, Lease: lease}
}

// NextAttempt describes an attempt about to start.
type NextAttempt struct {
	// ID is the attempt's id: a UUIDv7 the caller chose (NewID), the same
	// in every repeat of the call that starts it.
	ID string
	// Provider names the provider the attempt is sent to.
	Provider string
	// Scope is the handler scope the attempt runs under. Provider names
	// are chosen per handler, so two handlers sharing a ledger may both
	// call a provider "api"; (Scope, Provider) names the upstream, and a
	// reconciler asks a provider only about its own scope's attempts.
	Scope string
	// Lease is how long the attempt may run: its attempt_deadline is the
	// ledger's clock plus Lease.
	Lease time.Duration
}

// Outcome says what Reserve found or did.
type Outcome int

const (
	// Created: a new job with attempt 1 starting.
	Created Outcome = iota + 1
	// Reopened: a failed job, re-opened with a new attempt starting.
	Reopened
	// Mismatch: the key is taken by a request with another fingerprint.
	Mismatch
	// Done: the job completed; Job.Response holds its answer.
	Done
	// InFlight: an attempt of the job is starting; Attempt is that attempt.
	InFlight
	// Unknown: an attempt's outcome is unknown; no new attempt may start.
	Unknown
)

// String names the outcome: created, reopened, mismatch, done, in_flight
// or unknown (the names ParseOutcome reads).
func (o Outcome) String() string {
	switch o {
	case Created:
		return "created"
	case Reopened:
		return "reopened"
	case Mismatch:
		return "mismatch"
	case Done:
		return "done"
	case InFlight:
		return "in_flight"
	case Unknown:
		return "unknown"
	}
	return "invalid"
}

// ParseOutcome returns the Outcome whose String is name: the names the SQL
// and Lua ledgers return.
func ParseOutcome(name string) (Outcome, bool) {
	for o := Created; o <= Unknown; o++ {
		if o.String() == name {
			return o, true
		}
	}
	return 0, false
}

// Reservation is the answer to Reserve.
type Reservation struct {
	Outcome Outcome
	// Job is the job as Reserve left it. On Mismatch it carries only the id
	// and state: never the other request's answer.
	Job *Job
	// Attempt is the attempt this call started (Created, Reopened), or the
	// one that blocks new attempts (InFlight, Unknown; nil when none).
	Attempt *Attempt
	// Now is the ledger's clock at the reservation, to compare with
	// Attempt.Deadline.
	Now time.Time
	// Tier is where the answer came from: the ledger's store (empty), a
	// copy in this process's memory, or a cache in front of the ledger.
	Tier Tier
}

// Tier is where a reservation's answer came from (Reservation.Tier).
type Tier string

const (
	// TierLedger: the ledger's own store (a Reservation's zero Tier).
	TierLedger Tier = ""
	// TierProcess: a copy of the job in this process's memory, kept for
	// replays (the ledgers' replay caches).
	TierProcess Tier = "process"
	// TierCache: a verified copy in a cache shared by the gateways, in
	// front of the ledger (ledger/cache).
	TierCache Tier = "cache"
)

// String returns the tier's name in traces: "ledger" for the store.
func (t Tier) String() string {
	if t == TierLedger {
		return "ledger"
	}
	return string(t)
}

// Completion is the answer to Complete.
type Completion struct {
	// Won is true when this attempt took the result slot.
	Won bool
	// Job is the job after the CAS, ReadAt set to the ledger's clock at
	// this call (a repeat's reader counts the time the job has left from
	// it): on a loss, it holds the winner's answer if there is one.
	Job *Job
}

// LookupResult is what a reconciler's lookup found (Ledger.SettleLookup).
type LookupResult struct {
	// Status is the lookup's answer's status; 0 when it got none.
	Status int
	// Found, when set, is the provider's answer for the attempt: it acted.
	Found *Response
	// Absent: the provider says the attempt never acted.
	Absent bool
	// Retry is when to look again, when neither Found nor Absent.
	Retry time.Duration
}

// Resolution is an operator's decision on a job.
type Resolution struct {
	// Cancel makes the job failed and its running attempts cancelled.
	Cancel bool
	// Response, when Cancel is false, completes the job with this answer.
	Response *Response
	// AttemptID is the id of the attempt (provider "admin") that completes
	// the job: chosen by the caller, so that a repeat is recognized.
	AttemptID string
}

// JobQuery filters and pages a listing of jobs.
type JobQuery struct {
	State    JobState // empty: any
	Provider string   // empty: any; else jobs with an attempt on it
	Limit    int      // 0: DefaultLimit
	Before   string   // cursor: list jobs older than this job id
}

// DefaultLimit is the page size of Jobs when JobQuery.Limit is 0; MaxLimit
// caps it.
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)

// JobPage is one page of a listing. Next is the cursor of the next page, or
// empty at the end.
type JobPage struct {
	Jobs []*Job
	Next string
}

// SweepStats counts what one sweep did.
type SweepStats struct {
	Unknown int // attempts whose lease ran out, recorded as unknown
	Removed int // expired jobs removed
}

// Reasons recorded on attempts by the ledgers themselves.
const (
	// ReasonLeaseExpired: the attempt's lease ran out while it was starting
	// (its gateway instance died or lost the ledger).
	ReasonLeaseExpired = "lease expired"
	// ReasonUnsent: the gateway never sent the attempt (Unsent).
	ReasonUnsent = "never sent: the ledger did not answer before the request was forwarded"
	// ReasonAbsent: a lookup found that the provider never acted on the
	// attempt (SettleLookup).
	ReasonAbsent = "the provider's lookup found no trace of the attempt"
	// ReasonLookupLost: a lookup found that the provider acted on the
	// attempt after another result had won (SettleLookup).
	ReasonLookupLost = "the provider's lookup found it acted after another result had won"
	// ReasonLateSettled: the attempt's result came after the job was
	// settled, by another result or an operator (Complete).
	ReasonLateSettled = "result arrived after the job was settled"
	// ReasonLateDeadline: the attempt's result came after its
	// attempt_deadline (Complete).
	ReasonLateDeadline = "result arrived after attempt_deadline"
	// ReasonResolved: an operator settled the job while the attempt could
	// still report (Resolve).
	ReasonResolved = "resolved by an operator"
)

// Errors returned by ledgers. Any other error means the ledger could not
// answer: the gateway fails closed.
var (
	ErrNotFound  = errors.New("ledger: job not found")
	ErrStale     = errors.New("ledger: attempt is no longer running")
	ErrBlocked   = errors.New("ledger: another attempt is starting or unknown")
	ErrCompleted = errors.New("ledger: job already completed")
)

// EffectiveLimit clamps a requested page size.
func EffectiveLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultLimit
	case n > MaxLimit:
		return MaxLimit
	}
	return n
}

// Local is implemented by a ledger whose calls run in the gateway's own
// process, with no network in between (memory, file): such a call never
// waits for a reply that may not come, and ignores its context, so the
// gateway sends it once, with no deadline of its own (proxy.ledgerCall).
// A ledger that wraps another (sealed, a pool's) is local when it is.
type Local interface {
	Local() bool
}

// IsLocal reports whether l is a Local ledger that says it is.
func IsLocal(l Ledger) bool {
	lo, ok := l.(Local)
	return ok && lo.Local()
}
