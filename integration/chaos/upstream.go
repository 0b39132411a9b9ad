package main

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// behaviour is what the upstream does with one request it received.
type behaviour int

const (
	answerFast      behaviour = iota // answers well within attempt_timeout
	answerSlow                       // answers around attempt_timeout, often past it
	refuse503                        // refuses without acting: 503, a definitive failure
	answer500                        // acts, then answers 500: a result like any other
	resetBeforeRead                  // resets the connection before reading the body
	resetAfterRead                   // acts, then resets the connection without answering
	cutShort                         // acts, sends headers (Content-Length) and half the body, then drops
	streamCut                        // acts, streams half a chunked body, then drops
	lateBody                         // acts, sends headers at once and the body just before attempt_deadline
	stall                            // acts, then never answers
	numBehaviours
)

var behaviourNames = [numBehaviours]string{
	answerFast:      "answer",
	answerSlow:      "slow answer",
	refuse503:       "503 refusal",
	answer500:       "500 answer",
	resetBeforeRead: "reset before read",
	resetAfterRead:  "reset after read",
	cutShort:        "answer cut short",
	streamCut:       "stream cut short",
	lateBody:        "body at the deadline",
	stall:           "stall",
}

func (b behaviour) String() string { return behaviourNames[b] }

// weights are the odds of each behaviour, in percent.
var weights = [numBehaviours]int{
	answerFast:      55,
	answerSlow:      12,
	refuse503:       8,
	answer500:       5,
	resetBeforeRead: 5,
	resetAfterRead:  5,
	cutShort:        2,
	streamCut:       2,
	lateBody:        3,
	stall:           3,
}

func pickBehaviour() behaviour { return pick[behaviour](weights[:]) }

// pick returns an index of weights drawn by its weight, in percent; the
// first when the weights add up to less and the draw falls past them.
func pick[B ~int](weights []int) B {
	n := rand.IntN(100)
	for b, w := range weights {
		if n < w {
			return B(b)
		}
		n -= w
	}
	return 0
}

// arrival is one request the upstream's handler received. It is an
// execution when the handler reached its side effect (Executed).
type arrival struct {
	Provider   string
	JobID      string
	Attempt    int    // Idempotency-Attempt; 0 when absent or malformed
	Header     string // what was wrong with the attempt headers, if anything
	Owner, Key string
	Request    uint64 // the client request that started the attempt
	Seq        uint64 // unique per arrival, echoed in the body
	Behaviour  behaviour
	Start, End time.Time // End: before the gateway could see the outcome
	Executed   bool
	Status     int      // the answer's status, 0 when none was sent
	Answered   bool     // the whole answer was written
	Sum        [32]byte // SHA-256 of the answer's body
	Len        int
}

// answerBody is the JSON body of every answer the upstream writes. The
// owner and key let a client see whose answer it got; Seq names the arrival.
type answerBody struct {
	Owner    string `json:"owner"`
	Key      string `json:"key"`
	Job      string `json:"job"`
	Attempt  int    `json:"attempt"`
	Provider string `json:"provider"`
	Seq      uint64 `json:"seq"`
	Executed bool   `json:"executed"`
	Pad      string `json:"pad"`
}

// upstream is the provider behind the gateways: one listener per provider
// name, one record of every arrival.
type upstream struct {
	timeout  time.Duration // the gateways' attempt_timeout
	deadline time.Duration // the gateways' attempt_deadline

	servers []*http.Server
	addrs   map[string]string // provider → host:port
	seq     atomic.Uint64
	running atomic.Int64

	mu       sync.Mutex
	arrivals []*arrival
	faults   [numBehaviours]int
	resets   atomic.Int64 // connections reset as they were accepted
	// acceptResets is when each of them was reset, and on which provider.
	acceptResets []acceptReset
}

// acceptReset is a connection the upstream reset as it accepted it: the
// gateway may have written a request into it, which nobody read.
type acceptReset struct {
	Provider string
	At       time.Time
}

// newUpstream listens on a loopback port for each provider.
func newUpstream(providers []string, timeout, deadline time.Duration, acceptResets float64) (*upstream, error) {
	u := &upstream{timeout: timeout, deadline: deadline, addrs: map[string]string{}}
	for _, p := range providers {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			u.close()
			return nil, err
		}
		u.addrs[p] = l.Addr().String()
		srv := &http.Server{
			Handler:           u.handler(p),
			ReadHeaderTimeout: 5 * time.Second,
			IdleTimeout:       30 * time.Second,
			ErrorLog:          discardLog,
		}
		u.servers = append(u.servers, srv)
		go srv.Serve(&resettingListener{Listener: l, odds: acceptResets, reset: func() { u.acceptReset(p) }})
	}
	return u, nil
}

// close stops the listeners and ends every handler still running.
func (u *upstream) close() {
	for _, s := range u.servers {
		s.Close()
	}
}

// idle waits until no handler runs, or until ctx ends.
func (u *upstream) idle(ctx context.Context) bool {
	for u.running.Load() > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return true
}

// snapshot returns a copy of the arrivals so far.
func (u *upstream) snapshot() []arrival {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]arrival, len(u.arrivals))
	for i, a := range u.arrivals {
		out[i] = *a
	}
	return out
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.arrivals)
}

func (u *upstream) acceptReset(provider string) {
	u.resets.Add(1)
	u.mu.Lock()
	u.acceptResets = append(u.acceptResets, acceptReset{Provider: provider, At: time.Now()})
	u.mu.Unlock()
}

// resetsOnAccept returns the connections reset as they were accepted.
func (u *upstream) resetsOnAccept() []acceptReset {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]acceptReset(nil), u.acceptResets...)
}

func (u *upstream) faultCounts() [numBehaviours]int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.faults
}

