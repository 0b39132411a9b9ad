package proxy

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// Rule 8 of docs/contract.md: no decision uses the gateway's local clock where the ledger
// has one. These tests run the ledger's clock a minute ahead of, or behind,
// the gateway's: the answers must be those of agreeing clocks.

// skewed returns a ledger whose clock is offset from the local one.
func skewed(offset time.Duration) *memory.Ledger {
	return memory.New(memory.WithClock(func() time.Time { return time.Now().Add(offset) }))
}

func retryAfter(t *testing.T, rec interface{ Header() http.Header }) int {
	t.Helper()
	v := rec.Header().Get("Retry-After")
	n, err := strconv.Atoi(v)
	if err != nil {
		t.Fatalf("Retry-After %q", v)
	}
	return n
}

// A duplicate whose wait ends while the job is still in flight is told to
// come back when attempt_timeout may have ended, by the ledger's clock.
func TestClockSkewRetryAfterInFlight(t *testing.T) {
	for _, offset := range []time.Duration{time.Minute, -time.Minute} {
		t.Run(offset.String(), func(t *testing.T) {
			const timeout = 3 * time.Second
			_, release, first, dupCh := waitScenario(t, Config{
				Ledger: skewed(offset), AttemptTimeout: timeout, AttemptDeadline: patience, InFlightWait: 50 * time.Millisecond,
			}, created)
			dup := recv(t, dupCh, "the duplicate's answer")
			wantProblem(t, dup, http.StatusConflict, ProblemInFlight)
			if n := retryAfter(t, dup); n < 2 || n > 3 {
				t.Errorf("Retry-After %d s, want what is left of attempt_timeout (%v)", n, timeout)
			}
			close(release)
			recv(t, first, "the first answer")
		})
	}
}

// A duplicate that waited and saw the job become unknown is told to come
// back when a late result may still come: until attempt_deadline, by the
// ledger's clock.
func TestClockSkewRetryAfterUnknown(t *testing.T) {
	for _, offset := range []time.Duration{time.Minute, -time.Minute} {
		t.Run(offset.String(), func(t *testing.T) {
			_, release, first, dupCh := waitScenario(t, Config{
				Ledger: skewed(offset), AttemptTimeout: patience, AttemptDeadline: 20 * time.Second,
			}, func(http.ResponseWriter, *http.Request, int) error {
				return errors.New("connection reset after the request was written")
			})
			close(release)
			wantProblem(t, recv(t, first, "the first answer"), http.StatusBadGateway, ProblemOutcomeUnknown)
			dup := recv(t, dupCh, "the duplicate's answer")
			wantProblem(t, dup, http.StatusConflict, ProblemOutcomeUnknown)
			if n := retryAfter(t, dup); n < 15 || n > 20 {
				t.Errorf("Retry-After %d s, want what is left of attempt_deadline (20 s)", n)
			}
		})
	}
}

// A retry that arrives while the winning answer still streams, and would
// not wait, is told so, not that the answer was never stored.
func TestClockSkewStillStreaming(t *testing.T) {
	for _, offset := range []time.Duration{time.Minute, -time.Minute} {
		t.Run(offset.String(), func(t *testing.T) {
			flushed := make(chan struct{}, 1)
			g := newGate(t)
			h, _, _ := newProviders(t, Config{Ledger: skewed(offset), AttemptTimeout: patience, AttemptDeadline: 20 * time.Second},
				eventStream(flushed, g, []byte("data: 2\n\n")), respond(http.StatusCreated, "fallback"))
			srv := serveHarness(t, h, g)
			resp := postTo(t, srv, "k")
			defer resp.Body.Close()
			body := bufio.NewReader(resp.Body)
			readN(t, body, len("data: 1\n\n"))
			recv(t, flushed, "the provider's flush")
			retry := h.do(withPrefer(post("k", `{}`), "wait=0"))
			p := wantProblem(t, retry, http.StatusConflict, ProblemInFlight)
			if p.Title != "Answer still streaming" {
				t.Errorf("retry while streaming: %q", p.Title)
			}
			g.open()
			io.ReadAll(body)
			h.waitRun()
			if j := onlyJob(t, h.l); j.State != ledger.JobCompleted || !j.Response.Stored {
				t.Errorf("job %s stored %v", j.State, j.Response != nil && j.Response.Stored)
			}
		})
	}
}
