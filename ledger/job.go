package ledger

import (
	"time"
)

// JobState is the state of a job (docs/contract.md, section 1).
type JobState string

// Job states.
const (
	// JobPending: an attempt is starting or running.
	JobPending JobState = "pending"
	// JobUnknown: an attempt's outcome is unknown; new attempts are blocked.
	JobUnknown JobState = "unknown"
	// JobCompleted: a result won; retries replay it.
	JobCompleted JobState = "completed"
	// JobFailed: every attempt failed definitively, or an operator
	// cancelled; a retry may start a new attempt.
	JobFailed JobState = "failed"
)

// Valid reports whether s is one of the job states.
func (s JobState) Valid() bool {
	switch s {
	case JobPending, JobUnknown, JobCompleted, JobFailed:
		return true
	}
	return false
}

// AttemptState is the state of an attempt (docs/contract.md, section 1).
type AttemptState string

// Attempt states.
const (
	AttemptStarting  AttemptState = "starting"
	AttemptSucceeded AttemptState = "succeeded"
	AttemptLost      AttemptState = "lost"
	AttemptFailed    AttemptState = "failed"
	AttemptUnknown   AttemptState = "unknown"
	AttemptCancelled AttemptState = "cancelled"
)

// AdminProvider is the provider name of attempts an operator completed.
const AdminProvider = "admin"

// Job is the durable record of one intent.
type Job struct {
	ID                 string
	OwnerHash          []byte
	KeyHash            []byte
	Fingerprint        []byte
	FingerprintVersion int
	FingerprintScheme  string // see ReserveParams
	State              JobState
	// Version counts completions, resolutions and re-opens: the result slot
	// is taken by CAS on it.
	Version     int64
	CompletedBy string // id of the winning attempt; empty while none
	Retention   time.Duration
	CreatedAt   time.Time
	CompletedAt time.Time // when it completed or failed; zero while neither
	ExpiresAt   time.Time // zero while the job cannot expire
	Response    *Response // the winner's answer; nil while none
	Attempts    []Attempt // oldest first; may be empty in listings
	// ReadAt is the ledger's clock when this copy was read (by Job and
	// Wait); zero where the ledger did not say. Whoever compares the job's
	// times with "now" uses it, never the local clock.
	ReadAt time.Time
}

// Streaming reports whether j's answer won while it streamed and its body
// is not saved yet (SaveBody): the answer is still being sent, or its
// gateway stopped before the end.
func (j *Job) Streaming() bool {
	return j.Response != nil && !j.Response.Stored && j.Response.Size < 0
}

// BlockedBy reports whether attempt a, one of j's, blocks new attempts
// (docs/contract.md, rule 1): it is starting or unknown, or it is lost
// while no attempt has won (its provider acted and its result was
// discarded) and no operator settled the job since it started (a cancel,
// and the re-open it allows, increment the version). A cancelled attempt
// never blocks.
func (j *Job) BlockedBy(a *Attempt) bool {
	switch a.State {
	case AttemptStarting, AttemptUnknown:
		return true
	case AttemptLost:
		return j.CompletedBy == "" && a.JobVersion == j.Version
	}
	return false
}

// Expired reports whether the job's retention has passed at now.
func (j *Job) Expired(now time.Time) bool {
	return !j.ExpiresAt.IsZero() && !now.Before(j.ExpiresAt)
}

// Attempt is one try at fulfilling a job against one provider.
type Attempt struct {
	ID       string
	JobID    string
	Number   int
	Provider string
	// Scope is the handler scope the attempt ran under (NextAttempt.Scope);
	// empty for an operator's attempt and for attempts of earlier releases.
	Scope      string
	State      AttemptState
	JobVersion int64 // the job version the attempt read when it started
	StartedAt  time.Time
	Deadline   time.Time // attempt_deadline: the end of its lease
	FinishedAt time.Time // zero while running
	Error      string
	// Resend marks a re-send of the job's request to a provider that
	// deduplicates, reconciling an attempt whose outcome was unknown
	// (Ledger.Resend).
	Resend bool
	// Lookup is what the reconciler's lookups did on the attempt; nil
	// while none ran. Like a stored Response it is never changed once set
	// (a change is a new Lookup), so copies of the attempt share it.
	Lookup *Lookup
}

