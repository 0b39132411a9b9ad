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
	for _, p := range []string{":8080", ":9090", ":9091", ":9092", ":9093", ":2019"} {
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
