//go:build integration

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// memoryAndPostgres runs fn as a subtest on the memory and PostgreSQL
// ledgers.
func memoryAndPostgres(t *testing.T, fn func(t *testing.T, b backend)) {
	t.Run("memory", func(t *testing.T) { fn(t, backend{name: "memory", line: "ledger memory"}) })
	t.Run("postgres", func(t *testing.T) { fn(t, pgBackend(t)) })
}

// keyless sends a POST without a key, as an SDK that sends none; a client
// timeout (0: none) may end it before the answer, which is then an error.
func (g *gateway) keyless(path, auth, body string, timeout time.Duration) (response, error) {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, err
}

// expiryWindow reads how long after it settled a job expires, from the
// PostgreSQL tables.
func expiryWindow(t *testing.T, b backend, jobID string) time.Duration {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var us int64
	q := "SELECT (EXTRACT(EPOCH FROM expires_at - completed_at) * 1000000)::bigint FROM " + b.schema + ".jobs WHERE id = $1"
	if err := conn.QueryRow(ctx, q, jobID).Scan(&us); err != nil {
		t.Fatalf("job %s: %v", jobID, err)
	}
	return time.Duration(us) * time.Microsecond
}

// TestImplicitKey: requests without a key are keyed by owner and
// fingerprint. A client that gave up and sent again, and identical
// requests at once, make one upstream call; the job is kept for the
// window, not retention; the upstream sees the job's identity but no key.
func TestImplicitKey(t *testing.T) {
	memoryAndPostgres(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if strings.Contains(r.URL.Path, "slow") {
				time.Sleep(700 * time.Millisecond)
			}
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"completion":%d}`, n)
		})
		const window = 3 * time.Second
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s", "implicit_key 3s"))

		// The client gives up before the answer, then retries as its SDK
		// would: the retry gets the answer of the one execution.
		if _, err := g.keyless("/slow/completions", auth, `{"prompt":"hi"}`, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("the first call was not cut short by the client: %v", err)
		}
		retry, err := g.keyless("/slow/completions", auth, `{ "prompt": "hi" }`, 0)
		if err != nil || retry.status != http.StatusOK || retry.body != `{"completion":1}` {
			t.Fatalf("retry: %v %v", retry, err)
		}
		if up.total() != 1 {
			t.Fatalf("upstream called %d times, want 1", up.total())
		}
		c := up.callsFor("")[0]
		if c.jobID != retry.header.Get("Idempotency-Job-Id") || c.attempt != "1" || c.key != "" {
			t.Errorf("upstream saw key %q job %q attempt %q; want no key, job %s, attempt 1",
				c.key, c.jobID, c.attempt, retry.header.Get("Idempotency-Job-Id"))
		}

		// Identical requests at once: one job, one call.
		const n = 4
		var wg sync.WaitGroup
		resps, errs := make([]response, n), make([]error, n)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resps[i], errs[i] = g.keyless("/completions", auth, `{"prompt":"once"}`, 0)
			}()
		}
		wg.Wait()
		replayed := 0
		for i, r := range resps {
			if errs[i] != nil || r.status != http.StatusOK || r.body != resps[0].body ||
				r.header.Get("Idempotency-Job-Id") != resps[0].header.Get("Idempotency-Job-Id") {
				t.Errorf("response %d: %v %v; first %v", i, r, errs[i], resps[0])
			}
			if r.header.Get("Idempotent-Replayed") == "true" {
				replayed++
			}
		}
		if replayed != n-1 || up.total() != 2 {
			t.Errorf("%d replayed of %d, upstream called %d times (want 2 in all)", replayed, n, up.total())
		}

		// Another body, or another owner: another job.
		other, err := g.keyless("/completions", auth, `{"prompt":"other"}`, 0)
		if err != nil || other.header.Get("Idempotent-Replayed") != "" || up.total() != 3 {
			t.Errorf("another body: %v %v, %d calls", other, err, up.total())
		}
		bob, err := g.keyless("/completions", "Bearer bob", `{"prompt":"once"}`, 0)
		if err != nil || bob.header.Get("Idempotent-Replayed") != "" || bob.header.Get("Idempotency-Job-Id") == resps[0].header.Get("Idempotency-Job-Id") {
			t.Errorf("another owner: %v %v", bob, err)
		}
		// Without an owner, still 401.
		if anon, err := g.keyless("/completions", "", `{"prompt":"once"}`, 0); err != nil || anon.status != http.StatusUnauthorized {
			t.Errorf("no owner: %v %v", anon, err)
		}

		// The job expires the window after it completed, not retention
		// (24h): after it, the same request is a new job.
		jobID := retry.header.Get("Idempotency-Job-Id")
		if b.schema != "" {
			if w := expiryWindow(t, b, jobID); w != window {
				t.Errorf("the job expires %v after it completed, want %v", w, window)
			}
		}
		exp, err := http.ParseTime(retry.header.Get("Idempotency-Expires"))
		if err != nil || exp.After(time.Now().Add(window+time.Second)) {
			t.Errorf("Idempotency-Expires %q: %v, want within the window", retry.header.Get("Idempotency-Expires"), err)
		}
		calls := up.total()
		var later response
		eventually(t, "the window to end", func() bool {
			later, err = g.keyless("/slow/completions", auth, `{"prompt":"hi"}`, 0)
			return err == nil && later.header.Get("Idempotent-Replayed") == ""
		})
		if later.header.Get("Idempotency-Job-Id") == jobID || up.total() != calls+1 {
			t.Errorf("after the window: %v, %d calls (was %d)", later, up.total(), calls)
		}
	})
}