// Lookup is the record of the reconciler's lookups on one unknown attempt
// (Ledger.ClaimLookup, Ledger.SettleLookup).
type Lookup struct {
	Tries      int       // lookups that got an answer or an error
	LastStatus int       // the last lookup's status; 0 when it got none
	LastAt     time.Time // when the last lookup ended
	NextAt     time.Time // when the next may start; zero: at once
	Settled    bool      // a lookup settled the attempt
	Holder     string    // the reconciler that holds (or last held) the lease
	Until      time.Time // the end of Holder's lease; zero once released
}

// SentTo reports whether the attempt went to the provider named provider
// of the handler scope scope: provider names are chosen per handler, so
// only the two together name one upstream. An attempt recorded without a
// scope (by an earlier release) is no handler's: asking or re-sending to a
// namesake could reach an upstream that never saw it.
func (a *Attempt) SentTo(scope, provider string) bool {
	return a.Provider == provider && a.Scope == scope
}

// Lookups returns what the reconciler's lookups did on the attempt: the
// zero Lookup while none ran.
func (a *Attempt) Lookups() Lookup {
	if a.Lookup == nil {
		return Lookup{}
	}
	return *a.Lookup
}

// OrNil returns l to store on an attempt: nil when no lookup ran (l is
// zero), so that attempts without lookups carry nothing.
func (l Lookup) OrNil() *Lookup {
	if l == (Lookup{}) {
		return nil
	}
	return &l
}

// Reconciled names how reconciliation settled the attempt: "lookup",
// "resend" (a re-send that won the job), or "" when neither did.
func (a *Attempt) Reconciled(j *Job) string {
	switch {
	case a.Lookup != nil && a.Lookup.Settled:
		return "lookup"
	case a.Resend && j.CompletedBy == a.ID:
		return "resend"
	}
	return ""
}

// Ref returns the reference the attempt's later calls use.
func (a *Attempt) Ref() AttemptRef {
	return AttemptRef{JobID: a.JobID, AttemptID: a.ID, Version: a.JobVersion}
}

// AttemptRef names an attempt and the job version it read when it started.
type AttemptRef struct {
	JobID     string
	AttemptID string
	Version   int64
}

// Response is a stored answer: status, end-to-end headers and body. Once a
// ledger holds it, it is never changed (a change is a new Response), so
// jobs read from a ledger may share it: treat it as read-only.
type Response struct {
	Status int
	Header map[string][]string
	Body   []byte
	// Size is the length of the whole answer's body, stored or not.
	Size int64
	// Stored is false when the body was too large or cut short: the job is
	// completed but cannot be replayed.
	Stored bool
}

// Clone returns a copy of the job that shares its read-only response.
func (j *Job) Clone() *Job {
	if j == nil {
		return nil
	}
	c := *j // the response is shared: it is never changed once set
	if j.Attempts != nil {
		c.Attempts = append([]Attempt(nil), j.Attempts...)
	}
	return &c
}

// Clone returns a deep copy of the response. Bodies are treated as
// immutable once stored, so the body slice is shared.
func (r *Response) Clone() *Response {
	if r == nil {
		return nil
	}
	c := *r
	if r.Header != nil {
		c.Header = make(map[string][]string, len(r.Header))
		CopyHeader(c.Header, r.Header)
	}
	return &c
}

// CopyHeader sets in dst a copy of each of src's fields: the values are
// copied (into one array for them all, as http.Header.Clone does), so that
// whoever holds dst may change them in place without changing src.
func CopyHeader(dst, src map[string][]string) {
	n := 0
	for _, v := range src {
		n += len(v)
	}
	values := make([]string, n)
	for k, v := range src {
		if len(v) == 0 {
			dst[k] = nil
			continue
		}
		n = copy(values, v)
		dst[k], values = values[:n:n], values[n:]
	}
}
