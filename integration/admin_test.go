//go:build integration

package integration

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// adminJob is the admin API's job shape (docs/contract.md, section 10).
type adminJob struct {
	ID          string  `json:"id"`
	State       string  `json:"state"`
	Version     int64   `json:"version"`
	OwnerHash   string  `json:"owner_hash"`
	KeyHash     string  `json:"key_hash"`
	Fingerprint string  `json:"fingerprint"`
	CreatedAt   string  `json:"created_at"`
	CompletedAt *string `json:"completed_at"`
	CompletedBy *string `json:"completed_by"`
	Response    *struct {
		Status int   `json:"status"`
		Size   int64 `json:"size"`
		Stored bool  `json:"stored"`
	} `json:"response"`
	Attempts []struct {
		Number     int     `json:"number"`
		ID         string  `json:"id"`
		Provider   string  `json:"provider"`
		State      string  `json:"state"`
		StartedAt  string  `json:"started_at"`
		FinishedAt *string `json:"finished_at"`
		Error      *string `json:"error"`
		Resend     bool    `json:"resend"`
		Reconciled *string `json:"reconciled"`
		Reconcile  *struct {
			Tries      int     `json:"tries"`
			LastStatus *int    `json:"last_status"`
			LastAt     *string `json:"last_at"`
			NextAt     *string `json:"next_at"`
		} `json:"reconcile"`
	} `json:"attempts"`
}

func (g *gateway) adminCall(t *testing.T, method, path, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+g.admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (g *gateway) job(t *testing.T, id string) adminJob {
	t.Helper()
	status, body := g.adminCall(t, http.MethodGet, "/idempotency/jobs/"+id, "")
	if status != http.StatusOK {
		t.Fatalf("GET job %s: %d %s", id, status, body)
	}
	var j adminJob
	if err := json.Unmarshal([]byte(body), &j); err != nil {
		t.Fatalf("job JSON: %v: %s", err, body)
	}
	return j
}

// TestAdminCancelUnblocksUnknownJob: a real timeout leaves the job unknown;
// an operator's cancel unblocks it and the retry runs attempt 2. The
// cancelled attempt's late answer then loses.
func TestAdminCancelUnblocksUnknownJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		release := make(chan struct{})
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if n == 1 {
				<-release
			}
			io.WriteString(w, `{"attempt":"`+r.Header.Get("Idempotency-Attempt")+`"}`)
		})
		g := startGateway(t, b, site(up.addr()))
		first := g.post(t, "/charges", "cancel-1", auth, `{}`)
		jobID := first.header.Get("Idempotency-Job-Id")
		if first.status != http.StatusGatewayTimeout {
			t.Fatalf("timeout: %v", first)
		}
		j := g.job(t, jobID)
		if j.State != "unknown" || len(j.Attempts) != 1 || j.Attempts[0].State != "unknown" || j.Attempts[0].Provider != "next" {
			t.Fatalf("job before cancel: %+v", j)
		}
		if len(j.OwnerHash) != 64 || len(j.KeyHash) != 64 || strings.Contains(j.OwnerHash, "alice") {
			t.Errorf("hashes: owner %q key %q", j.OwnerHash, j.KeyHash)
		}
		status, body := g.adminCall(t, http.MethodPost, "/idempotency/jobs/"+jobID+"/resolve", `{"outcome":"cancel"}`)
		if status != http.StatusOK {
			t.Fatalf("cancel: %d %s", status, body)
		}
		j = g.job(t, jobID)
		if j.State != "failed" || j.Attempts[0].State != "cancelled" {
			t.Errorf("job after cancel: %+v", j)
		}
		retry := g.post(t, "/charges", "cancel-1", auth, `{}`)
		if retry.status != http.StatusOK || retry.body != `{"attempt":"2"}` || retry.header.Get("Idempotency-Job-Id") != jobID {
			t.Errorf("retry after cancel: %v", retry)
		}
		close(release)
		// The operator's decision stands: the late answer is discarded and
		// logged as a lost race, and the attempt stays cancelled.
		eventually(t, "the cancelled attempt's late answer is discarded", func() bool {
			return strings.Contains(g.out.String(), "result discarded")
		})
		if s := g.job(t, jobID).Attempts[0].State; s != "cancelled" {
			t.Errorf("the cancelled attempt is %s after its late answer", s)
		}
		if again := g.post(t, "/charges", "cancel-1", auth, `{}`); again.body != `{"attempt":"2"}` {
			t.Errorf("replay after the late answer: %v", again)
		}
	})
}

