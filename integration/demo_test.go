//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// startDemo runs Caddyfile.example through the built binary, as the
// README's first command does, on ports the OS picked (every other byte
// of it as written; its relative file names made absolute, as the test
// does not run from the repository's root).
func startDemo(t *testing.T) (g *gateway, ports map[string]int) {
	t.Helper()
	raw, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	examples, err := filepath.Abs("../examples")
	if err != nil {
		t.Fatal(err)
	}
	ports = map[string]int{}
	pairs := []string{" examples/", " " + examples + "/"}
	for _, p := range []string{":8080", ":9090", ":9091", ":9092", ":9093", ":9094", ":9095", ":2019"} {
		if !strings.Contains(string(raw), p) {
			t.Fatalf("Caddyfile.example no longer uses port %s: update this test", p)
		}
		ports[p] = freePort(t)
		pairs = append(pairs, p, fmt.Sprintf(":%d", ports[p]))
	}
	pairs = append([]string{"localhost:2019", fmt.Sprintf("127.0.0.1:%d", ports[":2019"])}, pairs...)
	g = &gateway{t: t, home: t.TempDir()}
	g.url = fmt.Sprintf("http://127.0.0.1:%d", ports[":8080"])
	g.admin = fmt.Sprintf("127.0.0.1:%d", ports[":2019"])
	g.config = filepath.Join(g.home, "Caddyfile")
	if err := os.WriteFile(g.config, []byte(strings.NewReplacer(pairs...).Replace(string(raw))), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	t.Cleanup(g.stop)
	return g, ports
}

// chat sends a chat completion request without a key, as an SDK does.
func (g *gateway) chat(t *testing.T, prompt string, stream bool) response {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": "demo", "stream": stream,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	return g.request(t, context.Background(), http.MethodPost, "/v1/chat/completions", "", "", string(body), nil)
}

// TestModelDemo: the model route of Caddyfile.example, as the README's
// tour uses it: a completion and its replay, the second model refused by
// its probe (an invented key), a streamed completion and its replay, and
// the charges route beside it.
func TestModelDemo(t *testing.T) {
	g, _ := startDemo(t)

	var providers string
	eventually(t, "the second model's probe to fail on its output", func() bool {
		_, providers = g.adminCall(t, http.MethodGet, "/idempotency/providers", "")
		return strings.Contains(providers, `"name":"large","probe":{"ok":true`) &&
			strings.Contains(providers, `"name":"small","probe":{"ok":false,"error":"contract: json_schema: in /choices/0/message/content, at (root): additional properties 'source' not allowed"`)
	})

	first := g.chat(t, "What is the capital of France?", false)
	var c struct {
		ID      string
		Model   string
		Choices []struct{ Message struct{ Content string } }
	}
	if first.status != http.StatusOK || json.Unmarshal([]byte(first.body), &c) != nil || len(c.Choices) != 1 ||
		c.Choices[0].Message.Content != `{"answer":"Paris","confidence":0.98}` || c.Model != "large" {
		t.Fatalf("completion: %v", first)
	}
	again := g.chat(t, "What is the capital of France?", false)
	if again.body != first.body || again.header.Get("Idempotent-Replayed") != "true" ||
		again.header.Get("Idempotency-Job-Id") != first.header.Get("Idempotency-Job-Id") {
		t.Errorf("the same prompt again is not a replay: %v", again)
	}

	// The large model is overloaded for this prompt; the small one, whose
	// probe failed, is not tried: the client gets the 503.
	busy := g.chat(t, "You are overloaded, are you not?", false)
	if busy.status != http.StatusServiceUnavailable || !strings.Contains(busy.body, "large is overloaded") {
		t.Errorf("overloaded: %v", busy)
	}
	j := g.job(t, busy.header.Get("Idempotency-Job-Id"))
	if j.State != "failed" || len(j.Attempts) != 1 {
		t.Errorf("overloaded job: %s with %d attempts", j.State, len(j.Attempts))
	}

	s := g.chat(t, "Stream, please", true)
	if s.status != http.StatusOK || s.header.Get("Content-Type") != "text/event-stream" ||
		!strings.HasPrefix(s.body, "data: {") || !strings.HasSuffix(s.body, "data: [DONE]\n\n") {
		t.Fatalf("stream: %v", s)
	}
	if r := g.chat(t, "Stream, please", true); r.body != s.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("stream replay: %v", r)
	}

	// The charges API beside it still takes keys.
	ch := g.post(t, "/charges", "order-1", "", `{"amount":42}`)
	if ch.status != http.StatusCreated || !strings.Contains(ch.body, `"provider":"primary"`) {
		t.Errorf("charges: %v", ch)
	}
	if r := g.post(t, "/charges", "order-1", "", `{"amount":42}`); r.body != ch.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("charge replay: %v", r)
	}
}

