package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
)

// Job status by key (docs/contract.md, section 6): with Config.StatusPath set,
// GET <StatusPath>/<key> answers the state of the owner's job with that key
// — never its stored answer, which only a retry replays. The job is looked
// up by owner and key together (Ledger.Find), so another owner's job is
// exactly as absent as no job: same ledger work, same 404, same headers,
// same body.

// statusAllow is the Allow header of the status path.
const statusAllow = "GET, HEAD"

// JobStatus is the body of a status answer. Times are RFC 3339 (UTC);
// absent values are null.
type JobStatus struct {
	JobID       string     `json:"job_id"`
	State       string     `json:"state"`
	CreatedAt   *time.Time `json:"created_at"`
	CompletedAt *time.Time `json:"completed_at"`
	ExpiresAt   *time.Time `json:"expires_at"`
	// Attempts is the number of attempts the job has had.
	Attempts int `json:"attempts"`
	// RetryAfter is how many whole seconds, from the ledger's clock at
	// the read, until the state may next change by itself; null when
	// only a request or an operator can change it.
	RetryAfter *int64 `json:"retry_after"`
}

// statusBase is the escaped form of "<path>/", the prefix of every status
// request; "" when path is "" (no status path).
func statusBase(path string) string {
	if path == "" {
		return ""
	}
	return strings.TrimSuffix((&url.URL{Path: path}).EscapedPath(), "/") + "/"
}

// statusKeySegment returns the escaped path after "<StatusPath>/" and
// whether r is addressed to the status path at all.
func (m *Middleware) statusKeySegment(r *http.Request) (string, bool) {
	base := m.statusBase
	if base == "" {
		return "", false
	}
	p := r.URL.EscapedPath()
	if !strings.HasPrefix(p, base) {
		return "", false
	}
	return p[len(base):], true
}

// serveStatus answers r and returns true when r is addressed to the
// status path (<StatusPath>/...); it returns false, having written
// nothing, for every other request. ServeHTTP calls it first, before the
// method decides whether the request is ledgered.
func (m *Middleware) serveStatus(w http.ResponseWriter, r *http.Request) bool {
	seg, ok := m.statusKeySegment(r)
	if !ok {
		return false
	}
	w.Header().Set("Cache-Control", "no-store")
	switch r.Method {
	case http.MethodGet:
	case http.MethodHead:
		w = headWriter{w}
	default:
		w.Header().Set("Allow", statusAllow)
		problem(http.StatusMethodNotAllowed, ProblemMethodNotAllowed, "Method not allowed").
			withDetail("The job status path answers GET and HEAD only.").Write(w)
		return true
	}
	key, err := statusKey(seg)
	if err != nil {
		problem(http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key").withDetail(err.Error() + ".").Write(w)
		return true
	}
	owner := m.cfg.Owner(r)
	if owner == "" {
		problem(http.StatusUnauthorized, ProblemOwnerMissing, "No owner for the idempotency key").
			withDetail("Idempotency keys belong to an authenticated owner; this request has none.").Write(w)
		return true
	}
	ownerHash, keyHash := m.hasher.Owner(owner), m.hasher.Key(key)
	j, err := ledgerCall(m, r.Context(), "find", func(ctx context.Context) (*ledger.Job, error) {
		return m.cfg.Ledger.Find(ctx, ownerHash, keyHash)
	})
	switch {
	case errors.Is(err, ledger.ErrNotFound):
		// The same answer whether no job, an expired one or another
		// owner's holds the key: nothing in it may tell them apart.
		problem(http.StatusNotFound, ProblemJobNotFound, "Job not found").
			withDetail("There is no job for this key.").Write(w)
		return true
	case err != nil:
		if r.Context().Err() != nil {
			return true // the client left
		}
		m.cfg.Logger.Error("ledger unavailable: job status not read", zap.Error(err))
		problem(http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Ledger unavailable").
			withDetail("The job's status could not be read.").retry(time.Second).Write(w)
		return true
	}
	m.cfg.SetVar(r, "job_id", j.ID)
	body, err := json.Marshal(m.jobStatus(j))
	if err != nil { // cannot happen: strings, numbers and times
		body = []byte(`{}`)
	}
	body = append(body, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	setCanonical(h, HeaderJobID, j.ID)
	if j.State == ledger.JobCompleted || j.State == ledger.JobFailed {
		setExpires(h, j.ExpiresAt)
	}
	w.WriteHeader(http.StatusOK)
	w.Write(body)
	return true
}

// statusKey reads the key from its path segment: one segment (a "/" in the
// key is sent as %2F), percent-decoded, then read as the key header is.
func statusKey(seg string) (string, error) {
	if strings.Contains(seg, "/") {
		return "", errors.New("the key must be one path segment: a / in it is sent as %2F")
	}
	key, err := url.PathUnescape(seg)
	if err != nil {
		return "", errors.New("the key is not validly percent-encoded")
	}
	return ParseKey(key)
}

// jobStatus is what a status answer tells of j: never its stored answer.
func (m *Middleware) jobStatus(j *ledger.Job) JobStatus {
	return JobStatus{
		JobID:       j.ID,
		State:       string(j.State),
		CreatedAt:   timeOrNull(j.CreatedAt),
		CompletedAt: timeOrNull(j.CompletedAt),
		ExpiresAt:   timeOrNull(j.ExpiresAt),
		Attempts:    len(j.Attempts),
		RetryAfter:  m.statusRetryAfter(j),
	}
}

func timeOrNull(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// statusRetryAfter returns the whole seconds (rounded up) from the ledger's
// clock at the read (j.ReadAt, never the local clock) until j's state may
// next change by itself, or nil when it cannot: a pending job becomes
// settled or unknown by the deadline of its last running attempt; an
// unknown job may still be completed by a late result until the deadline
// of an attempt that is running or unknown, and after it by the next
// lookup of an unknown attempt whose provider has one (the next round of
// the reconciler, when that lookup is due already). A completed or failed
// job, or an unknown one whose deadlines passed and that no lookup
// settles, changes only by a request or an operator.
func (m *Middleware) statusRetryAfter(j *ledger.Job) *int64 {
	var until time.Time
	for _, a := range j.Attempts {
		live := a.State == ledger.AttemptStarting ||
			(j.State == ledger.JobUnknown && a.State == ledger.AttemptUnknown)
		if !live {
			continue
		}
		next := a.Deadline
		if a.State == ledger.AttemptUnknown && m.looksUp(a.Provider) && !j.ReadAt.IsZero() && !j.ReadAt.Before(a.Deadline) {
			next = a.Lookups().NextAt
			if !next.After(j.ReadAt) {
				next = j.ReadAt.Add(m.cfg.ReconcileEvery)
			}
		}
		if next.After(until) {
			until = next
		}
	}
	if (j.State != ledger.JobPending && j.State != ledger.JobUnknown) || until.IsZero() {
		return nil
	}
	var s int64 = 1 // the ledger did not say its time
	if !j.ReadAt.IsZero() {
		d := until.Sub(j.ReadAt)
		if d <= 0 {
			return nil
		}
		s = int64((d + time.Second - 1) / time.Second)
	}
	return &s
}

// looksUp reports whether the named provider has a lookup.
func (m *Middleware) looksUp(provider string) bool {
	for _, p := range m.cfg.Providers {
		if p.Name == provider {
			return p.Lookup
		}
	}
	return false
}

// headWriter answers HEAD: the headers of GET's answer, no body.
type headWriter struct{ http.ResponseWriter }

func (headWriter) Write(p []byte) (int, error) { return len(p), nil }

// Unwrap gives http.ResponseController the underlying writer.
func (w headWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }
