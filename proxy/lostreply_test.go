package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/ledger/sealed"
)

// errReplyLost is what a ledger client reports when a command ran but its
// reply never came back.
var errReplyLost = errors.New("read tcp: connection reset by peer")

// lossyLedger runs calls on a memory ledger and loses replies: drop[op]
// replies of op are lost after the call ran; while down, no call runs.
type lossyLedger struct {
	ledger.Ledger

	mu      sync.Mutex
	drop    map[string]int
	down    bool
	downNow map[string]bool // op: go down as its reply is lost
	lost    func(op string) // if set, called as op's reply is lost
	repeats []bool          // each reservation's Repeat, in order
}

func newLossy() *lossyLedger {
	return &lossyLedger{Ledger: memory.New(), drop: map[string]int{}, downNow: map[string]bool{}}
}

func (l *lossyLedger) setDown(down bool) {
	l.mu.Lock()
	l.down = down
	l.mu.Unlock()
}

// do runs call unless the ledger is down, then loses its reply if op's
// drop count says so.
func (l *lossyLedger) do(op string, call func() error) error {
	l.mu.Lock()
	down := l.down
	l.mu.Unlock()
	if down {
		return errors.New("dial tcp: connection refused")
	}
	err := call()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.drop[op] > 0 {
		l.drop[op]--
		if l.downNow[op] {
			l.down = true
		}
		if l.lost != nil {
			l.lost(op)
		}
		return errReplyLost
	}
	return err
}

func (l *lossyLedger) Reserve(ctx context.Context, p ledger.ReserveParams) (r ledger.Reservation, err error) {
	l.mu.Lock()
	l.repeats = append(l.repeats, p.Repeat)
	l.mu.Unlock()
	err = l.do("reserve", func() error { r, err = l.Ledger.Reserve(ctx, p); return err })
	return r, err
}

func (l *lossyLedger) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (c ledger.Completion, err error) {
	err = l.do("complete", func() error { c, err = l.Ledger.Complete(ctx, ref, resp); return err })
	return c, err
}

func (l *lossyLedger) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	return l.do("save_body", func() error { return l.Ledger.SaveBody(ctx, ref, body, size, stored) })
}

func (l *lossyLedger) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (a *ledger.Attempt, err error) {
	err = l.do("fail", func() error { a, err = l.Ledger.Fail(ctx, ref, reason, next); return err })
	return a, err
}

func (l *lossyLedger) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	return l.do("unsent", func() error { return l.Ledger.Unsent(ctx, ref) })
}

// waitJobFailed waits until the one job l holds is failed, as a never-sent
// or failed attempt is recorded once the ledger answers again; what names
// what must be recorded.
func waitJobFailed(t *testing.T, l ledger.Ledger, what string) {
	t.Helper()
	deadline := time.Now().Add(patience)
	for onlyJob(t, l).State != ledger.JobFailed {
		if time.Now().After(deadline) {
			t.Fatalf("%s was not recorded: job %s [%s]", what, onlyJob(t, l).State, attemptsOf(onlyJob(t, l)))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// onlyJob returns the one job the ledger holds.
func onlyJob(t *testing.T, l ledger.Ledger) *ledger.Job {
	t.Helper()
	page, err := l.Jobs(context.Background(), ledger.JobQuery{})
	if err != nil || len(page.Jobs) != 1 {
		t.Fatalf("jobs %+v, %v; want one", page.Jobs, err)
	}
	j, err := l.Job(context.Background(), page.Jobs[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// A reservation whose reply was lost is repeated: the request is forwarded
// once, as the job's first attempt, and its answer is the client's own.
func TestReserveReplyLostIsRepeated(t *testing.T) {
	l := newLossy()
	l.drop["reserve"] = 1
	obs := newCountingObserver()
	h := newHarness(t, Config{Ledger: l, Observer: obs}, nil)
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	h.waitRun()
	wantJob(t, h.job(jobID(t, rec)), ledger.JobCompleted, "next/succeeded")
	wantReplay(t, h.do(post("k", `{}`)), jobID(t, rec), http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	if h.up.calls() != 1 || obs.repeats["reserve"] != 1 {
		t.Errorf("upstream called %d times, reserve repeated %d times", h.up.calls(), obs.repeats["reserve"])
	}
	// The repeat says it is one, so that no memory of completed jobs
	// answers it in the ledger's place (near.Answer); the replay is a new
	// call.
	if l.repeats = l.repeats[:3]; !slices.Equal(l.repeats, []bool{false, true, false}) {
		t.Errorf("reservations marked repeats: %v, want [false true false]", l.repeats)
	}
}

// A completion whose reply was lost is repeated, and the repeat reports
// that it won: the first client gets its own answer, not a replay.
func TestCompleteReplyLostStillWins(t *testing.T) {
	l := newLossy()
	l.drop["complete"] = 1
	h := newHarness(t, Config{Ledger: l}, nil)
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	h.waitRun()
	wantJob(t, h.job(jobID(t, rec)), ledger.JobCompleted, "next/succeeded")
	wantReplay(t, h.do(post("k", `{}`)), jobID(t, rec), http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// A stream whose completion (at its headers) and body save lost their
// replies reaches its client, is stored, and replays whole.
func TestStreamReplyLostIsStored(t *testing.T) {
	for _, op := range []string{"complete", "save_body"} {
		t.Run(op, func(t *testing.T) {
			const whole = "data: 1\n\ndata: 2\n\n"
			l := newLossy()
			l.drop[op] = 1
			flushed := make(chan struct{}, 1)
			g := newGate(t)
			h, p, _ := newProviders(t, Config{Ledger: l, AttemptTimeout: patience},
				eventStream(flushed, g, []byte("data: 2\n\n")), respond(http.StatusCreated, "fallback"))
			srv := serveHarness(t, h, g)
			resp := postTo(t, srv, "k")
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplayed) != "" {
				t.Fatalf("status %d, headers %v", resp.StatusCode, resp.Header)
			}
			recv(t, flushed, "the provider's flush")
			g.open()
			got, err := io.ReadAll(bufio.NewReader(resp.Body))
			if err != nil || string(got) != whole {
				t.Fatalf("stream %q, %v", got, err)
			}
			h.waitRun()
			j := h.job(resp.Header.Get(HeaderJobID))
			wantJob(t, j, ledger.JobCompleted, "primary/succeeded")
			if j.Response == nil || !j.Response.Stored || string(j.Response.Body) != whole {
				t.Fatalf("stored response %+v", j.Response)
			}
			retry := postTo(t, srv, "k")
			defer retry.Body.Close()
			replayed, err := io.ReadAll(retry.Body)
			if err != nil || string(replayed) != whole || retry.Header.Get(HeaderReplayed) != "true" {
				t.Errorf("retry: %d %q %v", retry.StatusCode, replayed, err)
			}
			if p.calls() != 1 {
				t.Errorf("primary called %d times", p.calls())
			}
		})
	}
}

// A reservation whose reply was lost, with the ledger down afterwards: the
// request is not forwarded (503), and once the ledger answers again its
// attempt is recorded failed (never sent), not unknown, so the retry runs.
func TestReserveReplyLostThenDownIsRecordedUnsent(t *testing.T) {
	l := newLossy()
	l.drop["reserve"], l.downNow["reserve"] = 1, true
	h := newHarness(t, Config{Ledger: l, Hold: func() func() { return func() {} }}, nil)
	wantProblem(t, h.do(post("k", `{}`)), http.StatusServiceUnavailable, ProblemLedgerUnavailable)
	if h.up.calls() != 0 {
		t.Fatalf("upstream called %d times while the ledger was down", h.up.calls())
	}
	wantJob(t, onlyJob(t, h.l), ledger.JobPending, "next/starting")
	l.setDown(false)
	waitJobFailed(t, h.l, "the never-sent attempt")
	l.mu.Lock()
	for i, repeat := range l.repeats[1:] {
		if !repeat {
			t.Errorf("reservation %d, which repeats the first, is not marked a repeat", i+2)
		}
	}
	l.mu.Unlock()
	j := onlyJob(t, h.l)
	wantJob(t, j, ledger.JobFailed, "next/failed")
	if j.Attempts[0].Error != ledger.ReasonUnsent {
		t.Errorf("attempt error %q", j.Attempts[0].Error)
	}
	rec := h.do(post("k", `{}`))
	wantAnswer(t, rec, http.StatusCreated, "{\"id\":\"ch_1\",\"amount\":100}\n")
	if h.up.calls() != 1 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// The provider cannot be dialled, and the ledger goes down before the
// failure is recorded: the attempt was never sent, and once the ledger
// answers again it is recorded failed, not left for its lease to make
// unknown; the retry runs the job.
func TestConnectErrorNotRecordedIsRecordedUnsent(t *testing.T) {
	l := newLossy()
	h := newHarness(t, Config{Ledger: l}, func(w http.ResponseWriter, r *http.Request, n int) error {
		if n == 1 {
			l.setDown(true)
			return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
		}
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte("charged"))
		return err
	})
	first := h.do(post("k", `{}`))
	if first.Code/100 != 5 {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	h.waitRun()
	l.setDown(false)
	waitJobFailed(t, h.l, "the never-sent attempt")
	wantAnswer(t, h.do(post("k", `{}`)), http.StatusCreated, "charged")
	if h.up.calls() != 2 {
		t.Errorf("upstream called %d times", h.up.calls())
	}
}

// The provider cannot be dialled, and by the time the gateway records it
// (its results are taken one at a time: another's completion may come
// first), the attempt's lease has made it unknown by the ledger's clock.
// A connect error means the request never left: the attempt is recorded
// failed as never sent, not left unknown for an operator; the retry runs
// the job. (The simulation found this on a hedged route, seed 5084759.)
func TestConnectErrorAfterLeaseIsRecordedUnsent(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	const lease = time.Hour // by the ledger's clock, which the test moves
	h := newHarness(t, Config{Ledger: memory.New(memory.WithClock(clock.now)), AttemptDeadline: lease},
		func(w http.ResponseWriter, r *http.Request, n int) error {
			if n == 1 {
				clock.advance(lease + time.Minute)
				return &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")}
			}
			w.WriteHeader(http.StatusCreated)
			_, err := w.Write([]byte("charged"))
			return err
		})
	if first := h.do(post("k", `{}`)); first.Code/100 != 5 {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	h.waitRun()
	waitJobFailed(t, h.l, "the never-sent attempt")
	if a := onlyJob(t, h.l).Attempts[0]; a.Error != ledger.ReasonUnsent {
		t.Errorf("the attempt's error is %q, want %q", a.Error, ledger.ReasonUnsent)
	}
	wantAnswer(t, h.do(post("k", `{}`)), http.StatusCreated, "charged")
}

// The provider refuses (503, before acting), and the ledger goes down
// before the failure is recorded: once the ledger answers again, within
// the attempt's deadline, the failure is recorded, not left for the lease
// to make unknown; the retry runs the job.
func TestFailureNotRecordedIsRecordedLater(t *testing.T) {
	l := newLossy()
	h := newHarness(t, Config{Ledger: l, AttemptDeadline: time.Minute}, func(w http.ResponseWriter, r *http.Request, n int) error {
		if n == 1 {
			l.setDown(true)
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		}
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte("charged"))
		return err
	})
	if first := h.do(post("k", `{}`)); first.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	h.waitRun()
	l.setDown(false)
	waitJobFailed(t, h.l, "the failure")
	if a := onlyJob(t, h.l).Attempts[0]; a.Error != "503" {
		t.Errorf("the failed attempt's error is %q", a.Error)
	}
	wantAnswer(t, h.do(post("k", `{}`)), http.StatusCreated, "charged")
}

// On a hedged route, a result that came after its attempt's deadline was
// discarded although its provider acted: when the other attempt then fails
// definitively, the job is unknown, not failed, and a retry runs nothing.
func TestHedgedLateResultBlocksTheJob(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	const lease = time.Hour // by the ledger's clock, which the test moves
	pEntered, fEntered := make(chan struct{}, 1), make(chan struct{}, 1)
	pGate, fGate := newGate(t), newGate(t)
	h, p, f := newProviders(t, Config{
		Ledger:     memory.New(memory.WithClock(clock.now)),
		HedgeAfter: hedgeAfter, AttemptTimeout: patience, AttemptDeadline: lease,
	},
		held(pEntered, pGate, respond(http.StatusCreated, "primary")),
		func(w http.ResponseWriter, r *http.Request, n int) error {
			fEntered <- struct{}{}
			<-fGate.ch
			return respond(http.StatusServiceUnavailable, "fallback")(w, r, n)
		})
	first := h.goDo(post("k", `{}`))
	recv(t, pEntered, "the primary's call")
	clock.advance(lease / 2)
	recv(t, fEntered, "the hedge's call")
	clock.advance(lease/2 + time.Minute) // past the primary's deadline, not the hedge's
	pGate.open()
	rec := recv(t, first, "the first answer")
	if rec.Code == http.StatusCreated {
		t.Fatalf("a result after attempt_deadline was sent as the job's result: %d %q", rec.Code, rec.Body)
	}
	fGate.open()
	h.waitRun()
	j := onlyJob(t, h.l)
	wantJob(t, j, ledger.JobUnknown, "primary/lost fallback/failed")
	wantProblem(t, h.do(post("k", `{}`)), http.StatusConflict, ProblemOutcomeUnknown)
	if p.calls() != 1 || f.calls() != 1 {
		t.Errorf("primary %d calls, fallback %d: the job was run again", p.calls(), f.calls())
	}
}

// A failover whose reply was lost is repeated; when the repeat answers
// with the next attempt past its lease by the ledger's clock, that attempt
// is never sent (its provider may drop it by then, or a lookup may already
// have judged it absent): it is recorded failed as never sent.
func TestFailoverReplyLostPastLeaseIsNotSent(t *testing.T) {
	clock := &testClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	const lease = time.Hour // by the ledger's clock, which the test moves
	l := newLossy()
	l.Ledger = memory.New(memory.WithClock(clock.now))
	l.drop["fail"] = 1
	l.lost = func(string) { clock.advance(lease + time.Minute) }
	h, p, f := newProviders(t, Config{Ledger: l, AttemptDeadline: lease},
		respond(http.StatusServiceUnavailable, "primary busy"), respond(http.StatusCreated, "fallback"))
	if rec := h.do(post("k", `{}`)); rec.Code == http.StatusCreated {
		t.Errorf("the client got the fallback's answer: %d %q", rec.Code, rec.Body)
	}
	h.waitRun()
	if p.calls() != 1 || f.calls() != 0 {
		t.Fatalf("primary %d calls, fallback %d: an attempt past its lease was sent", p.calls(), f.calls())
	}
	deadline := time.Now().Add(patience)
	for onlyJob(t, h.l).State != ledger.JobFailed && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	j := onlyJob(t, h.l)
	wantJob(t, j, ledger.JobFailed, "primary/failed fallback/failed")
	if j.Attempts[1].Error != ledger.ReasonUnsent {
		t.Errorf("the fallback's attempt failed with %q, want %q", j.Attempts[1].Error, ledger.ReasonUnsent)
	}
}

// deadlineLedger records whether the context of each Reserve carried a
// deadline; local says whether it is a local ledger (ledger.Local).
type deadlineLedger struct {
	ledger.Ledger
	local bool

	mu        sync.Mutex
	deadlines []bool
}

func (l *deadlineLedger) Local() bool { return l.local }

func (l *deadlineLedger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	_, ok := ctx.Deadline()
	l.mu.Lock()
	l.deadlines = append(l.deadlines, ok)
	l.mu.Unlock()
	return l.Ledger.Reserve(ctx, p)
}

// A call to a ledger across a network gets a deadline for each try; a call
// to a local ledger runs once, with no timer of its own, sealed or not.
func TestLedgerCallDeadlineOnlyAcrossANetwork(t *testing.T) {
	for _, local := range []bool{false, true} {
		l := &deadlineLedger{Ledger: memory.New(), local: local}
		keys, err := sealed.NewKeyring(sealed.Key{ID: "k1", Secret: bytes.Repeat([]byte{7}, sealed.KeySize)})
		if err != nil {
			t.Fatal(err)
		}
		for _, stacked := range []ledger.Ledger{l, sealed.New(l, keys)} {
			if got := ledger.IsLocal(stacked); got != local {
				t.Fatalf("IsLocal(%T) = %v, want %v", stacked, got, local)
			}
			h := newHarness(t, Config{Ledger: stacked}, private("application/json"))
			if rec := h.do(post(ledger.NewID(), `{}`)); rec.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
		}
		l.mu.Lock()
		for i, had := range l.deadlines {
			if had == local {
				t.Errorf("local %v: reserve %d had a deadline: %v", local, i, had)
			}
		}
		l.mu.Unlock()
	}
}
