//go:build integration

package integration

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
)

// generationHost is the site beside each gateway's, on its port, that
// answers generationPrefix and the configuration's generation, which reload
// counts up: a request there says which configuration's server took it.
const (
	generationHost   = "generation.onejob.test"
	generationPrefix = "generation "
)

// reload replaces from with to in the gateway's Caddyfile and loads it
// through the admin API, as an operator changes the configuration of a
// running gateway, then waits until the new configuration answers.
//
// The old configuration's server shuts down once /load has started the
// new one; until then it may still take a connection, serve a request with
// the old configuration, or close a connection a request was just sent on
// (EOF, on a fresh connection that no client re-sends on). A client of a
// reloading Caddy sees that too; the tests count requests from the new
// configuration on.
func (g *gateway) reload(t *testing.T, from, to string) {
	t.Helper()
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	config := string(b)
	if !strings.Contains(config, from) {
		t.Fatalf("the config has no %q", from)
	}
	var gen int
	if _, err := fmt.Sscanf(config[strings.Index(config, `respond "`+generationPrefix)+len(`respond "`):], generationPrefix+"%d", &gen); err != nil {
		t.Fatalf("the config has no generation site: %v", err)
	}
	next := strings.Replace(config, from, to, 1)
	next = strings.Replace(next, fmt.Sprintf(`"%s%d"`, generationPrefix, gen), fmt.Sprintf(`"%s%d"`, generationPrefix, gen+1), 1)
	req, _ := http.NewRequest(http.MethodPost, "http://"+g.admin+"/load", strings.NewReader(next))
	req.Header.Set("Content-Type", "text/caddyfile")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("reload: %d %s", resp.StatusCode, body)
	}
	if err := os.WriteFile(g.config, []byte(next), 0o600); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%s%d", generationPrefix, gen+1)
	eventually(t, "the reloaded configuration answers", func() bool { return g.generation() == want })
}

// generation asks the gateway's generation site which configuration
// answers; "" when the request failed (a connection the old server
// closed).
func (g *gateway) generation() string {
	req, _ := http.NewRequest(http.MethodGet, g.url+"/", nil)
	req.Host = generationHost
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return ""
	}
	return string(b)
}

// TestFingerprintSelection: with `fingerprint json { exclude ... }` a
// retry whose client rebuilt its timestamp replays; after the operator
// switches to `include`, the job keeps its own selection, new keys take
// the new one.
func TestFingerprintSelection(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
		})
		exclude := "fingerprint json {\n\t\t\texclude /ts /meta/trace_id\n\t\t}"
		g := startGateway(t, b, fmt.Sprintf("\tidempotency {\n\t\t{ledger}\n\t\t%s\n\t}\n\treverse_proxy %s\n", exclude, up.addr()))

		first := g.post(t, "/charges", "sel-1", auth, `{"amount":1,"ts":100,"meta":{"trace_id":"a","v":1}}`)
		if first.status != http.StatusCreated {
			t.Fatalf("first: %v", first)
		}
		replays := func(body, why string) {
			t.Helper()
			r := g.post(t, "/charges", "sel-1", auth, body)
			if r.status != first.status || r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%s: %v, want the first answer replayed", why, r)
			}
		}
		mismatch := func(key, body, why string) {
			t.Helper()
			if r := g.post(t, "/charges", key, auth, body); r.status != http.StatusUnprocessableEntity {
				t.Errorf("%s: %v, want 422", why, r)
			}
		}
		replays(`{"amount":1,"ts":101,"meta":{"trace_id":"b","v":1}}`, "rebuilt timestamp and trace id")
		replays(`{"meta":{"v":1},"amount":1}`, "excluded members absent")
		mismatch("sel-1", `{"amount":2,"ts":100,"meta":{"trace_id":"a","v":1}}`, "another amount")

		g.reload(t, exclude, "fingerprint json {\n\t\t\tinclude /amount\n\t\t}")
		replays(`{"amount":1,"ts":102,"meta":{"trace_id":"c","v":1}}`, "after the change, rebuilt timestamp")
		mismatch("sel-1", `{"amount":1,"ts":100,"meta":{"trace_id":"a","v":2}}`, "after the change, a member the job's selection counts")
		g.post(t, "/charges", "sel-2", auth, `{"amount":5,"ts":1}`)
		if r := g.post(t, "/charges", "sel-2", auth, `{"amount":5,"note":"anything"}`); r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("new key under the new selection: %v", r)
		}
		for _, key := range []string{"sel-1", "sel-2"} {
			if n := up.count(key); n != 1 {
				t.Errorf("the provider saw %s %d times", key, n)
			}
		}
	})
}
