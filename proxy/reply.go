package proxy

import (
	"net/http"
	"time"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// answer sends the outcome of a run to the client that started it.
// An answer that went out as it arrived is not this: see clientState.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, out runOutcome, jobID string) {
	switch out.verdict {
	case fallback.Result:
		if out.won || out.storeErr != nil {
			setExpires(w.Header(), out.expires)
			m.writeAnswer(w, out.answer, jobID, false)
			return
		}
		// Lost: another answer won, or the job was settled meanwhile.
		if out.job != nil && out.job.Response != nil && out.job.State == ledger.JobCompleted {
			m.replay(w, r, out.job, time.Time{}, false, ledger.TierLedger) // read just now
			return
		}
		problem(http.StatusConflict, ProblemOutcomeUnknown, "Result discarded").
			withDetail("The job was settled otherwise while this attempt ran; its result was discarded.").
			withJob(jobID).Write(w)
	case fallback.Failed:
		setExpires(w.Header(), out.expires)
		if out.answer != nil {
			m.writeAnswer(w, out.answer, jobID, false)
			return
		}
		if out.contract {
			problem(http.StatusBadGateway, ProblemContract, "Every provider broke the contract").
				withDetail("No provider gave an answer that honours the route's contract (" + out.reason + "). A retry may start a new attempt.").
				withJob(jobID).Write(w)
			return
		}
		problem(http.StatusBadGateway, ProblemAllFailed, "Every provider failed").
			withDetail("No provider could be reached (" + out.reason + "). A retry may start a new attempt.").
			withJob(jobID).Write(w)
	default:
		if out.contract {
			problem(http.StatusBadGateway, ProblemContract, "Answer breaks the contract").
				withDetail("The provider's answer breaks the route's contract (" + out.reason + "). It was not stored; the provider may have acted, so the job's outcome is unknown.").
				withJob(jobID).Write(w)
			return
		}
		title := "Outcome unknown"
		if out.status == http.StatusGatewayTimeout {
			title = "Attempt timed out"
		}
		problem(out.status, ProblemOutcomeUnknown, title).
			withDetail("The provider may have acted (" + out.reason + "). The job's outcome is unknown; it will not be re-run.").
			withJob(jobID).Write(w)
	}
}

// setExpires tells when a settled job's key stops being one intent, when
// the ledger said so (an HTTP-date of the ledger's clock).
func setExpires(h http.Header, t time.Time) {
	if !t.IsZero() {
		setCanonical(h, HeaderExpires, string(appendHTTPDate(make([]byte, 0, len(http.TimeFormat)), t)))
	}
}

// appendHTTPDate appends t as HTTP dates are written (http.TimeFormat, in
// UTC) without parsing a layout, as net/http writes its Date header; a
// year past four digits, which no job expires in, takes time.Format.
func appendHTTPDate(b []byte, t time.Time) []byte {
	const days, months = "SunMonTueWedThuFriSat", "JanFebMarAprMayJunJulAugSepOctNovDec"
	t = t.UTC()
	yy, mm, dd := t.Date()
	if yy < 0 || yy > 9999 {
		return t.AppendFormat(b, http.TimeFormat)
	}
	hh, mn, ss := t.Clock()
	day, mon := days[3*t.Weekday():], months[3*(mm-1):]
	return append(b, day[0], day[1], day[2], ',', ' ',
		byte('0'+dd/10), byte('0'+dd%10), ' ',
		mon[0], mon[1], mon[2], ' ',
		byte('0'+yy/1000), byte('0'+yy/100%10), byte('0'+yy/10%10), byte('0'+yy%10), ' ',
		byte('0'+hh/10), byte('0'+hh%10), ':', byte('0'+mn/10), byte('0'+mn%10), ':',
		byte('0'+ss/10), byte('0'+ss%10), ' ', 'G', 'M', 'T')
}

