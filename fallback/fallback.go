// Package fallback decides what an attempt's answer means for its job and
// which provider, if any, gets the next attempt: the failover rules, and the
// target of a hedge. It knows nothing of storage or of Caddy.
package fallback

import (
	"fmt"
	"strconv"
	"time"
)

// Verdict is what an attempt's answer says about the job.
type Verdict int

const (
	// Result: the answer is the job's result, stored and replayed.
	Result Verdict = iota
	// Failed: a definitive failure; the provider did not act.
	Failed
	// Unknown: the provider may have acted; nothing may re-run the job.
	Unknown
)

// String names the verdict: result, failed or unknown.
func (v Verdict) String() string {
	switch v {
	case Result:
		return "result"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// ReasonConnect is the reason of a definitive failure where the request
// never left: a dial or TLS handshake failure, or no upstream available.
const ReasonConnect = "connect_error"

// FailoverOn names the answers that show a provider did not act on a
// request.
type FailoverOn struct {
	ConnectError bool
	Statuses     map[int]bool
	// Contract: answers that break the route's contract (only for
	// providers where a wrong answer has no side effect).
	Contract bool
}

// DefaultFailoverOn is connect_error 429 503.
func DefaultFailoverOn() FailoverOn {
	return FailoverOn{ConnectError: true, Statuses: map[int]bool{429: true, 503: true}}
}

// ParseFailoverOn parses the words of failover_on: status codes,
// connect_error and contract.
func ParseFailoverOn(words []string) (FailoverOn, error) {
	f := FailoverOn{Statuses: map[int]bool{}}
	for _, w := range words {
		switch w {
		case "connect_error":
			f.ConnectError = true
		case "contract":
			f.Contract = true
		default:
			code, err := strconv.Atoi(w)
			if err != nil || code < 100 || code > 599 {
				return f, fmt.Errorf("failover_on: %q is not connect_error, contract or a status code", w)
			}
			f.Statuses[code] = true
		}
	}
	return f, nil
}

// IsZero reports whether nothing is named.
func (f FailoverOn) IsZero() bool {
	return len(f.Statuses) == 0 && !f.ConnectError && !f.Contract
}

// Answer is what one attempt produced.
type Answer struct {
	// Status is the answer's status; 0 when none was written.
	Status int
	// Err is the handler's error, if any.
	Err error
	// Connect says Err shows the request was never sent.
	Connect bool
	// Cut says the answer ended early: an error or panic after its
	// headers, or a body copy that failed.
	Cut bool
}

// Classify judges an answer. A connect error is always definitive (nothing
// was sent); whether it fails over is Failover's business.
func (f FailoverOn) Classify(a Answer) (Verdict, string) {
	switch {
	case a.Status == 0 && a.Err != nil && a.Connect:
		return Failed, ReasonConnect
	case a.Cut:
		return Unknown, "answer cut short"
	case a.Status == 0 && a.Err != nil:
		return Unknown, "upstream error: " + a.Err.Error()
	case a.Status == 0:
		return Unknown, "no answer"
	case a.Status == 499:
		return Unknown, "request cancelled below the gateway (499)"
	case f.Statuses[a.Status]:
		return Failed, strconv.Itoa(a.Status)
	}
	return Result, ""
}

// allows reports whether a definitive failure for reason lets the job fail
// over to another provider.
func (f FailoverOn) allows(reason string) bool {
	if reason == ReasonConnect {
		return f.ConnectError
	}
	return true // a status in failover_on, or a contract breach it names
}

// Policy chooses the providers of a job's attempts.
type Policy struct {
	// Providers are the provider names, primary first.
	Providers []string
	// FailoverOn names the definitive failures.
	FailoverOn FailoverOn
	// HedgeAfter starts a concurrent attempt on the next provider when
	// the running one has sent no headers for that long; 0 is off.
	HedgeAfter time.Duration
	// Eligible reports whether automatic failover or hedging may reach
	// provider i (for example, its latest probe passed). nil: all may.
	Eligible func(i int) bool
}

func (p *Policy) eligible(i int) bool { return p.Eligible == nil || p.Eligible(i) }

// next returns the first eligible provider after index after.
func (p *Policy) next(after int) (int, bool) {
	for i := after + 1; i < len(p.Providers); i++ {
		if p.eligible(i) {
			return i, true
		}
	}
	return 0, false
}

// Failover returns the provider that gets the next attempt after the
// attempt on provider `after` failed definitively for reason, if any.
func (p *Policy) Failover(after int, reason string) (int, bool) {
	if !p.FailoverOn.allows(reason) {
		return 0, false
	}
	return p.next(after)
}

// Hedge returns the provider a hedge goes to when the latest provider tried
// is `after`, if hedging is on and one is eligible.
func (p *Policy) Hedge(after int) (int, bool) {
	if p.HedgeAfter <= 0 {
		return 0, false
	}
	return p.next(after)
}

// Index returns the position of the named provider, or 0 (the primary).
func (p *Policy) Index(name string) int {
	for i, n := range p.Providers {
		if n == name {
			return i
		}
	}
	return 0
}