// demoCharge is a charge as the demo payments API answers it.
type demoCharge struct {
	ID             string `json:"id"`
	Path           string `json:"path"`
	IdempotencyKey string `json:"idempotency_key"`
	JobID          string `json:"job_id"`
	Attempt        int    `json:"attempt"`
}

// TestReconcileDemo: the payments routes of Caddyfile.example, as the
// README's tour uses them. The deduplicating provider loses its first
// answer after charging, and the gateway's re-send within the request
// gets the charge: one 201, one charge. The slow provider answers after
// the attempt timed out (504, unknown), and after the attempt's deadline
// the lookup finds the charge and completes the job by itself.
func TestReconcileDemo(t *testing.T) {
	g, ports := startDemo(t)

	r := g.post(t, "/payments/order-4", "order-4", "", `{"amount":42}`)
	job := r.header.Get("Idempotency-Job-Id")
	var c demoCharge
	if r.status != http.StatusCreated || json.Unmarshal([]byte(r.body), &c) != nil ||
		c.ID != "ch_1" || c.IdempotencyKey != job || c.JobID != job || c.Attempt != 1 {
		t.Fatalf("payment: %v", r)
	}
	j := g.job(t, job)
	if j.State != "completed" || len(j.Attempts) != 2 || j.Attempts[0].State != "unknown" ||
		j.Attempts[1].State != "succeeded" || !j.Attempts[1].Resend ||
		j.Attempts[1].Reconciled == nil || *j.Attempts[1].Reconciled != "resend" {
		t.Errorf("payment job: %+v", j)
	}
	if again := g.post(t, "/payments/order-4", "order-4", "", `{"amount":42}`); again.body != r.body ||
		again.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("payment replay: %v", again)
	}
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/charges", ports[":9094"]))
	if err != nil {
		t.Fatal(err)
	}
	var made struct{ Charges []demoCharge }
	err = json.NewDecoder(resp.Body).Decode(&made)
	resp.Body.Close()
	if err != nil || len(made.Charges) != 1 || made.Charges[0] != c {
		t.Errorf("the provider's charges: %+v (%v), want only %+v", made.Charges, err, c)
	}

	start := time.Now()
	slow := g.post(t, "/slow-payments/order-5", "order-5", "", `{"amount":7}`)
	job = slow.header.Get("Idempotency-Job-Id")
	if slow.status != http.StatusGatewayTimeout || job == "" || time.Since(start) > 4*time.Second {
		t.Fatalf("slow payment after %v: %v", time.Since(start), slow)
	}
	if busy := g.post(t, "/slow-payments/order-5", "order-5", "", `{"amount":7}`); busy.status != http.StatusConflict {
		t.Errorf("a retry before the lookup: %v, want 409", busy)
	}
	eventually(t, "the lookup completes the slow payment", func() bool { return g.job(t, job).State == "completed" })
	j = g.job(t, job)
	if a := j.Attempts[0]; len(j.Attempts) != 1 || a.State != "succeeded" || a.Reconciled == nil || *a.Reconciled != "lookup" {
		t.Errorf("slow payment job: %+v", j)
	}
	retry := g.post(t, "/slow-payments/order-5", "order-5", "", `{"amount":7}`)
	if retry.status != http.StatusOK || json.Unmarshal([]byte(retry.body), &c) != nil ||
		c.ID != "ch_1" || c.IdempotencyKey != "order-5" || c.JobID != job || c.Attempt != 1 ||
		retry.header.Get("Idempotency-Reconciled") != "lookup" || retry.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry after the lookup: %v", retry)
	}
	t.Logf("settled by lookup %v after the payment", time.Since(start).Round(time.Second/10))
}