// setCanonical sets field, a name already canonical (this package's
// Header constants are: TestHeaderNamesAreCanonical), to v: as
// http.Header.Set does, without canonicalizing the name on every answer.
func setCanonical(h http.Header, field, v string) {
	h[field] = []string{v}
}

// Found returns the answer a reconciler's lookup found (status, header and
// body) as the ledger keeps it: as an attempt's answer is kept (end-to-end
// headers without the private ones), and marked as the lookup's with
// HeaderReconciled, which storedHeader takes from every provider's answer.
func (m *Middleware) Found(status int, header http.Header, body []byte) *ledger.Response {
	h := m.storable(storedHeader(header))
	h[HeaderReconciled] = []string{"lookup"}
	return &ledger.Response{Status: status, Header: h, Body: body, Size: int64(len(body)), Stored: true}
}

// writeAnswer sends a recorded answer.
func (m *Middleware) writeAnswer(w http.ResponseWriter, a *ledger.Response, jobID string, replayed bool) {
	m.setAnswerHeader(w.Header(), a.Header, jobID, replayed)
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// setAnswerHeader sets in h, a client's answer's header, the answer's
// fields from src and the job's id; a replay is marked, and goes without
// the headers m never stores (an answer stored before one was named
// still holds it), keeping the Preference-Applied a waiter was given
// beside the stored answer's. The values are copied: src's are the
// ledger's or the provider's, and h's may be rewritten in place by a
// handler in front.
func (m *Middleware) setAnswerHeader(h http.Header, src map[string][]string, jobID string, replayed bool) {
	var applied []string
	if replayed {
		src = m.storable(src)
		applied = h[HeaderPreferenceApplied] // the wait a duplicate got (waitFor)
	}
	ledger.CopyHeader(h, src) // h's values may be rewritten in place, as Caddy's deferred `header` operations do
	setCanonical(h, HeaderJobID, jobID)
	if replayed {
		setCanonical(h, HeaderReplayed, "true")
		if _, both := src[HeaderPreferenceApplied]; both && applied != nil {
			// What the provider applied to the first request, and the wait.
			h[HeaderPreferenceApplied] = append(h[HeaderPreferenceApplied], applied...)
		}
	}
}

// replay sends a completed job's stored answer, or 409 when it was not
// stored. now is the ledger's clock when j was read; zero when j was read
// just now. With join, a duplicate that would wait for an answer still
// streaming joins it when it streams through this instance, and otherwise
// waits for its end and replays it.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, j *ledger.Job, now time.Time, join bool, tier ledger.Tier) {
	ctx, span := startSpan(r.Context(), spanReplay)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(attrJobID.String(j.ID), attrJobState.String(string(j.State)), attrTier.String(tier.String()))
		r = r.WithContext(ctx) // a join or a wait is the replay's
	}
	setExpires(w.Header(), j.ExpiresAt)
	if j.Streaming() && (now.IsZero() || now.Sub(j.CompletedAt) < m.cfg.AttemptDeadline) {
		var wait time.Duration
		if join {
			wait = m.waitFor(w, r)
		}
		switch s := m.lives.get(j.ID); {
		case wait > 0 && s != nil && m.join(w, r, j, s):
			return
		case wait > 0 && s == nil:
			// It streams through another instance: Ledger.Wait ends when
			// its body is saved.
			m.wait(w, r, j.ID, wait)
			return
		}
		// The answer won while it was still streaming to its first
		// client; its body is not recorded yet.
		problem(http.StatusConflict, ProblemInFlight, "Answer still streaming").
			withDetail("The answer to this key is still being sent to the first request; retry shortly.").
			withJob(j.ID).retry(time.Second).Write(w)
		return
	}
	if j.Response == nil || !j.Response.Stored {
		problem(http.StatusConflict, ProblemNotStored, "Response not stored").
			withDetail("The job completed, but its answer was too large or cut short, so it cannot be replayed.").
			withJob(j.ID).Write(w)
		return
	}
	m.cfg.SetVar(r, "replayed", "true")
	m.writeAnswer(w, j.Response, j.ID, true)
}