func TestAdminCompleteAnswersRetries(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		release := make(chan struct{})
		defer close(release)
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { <-release })
		g := startGateway(t, b, site(up.addr()))
		first := g.post(t, "/charges", "complete-1", auth, `{}`)
		jobID := first.header.Get("Idempotency-Job-Id")
		body := base64.StdEncoding.EncodeToString([]byte(`{"settled":"by hand"}`))
		req := `{"outcome":"complete","response":{"status":201,"headers":{"Content-Type":["application/json"]},"body":"` + body + `"}}`
		status, out := g.adminCall(t, http.MethodPost, "/idempotency/jobs/"+jobID+"/resolve", req)
		if status != http.StatusOK {
			t.Fatalf("complete: %d %s", status, out)
		}
		r := g.post(t, "/charges", "complete-1", auth, `{}`)
		if r.status != http.StatusCreated || r.body != `{"settled":"by hand"}` || r.header.Get("Content-Type") != "application/json" ||
			r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("retry after complete: %v", r)
		}
		j := g.job(t, jobID)
		if j.State != "completed" || len(j.Attempts) != 2 || j.Attempts[1].Provider != "admin" || j.CompletedBy == nil ||
			*j.CompletedBy != j.Attempts[1].ID || j.Response == nil || j.Response.Status != 201 || !j.Response.Stored {
			t.Errorf("job after complete: %+v", j)
		}
		status, out = g.adminCall(t, http.MethodPost, "/idempotency/jobs/"+jobID+"/resolve", req)
		if status != http.StatusConflict || !strings.Contains(out, "problem") {
			t.Errorf("second complete: %d %s", status, out)
		}
		if c := up.count("complete-1"); c != 1 {
			t.Errorf("upstream called %d times", c)
		}
		// The listing finds it, and the provider filter too.
		status, out = g.adminCall(t, http.MethodGet, "/idempotency/jobs?state=completed&provider=admin", "")
		var page struct {
			Jobs []adminJob `json:"jobs"`
			Next *string    `json:"next"`
		}
		if status != http.StatusOK || json.Unmarshal([]byte(out), &page) != nil || len(page.Jobs) != 1 || page.Jobs[0].ID != jobID {
			t.Errorf("listing: %d %s", status, out)
		}
	})
}

