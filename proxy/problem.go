package proxy

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Problem names: each is the last part of a problem type
// urn:onejob:problem:<name> (docs/contract.md, section 3).
const (
	ProblemKeyMissing        = "key-missing"
	ProblemKeyInvalid        = "key-invalid"
	ProblemOwnerMissing      = "owner-missing"
	ProblemBodyTooLarge      = "body-too-large"
	ProblemKeyReused         = "key-reused"
	ProblemInFlight          = "in-flight"
	ProblemAttemptFailed     = "attempt-failed"
	ProblemOutcomeUnknown    = "outcome-unknown"
	ProblemContract          = "contract-violation"
	ProblemAllFailed         = "all-providers-failed"
	ProblemNotStored         = "response-not-stored"
	ProblemLedgerUnavailable = "ledger-unavailable"
	// ProblemJobNotFound: status_path has no job of this owner under the
	// key (404).
	ProblemJobNotFound = "job-not-found"
	// ProblemMethodNotAllowed: a method other than GET or HEAD on
	// status_path (405).
	ProblemMethodNotAllowed = "method-not-allowed"
)

// Problem is an RFC 9457 problem detail.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	JobID  string `json:"job_id,omitempty"`

	retryAfter time.Duration
}

// ProblemType returns the type URI of a problem name.
func ProblemType(name string) string { return "urn:onejob:problem:" + name }

func problem(status int, name, title string) *Problem {
	return &Problem{Type: ProblemType(name), Title: title, Status: status}
}

func (p *Problem) withDetail(d string) *Problem   { p.Detail = d; return p }
func (p *Problem) withJob(id string) *Problem     { p.JobID = id; return p }
func (p *Problem) retry(d time.Duration) *Problem { p.retryAfter = d; return p }

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	s := int64((d + time.Second - 1) / time.Second)
	return strconv.FormatInt(max(s, 1), 10)
}

// Write sends the problem as application/problem+json.
func (p *Problem) Write(w http.ResponseWriter) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: every field is a string or int
		body = []byte(`{"type":"about:blank"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	delete(h, HeaderReplayed)
	if p.JobID != "" {
		setCanonical(h, HeaderJobID, p.JobID)
	}
	if p.retryAfter > 0 {
		h.Set("Retry-After", retryAfterSeconds(p.retryAfter))
	}
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}
