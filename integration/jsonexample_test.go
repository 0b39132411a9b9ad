//go:build integration

package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestJSONExample runs the complete JSON config of docs/json.md,
// docs/example.json, through the built binary: `caddy validate` accepts
// it, and a keyed request through it reaches a provider once and its
// retry is replayed. Only the example's loopback addresses are changed:
// 127.0.0.1 and ports the OS picked.
func TestJSONExample(t *testing.T) {
	raw, err := os.ReadFile("../docs/example.json")
	if err != nil {
		t.Fatal(err)
	}
	if !json.Valid(raw) {
		t.Fatal("docs/example.json is not valid JSON")
	}
	ports := map[string]int{}
	var pairs []string
	for _, p := range []string{":8080", ":9090", ":9091", ":2019"} {
		if !strings.Contains(string(raw), p) {
			t.Fatalf("docs/example.json no longer uses port %s: update this test", p)
		}
		ports[p] = freePort(t)
		pairs = append(pairs, p, fmt.Sprintf(":%d", ports[p]))
	}
	// The admin endpoint too listens on 127.0.0.1 only.
	pairs = append([]string{"localhost:2019", fmt.Sprintf("127.0.0.1:%d", ports[":2019"])}, pairs...)
	config := strings.NewReplacer(pairs...).Replace(string(raw))
	if strings.Contains(config, "localhost") {
		t.Fatal("docs/example.json listens on localhost other than the admin endpoint's: update this test")
	}

	g := &gateway{t: t, home: t.TempDir(), json: true}
	g.url = fmt.Sprintf("http://127.0.0.1:%d", ports[":8080"])
	g.admin = fmt.Sprintf("127.0.0.1:%d", ports[":2019"])
	g.config = filepath.Join(g.home, "example.json")
	if err := os.WriteFile(g.config, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}

	validate := exec.Command(binary, "validate", "--config", g.config)
	validate.Env = append(os.Environ(), "HOME="+g.home, "XDG_DATA_HOME="+g.home+"/data", "XDG_CONFIG_HOME="+g.home+"/config")
	if out, err := validate.CombinedOutput(); err != nil {
		t.Fatalf("caddy validate: %v\n%s", err, out)
	}

	g.start()
	t.Cleanup(g.stop)
	apiKey := http.Header{"X-Api-Key": {"key_live_1"}}
	first := g.request(t, context.Background(), http.MethodPost, "/v1/charges", "order-1", "", `{"amount": 42}`, apiKey)
	if first.status != http.StatusCreated || !strings.Contains(first.body, `"provider":"primary"`) {
		t.Fatalf("first request: %v", first)
	}
	jobID := first.header.Get("Idempotency-Job-Id")
	if jobID == "" || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("first request's headers: %v", first.header)
	}
	retry := g.request(t, context.Background(), http.MethodPost, "/v1/charges", "order-1", "", `{"amount":42}`, apiKey)
	if retry.status != http.StatusCreated || retry.body != first.body ||
		retry.header.Get("Idempotent-Replayed") != "true" || retry.header.Get("Idempotency-Job-Id") != jobID {
		t.Fatalf("retry: %v\nfirst: %v", retry, first)
	}
	status := g.request(t, context.Background(), http.MethodGet, "/v1/jobs/order-1", "", "", "", apiKey)
	if status.status != http.StatusOK || !strings.Contains(status.body, `"state":"completed"`) {
		t.Fatalf("status path: %v", status)
	}
}