// TestMetrics scrapes Caddy's metrics endpoint after requests of every
// outcome.
func TestMetrics(t *testing.T) {
	b := pgBackend(t)
	release := make(chan struct{})
	defer close(release)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		switch r.URL.Path {
		case "/busy":
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		case "/slow":
			<-release
		case "/wait":
			time.Sleep(150 * time.Millisecond)
		}
		io.WriteString(w, `{"ok":true}`)
	})
	fallback := newUpstream(t, answering(`{"from":"fallback"}`))
	g := startGatewayWith(t, b, "\tmetrics\n", providers(primary.addr(), fallback.addr(), "attempt_timeout 1s", "in_flight wait 300ms"))
	g.post(t, "/x", "m-1", auth, `{}`)      // new
	g.post(t, "/x", "m-1", auth, `{}`)      // replayed
	g.post(t, "/x", "m-1", auth, `{"a":1}`) // mismatch
	g.post(t, "/busy", "m-2", auth, `{}`)   // new: primary failed, fallback succeeded
	g.post(t, "/x", "m-3", "", `{}`)        // rejected: no owner

	// waited: a duplicate that waits for the first and replays it.
	waited := make(chan response, 1)
	go func() { waited <- g.post(t, "/wait", "m-4", auth, `{}`) }() // new
	eventually(t, "the first request reaches the upstream", func() bool { return primary.count("m-4") == 1 })
	g.post(t, "/wait", "m-4", auth, `{}`)
	<-waited

	// conflict, then unknown: a duplicate whose wait ends first, then a
	// retry after the attempt timed out.
	slow := make(chan response, 1)
	go func() { slow <- g.post(t, "/slow", "m-5", auth, `{}`) }() // new
	eventually(t, "the slow request reaches the upstream", func() bool { return primary.count("m-5") == 1 })
	if r := g.post(t, "/slow", "m-5", auth, `{}`); r.status != http.StatusConflict || !strings.Contains(r.body, "in-flight") {
		t.Errorf("duplicate past its wait: %v", r)
	}
	if r := <-slow; r.status != http.StatusGatewayTimeout {
		t.Errorf("slow request: %v", r)
	}
	if r := g.post(t, "/slow", "m-5", auth, `{}`); r.status != http.StatusConflict || !strings.Contains(r.body, "outcome-unknown") {
		t.Errorf("retry of the unknown job: %v", r)
	}

	status, body := g.adminCall(t, http.MethodGet, "/metrics", "")
	if status != http.StatusOK {
		t.Fatalf("metrics: %d", status)
	}
	for _, want := range []string{
		`caddy_idempotency_requests_total{outcome="new"} 4`,
		`caddy_idempotency_requests_total{outcome="replayed"} 1`,
		`caddy_idempotency_requests_total{outcome="mismatch"} 1`,
		`caddy_idempotency_requests_total{outcome="rejected"} 1`,
		`caddy_idempotency_requests_total{outcome="waited"} 1`,
		`caddy_idempotency_requests_total{outcome="conflict"} 1`,
		`caddy_idempotency_requests_total{outcome="unknown"} 1`,
		`caddy_idempotency_attempts_total{provider="primary",result="succeeded",scope="srv0"} 2`,
		`caddy_idempotency_attempts_total{provider="primary",result="failed",scope="srv0"} 1`,
		`caddy_idempotency_attempts_total{provider="fallback",result="succeeded",scope="srv0"} 1`,
		`caddy_idempotency_in_flight 1`, // the slow attempt still runs
		`caddy_idempotency_ledger_seconds_count{operation="reserve"} 9`,
		`caddy_idempotency_ledger_seconds_count{operation="mark_unknown"} 1`,
		// The ledger's jobs by state (m-1, m-2 and m-4 completed, m-5
		// unknown), and its listener, connected since m-4's duplicate
		// waited.
		`caddy_idempotency_jobs{ledger="postgres",state="unknown"} 1`,
		`caddy_idempotency_jobs{ledger="postgres",state="completed"} 3`,
		`caddy_idempotency_jobs{ledger="postgres",state="pending"} 0`,
		`caddy_idempotency_jobs{ledger="postgres",state="failed"} 0`,
		`caddy_idempotency_ledger_listener_up{ledger="postgres"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	for _, gauge := range []struct {
		name     string
		min, max float64
	}{
		{`caddy_idempotency_oldest_unknown_seconds{ledger="postgres"}`, 0.001, 60},
		{`caddy_idempotency_ledger_sweep_lag_seconds{ledger="postgres"}`, 0, 60},
	} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(gauge.name) + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			t.Errorf("metrics lack %s", gauge.name)
			continue
		}
		if v, err := strconv.ParseFloat(m[1], 64); err != nil || v < gauge.min || v > gauge.max {
			t.Errorf("%s = %s, want from %g to %g", gauge.name, m[1], gauge.min, gauge.max)
		}
	}
	if strings.Contains(body, "m-1") || strings.Contains(body, "alice") {
		t.Error("a key or owner leaked into a metric label")
	}
}
