package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// countingLedger counts reservations and can fail them.
type countingLedger struct {
	ledger.Ledger
	reserves   atomic.Int32
	reserveErr error
}

func (l *countingLedger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	l.reserves.Add(1)
	if l.reserveErr != nil {
		return ledger.Reservation{}, l.reserveErr
	}
	return l.Ledger.Reserve(ctx, p)
}

// TestMalformedKeysNeverReachTheLedger: keys that no HTTP/1.1 parser would
// let through (CR, LF, NUL) reach the middleware as values all the same
// when it sits behind another front end; they, and non-ASCII, overlong and
// badly quoted keys, are a 400 key-invalid that names no part of the key,
// and neither the ledger nor the provider sees the request.
func TestMalformedKeysNeverReachTheLedger(t *testing.T) {
	l := &countingLedger{Ledger: memory.New()}
	h := newHarness(t, Config{Ledger: l}, nil)
	for name, key := range map[string]string{
		"CR":               "ke\ry",
		"LF":               "ke\ny",
		"CRLF injection":   "key\r\nX-Injected: 1",
		"NUL":              "ke\x00y",
		"tab":              "ke\ty",
		"space":            "ke y",
		"DEL":              "ke\x7fy",
		"non-ASCII":        "k\u00e9y",
		"invalid UTF-8":    "k\xffy",
		"10 KB":            strings.Repeat("k", 10<<10),
		"256 bytes":        strings.Repeat("k", MaxKeyLength+1),
		"quoted CR":        "\"ke\ry\"",
		"quoted non-ASCII": "\"k\u00e9y\"",
		"bad escape":       `"k\ey"`,
		"empty":            "",
		"empty quoted":     `""`,
	} {
		t.Run(name, func(t *testing.T) {
			r := post("", `{}`)
			r.Header[DefaultKeyHeader] = []string{key}
			rec := h.do(r)
			wantProblem(t, rec, http.StatusBadRequest, ProblemKeyInvalid)
			if len(key) > 2 && strings.Contains(rec.Body.String(), strings.Trim(key, `"`)) {
				t.Errorf("the answer echoes the key: %s", rec.Body)
			}
			for k := range rec.Header() {
				if k == "X-Injected" {
					t.Error("a header was injected through the key")
				}
			}
		})
	}
	if n := l.reserves.Load(); n != 0 {
		t.Errorf("the ledger was asked %d times", n)
	}
	if h.up.calls() != 0 {
		t.Errorf("the provider was called %d times", h.up.calls())
	}
}

// TestNoKeyOrOwnerInLogsOrProblems runs the flows that log (a timeout and
// its late result, an answer that could not be recorded, a ledger that is
// down, a definitive failure, a mismatch, a waiter) and the ones that
// answer problems, and looks for the key and the owner in every log entry
// (message and fields) and every answer the gateway wrote itself: keys and
// owners are secrets-adjacent, so only job and attempt ids are logged.
func TestNoKeyOrOwnerInLogsOrProblems(t *testing.T) {
	const (
		owner = "Bearer tok-owner-5n2Qx8Vb"
		key   = "key-secret-7Hk3Wp9Z"
	)
	core, logs := observer.New(zapcore.DebugLevel)
	logger := zap.New(core)

	send := func(h *harness, k, body string) string {
		r := post("", body)
		r.Header.Set("Authorization", owner)
		r.Header.Set(DefaultKeyHeader, k)
		rec := h.do(r)
		if rec.Code >= 400 {
			return rec.Body.String()
		}
		return ""
	}
	var answers []string

	// A timeout, then its late result; a retry while unknown; a mismatch.
	release := make(chan struct{})
	h := newHarness(t, Config{Logger: logger, AttemptTimeout: 50 * time.Millisecond}, func(w http.ResponseWriter, r *http.Request, n int) error {
		if r.Header.Get(DefaultKeyHeader) == key {
			<-release
		}
		if strings.HasSuffix(r.Header.Get(DefaultKeyHeader), "-busy") {
			w.WriteHeader(http.StatusServiceUnavailable)
			return nil
		}
		return created(w, r, n)
	})
	answers = append(answers, send(h, key, `{}`), send(h, key, `{}`), send(h, key, `{"other":1}`))
	close(release)
	h.waitRun()
	answers = append(answers, send(h, key, `{"other":1}`), send(h, key+"-busy", `{}`))
	h.waitRun()

	// A result that cannot be recorded.
	hl := &hookLedger{Ledger: memory.New(), completeErr: errors.New("ledger went away")}
	h2 := newHarness(t, Config{Logger: logger, Ledger: hl, InFlightReject: true}, nil)
	answers = append(answers, send(h2, key, `{}`), send(h2, key, `{}`))
	h2.waitRun()

	// A ledger that is down.
	down := &countingLedger{Ledger: memory.New(), reserveErr: fmt.Errorf("dial tcp: refused")}
	h3 := newHarness(t, Config{Logger: logger, Ledger: down}, nil)
	answers = append(answers, send(h3, key, `{}`))

	if logs.Len() == 0 {
		t.Fatal("nothing was logged: the flows above log")
	}
	for _, e := range logs.All() {
		text := e.Message + fmt.Sprint(e.ContextMap())
		for _, secret := range []string{key, owner, "tok-owner-5n2Qx8Vb"} {
			if strings.Contains(text, secret) {
				t.Errorf("log entry %q %v carries %q", e.Message, e.ContextMap(), secret)
			}
		}
	}
	problems := 0
	for _, a := range answers {
		if a == "" {
			continue
		}
		problems++
		if strings.Contains(a, key) || strings.Contains(a, "tok-owner") {
			t.Errorf("answer %s carries the key or the owner", a)
		}
	}
	if problems < 4 {
		t.Errorf("only %d problem answers were checked", problems)
	}
}
