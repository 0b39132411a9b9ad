package proxy

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// fakeContract breaks on bodies containing "hallucinated", and on answers
// whose Content-Type is text/x-bad.
type fakeContract struct{ body bool }

func (fakeContract) Applies(status int) bool { return status >= 200 && status < 300 }
func (c fakeContract) ChecksBody() bool      { return c.body }
func (fakeContract) CheckHead(_ int, h http.Header) error {
	if h.Get("Content-Type") == "text/x-bad" {
		return errors.New("contract: content_type: want application/json")
	}
	return nil
}
func (c fakeContract) Check(status int, h http.Header, body, _ []byte) error {
	if err := c.CheckHead(status, h); err != nil {
		return err
	}
	if c.body && strings.Contains(string(body), "hallucinated") {
		return errors.New("contract: json_schema: additional property hallucinated")
	}
	return nil
}

func TestContractBreachFailsOver(t *testing.T) {
	fo, _ := fallback.ParseFailoverOn([]string{"contract", "503"})
	h, p, f := newProviders(t, Config{Contract: fakeContract{body: true}, FailoverOn: fo, AttemptTimeout: patience},
		respond(http.StatusOK, `{"hallucinated":true}`), respond(http.StatusOK, `{"ok":true}`))
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusOK, `{"ok":true} 1`)
	id := jobID(t, rec)
	h.waitRun()
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/failed fallback/succeeded")
	if !strings.Contains(j.Attempts[0].Error, "hallucinated") {
		t.Errorf("the breach is not recorded on the attempt: %q", j.Attempts[0].Error)
	}
	if p.calls() != 1 || f.calls() != 1 {
		t.Errorf("calls %d %d", p.calls(), f.calls())
	}
}

func TestContractBreachWithoutFailoverIsUnknown(t *testing.T) {
	h, _, f := newProviders(t, Config{Contract: fakeContract{body: true}, AttemptTimeout: patience},
		respond(http.StatusOK, `{"hallucinated":true}`), respond(http.StatusOK, `{"ok":true}`))
	rec := h.do(post("k", `{}`))
	prob := wantProblem(t, rec, http.StatusBadGateway, ProblemContract)
	if strings.Contains(rec.Body.String(), `{"hallucinated":true}`) || !strings.Contains(prob.Detail, "hallucinated") {
		t.Errorf("problem %+v", prob)
	}
	h.waitRun()
	wantJob(t, h.job(prob.JobID), ledger.JobUnknown, "primary/unknown")
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemOutcomeUnknown)
	if f.calls() != 0 {
		t.Errorf("fallback called %d times", f.calls())
	}
}

func TestContractEveryProviderBreaks(t *testing.T) {
	fo, _ := fallback.ParseFailoverOn([]string{"contract"})
	h, _, _ := newProviders(t, Config{Contract: fakeContract{body: true}, FailoverOn: fo, AttemptTimeout: patience},
		respond(http.StatusOK, `{"hallucinated":1}`), respond(http.StatusOK, `{"hallucinated":2}`))
	rec := h.do(post("k", `{}`))
	prob := wantProblem(t, rec, http.StatusBadGateway, ProblemContract)
	h.waitRun()
	wantJob(t, h.job(prob.JobID), ledger.JobFailed, "primary/failed fallback/failed")
}

// TestContractCheckedStreamIsBuffered: a stream whose body the contract
// checks is not passed through: it breaks the contract at the end, and the
// client never sees a byte of it.
func TestContractCheckedStreamIsBuffered(t *testing.T) {
	fo, _ := fallback.ParseFailoverOn([]string{"contract"})
	stream := func(w http.ResponseWriter, r *http.Request, n int) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: hallucinated\n\n"))
		w.(http.Flusher).Flush()
		return nil
	}
	h, _, _ := newProviders(t, Config{Contract: fakeContract{body: true}, FailoverOn: fo, AttemptTimeout: patience},
		stream, respond(http.StatusOK, `{"ok":true}`))
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusOK, `{"ok":true} 1`)
	h.waitRun()
	wantJob(t, h.job(jobID(t, rec)), ledger.JobCompleted, "primary/failed fallback/succeeded")
}

// TestContractHeadBreachOnStream: content_type is checked at the headers of
// a stream that would otherwise be passed through.
func TestContractHeadBreachOnStream(t *testing.T) {
	stream := func(w http.ResponseWriter, r *http.Request, n int) error {
		w.Header().Set("Content-Type", "text/x-bad")
		w.Write([]byte("chunk"))
		w.(http.Flusher).Flush()
		return nil
	}
	h, _, _ := newProviders(t, Config{Contract: fakeContract{}, AttemptTimeout: patience}, stream, respond(http.StatusOK, "x"))
	rec := h.do(post("k", `{}`))
	prob := wantProblem(t, rec, http.StatusBadGateway, ProblemContract)
	h.waitRun()
	j := h.job(prob.JobID)
	wantJob(t, j, ledger.JobUnknown, "primary/unknown")
	if j.Response != nil {
		t.Errorf("a breach was stored: %+v", j.Response)
	}
}

// TestContractNotAppliedToOtherStatuses: the contract checks 2xx here; a
// 404 is the job's result, unchecked.
func TestContractNotAppliedToOtherStatuses(t *testing.T) {
	h, _, _ := newProviders(t, Config{Contract: fakeContract{body: true}, AttemptTimeout: patience},
		respond(http.StatusNotFound, "hallucinated"), respond(http.StatusOK, "x"))
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusNotFound, "hallucinated 1")
}