func (u *upstream) handler(provider string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.running.Add(1)
		defer u.running.Add(-1)
		a := &arrival{
			Provider:  provider,
			JobID:     r.Header.Get("Idempotency-Job-Id"),
			Key:       r.Header.Get("Idempotency-Key"),
			Owner:     strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "),
			Seq:       u.seq.Add(1),
			Behaviour: pickBehaviour(),
			Start:     time.Now(),
		}
		a.Attempt, a.Header = attemptHeaders(r.Header)
		a.Request, _ = strconv.ParseUint(r.Header.Get(requestHeader), 10, 64)
		// Recorded however the handler ends, an aborting panic included.
		defer u.record(a)
		u.serve(w, r, a)
	})
}

// attemptHeaders reads the attempt number the gateway sends upstream.
func attemptHeaders(h http.Header) (int, string) {
	switch {
	case len(h.Values("Idempotency-Job-Id")) != 1:
		return 0, fmt.Sprintf("%d Idempotency-Job-Id fields", len(h.Values("Idempotency-Job-Id")))
	case len(h.Values("Idempotency-Attempt")) != 1:
		return 0, fmt.Sprintf("%d Idempotency-Attempt fields", len(h.Values("Idempotency-Attempt")))
	}
	n, err := strconv.Atoi(h.Get("Idempotency-Attempt"))
	if err != nil || n < 1 {
		return 0, fmt.Sprintf("Idempotency-Attempt %q", h.Get("Idempotency-Attempt"))
	}
	return n, ""
}

func (u *upstream) record(a *arrival) {
	if a.End.IsZero() {
		a.End = time.Now()
	}
	u.mu.Lock()
	u.arrivals = append(u.arrivals, a)
	u.faults[a.Behaviour]++
	u.mu.Unlock()
}

func (u *upstream) serve(w http.ResponseWriter, r *http.Request, a *arrival) {
	ctx := r.Context()
	if a.Behaviour == resetBeforeRead {
		a.End = time.Now()
		reset(w)
		return
	}
	if _, err := io.Copy(io.Discard, io.LimitReader(r.Body, 1<<20)); err != nil {
		return // the gateway went away before the request was whole: no side effect
	}
	if a.Behaviour == refuse503 {
		u.answer(w, a, http.StatusServiceUnavailable)
		return
	}

	// The side effect: from here on the request has been acted upon.
	a.Executed = true

	switch a.Behaviour {
	case answerFast:
		if sleep(ctx, randDuration(0, u.timeout/3)) {
			u.answer(w, a, http.StatusOK+rand.IntN(2)) // 200 or 201
		}
	case answerSlow:
		if sleep(ctx, randDuration(u.timeout*6/10, u.timeout*5/2)) {
			u.answer(w, a, http.StatusOK)
		}
	case answer500:
		if sleep(ctx, randDuration(0, u.timeout/3)) {
			u.answer(w, a, http.StatusInternalServerError)
		}
	case resetAfterRead:
		sleep(ctx, randDuration(0, u.timeout/3))
		a.End = time.Now()
		reset(w)
	case cutShort, streamCut:
		if !sleep(ctx, randDuration(0, u.timeout/3)) {
			return
		}
		body := u.body(a)
		w.Header().Set("Content-Type", "application/json")
		if a.Behaviour == cutShort {
			// Announced whole: no stream. A chunked body is one.
			w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		}
		a.Status, a.End = http.StatusOK, time.Now()
		w.WriteHeader(http.StatusOK)
		w.Write(body[:len(body)/2])
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case lateBody:
		// The headers stop attempt_timeout; the body ends within a few
		// milliseconds of attempt_deadline as counted from this arrival,
		// which is a little later than the ledger counts it from.
		body := u.body(a)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		a.Status = http.StatusOK
		w.WriteHeader(http.StatusOK)
		http.NewResponseController(w).Flush()
		if !sleep(ctx, time.Until(a.Start.Add(u.deadline-randDuration(0, 25*time.Millisecond)))) {
			return
		}
		a.Sum, a.Len, a.End = sha256.Sum256(body), len(body), time.Now()
		if _, err := w.Write(body); err == nil {
			a.Answered = true
		}
	case stall:
		// Longer than any attempt may run: the gateway gives up first.
		sleep(ctx, u.deadline+2*time.Second)
		a.End = time.Now()
		panic(http.ErrAbortHandler)
	}
}

// body returns the answer's JSON for an arrival, padded to a random size.
func (u *upstream) body(a *arrival) []byte {
	b, err := json.Marshal(answerBody{
		Owner: a.Owner, Key: a.Key, Job: a.JobID, Attempt: a.Attempt, Provider: a.Provider,
		Seq: a.Seq, Executed: a.Executed, Pad: strings.Repeat("x", rand.IntN(1500)),
	})
	if err != nil {
		panic(err) // a struct of strings and numbers always marshals
	}
	return b
}

// answer writes a whole answer. End is taken before the status goes out:
// the gateway cannot act on the answer before it.
func (u *upstream) answer(w http.ResponseWriter, a *arrival, status int) {
	body := u.body(a)
	a.Status, a.Sum, a.Len = status, sha256.Sum256(body), len(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	a.End = time.Now()
	w.WriteHeader(status)
	if _, err := w.Write(body); err == nil {
		a.Answered = true
	}
}

// reset drops the request's connection with a TCP RST.
func reset(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}

// sleep waits d, or until ctx ends; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func randDuration(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + rand.N(hi-lo)
}

// resettingListener resets some connections as soon as they are accepted,
// before a byte is read.
type resettingListener struct {
	net.Listener
	odds  float64
	reset func() // called for each connection reset
}

func (l *resettingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || rand.Float64() >= l.odds {
			return c, err
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
		l.reset()
	}
}
