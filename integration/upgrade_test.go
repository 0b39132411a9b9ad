//go:build integration

package integration

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// previousRelease is the commit of the release before the ledger's
// functions were versioned: its gateways call the functions of migrations
// 0001 and 0002 in the ledger's schema.
const previousRelease = "1e32b04"

// buildPrevious builds the previous release's caddy from git history, with
// the same module and build caches.
func buildPrevious(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src, tarball := filepath.Join(dir, "src"), filepath.Join(dir, "src.tar")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "caddy-old")
	for _, c := range []*exec.Cmd{
		exec.Command("git", "archive", "--format=tar", "-o", tarball, previousRelease),
		exec.Command("tar", "-x", "-f", tarball, "-C", src),
		exec.Command("go", "build", "-o", bin, "./cmd/caddy"),
	} {
		c.Dir = ".."
		if c.Args[0] == "go" {
			c.Dir = src
		}
		if out, err := c.CombinedOutput(); err != nil {
			t.Fatalf("building the previous release (%s): %v: %v\n%s", previousRelease, c.Args, err, out)
		}
	}
	return bin
}

// startPrevious runs the previous release's binary as a gateway.
func startPrevious(t *testing.T, bin string, b backend, site string) *gateway {
	t.Helper()
	current := binary
	binary = bin
	defer func() { binary = current }()
	return startGateway(t, b, site)
}

// TestRollingUpgrade: a gateway of this release and one of the previous
// release share one PostgreSQL ledger, as during a rolling upgrade. The new
// one starts first and adds its functions; the old one still starts (the
// tables' version did not move) and calls its own. Each replays the other's
// jobs, refuses another request under the other's key, and a duplicate
// waiting on the old one is woken by the new one's completion.
func TestRollingUpgrade(t *testing.T) {
	old := buildPrevious(t)
	b := pgBackend(t)
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		key := r.Header.Get("Idempotency-Key")
		if key == "held" {
			<-release
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"key":%q,"n":%d}`, key, n)
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	s := fmt.Sprintf("\tidempotency {\n\t\t{ledger}\n\t\tattempt_timeout 30s\n\t\tattempt_deadline 60s\n\t\tin_flight wait 5s\n\t}\n\treverse_proxy %s\n", up.addr())
	gNew := startGateway(t, b, s)
	gOld := startPrevious(t, old, b, s)

	// Fresh requests through each.
	viaNew := gNew.post(t, "/charges", "via-new", auth, `{"amount":1}`)
	viaOld := gOld.post(t, "/charges", "via-old", auth, `{"amount":2}`)
	for _, r := range []response{viaNew, viaOld} {
		if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") == "true" || r.header.Get("Idempotency-Job-Id") == "" {
			t.Fatalf("fresh request: %v", r)
		}
	}

	// Each replays the other's job.
	for _, c := range []struct {
		name  string
		g     *gateway
		key   string
		body  string
		first response
	}{
		{"the old gateway replays the new one's job", gOld, "via-new", `{"amount":1}`, viaNew},
		{"the new gateway replays the old one's job", gNew, "via-old", `{"amount":2}`, viaOld},
	} {
		r := c.g.post(t, "/charges", c.key, auth, c.body)
		if r.status != c.first.status || r.body != c.first.body || r.header.Get("Idempotent-Replayed") != "true" ||
			r.header.Get("Idempotency-Job-Id") != c.first.header.Get("Idempotency-Job-Id") {
			t.Errorf("%s: %v, first %v", c.name, r, c.first)
		}
		// Another request under the other's key is refused.
		if m := c.g.post(t, "/charges", c.key, auth, `{"amount":99}`); m.status != http.StatusUnprocessableEntity {
			t.Errorf("%s: another request under the key: %v, want 422", c.name, m)
		}
		if n := up.count(c.key); n != 1 {
			t.Errorf("%s: the provider saw %s %d times", c.name, c.key, n)
		}
	}
	// A gateway of this release that fingerprints selected members still
	// fingerprints the old release's job by its whole body, as it was
	// made: a retry replays, a changed member is another request.
	sel := strings.Replace(s, "\t\tin_flight wait 5s\n", "\t\tin_flight wait 5s\n\t\tfingerprint json {\n\t\t\texclude /ts\n\t\t}\n", 1)
	gSel := startGateway(t, b, sel)
	if r := gSel.post(t, "/charges", "via-old", auth, `{ "amount": 2 }`); r.body != viaOld.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the old release's job through a gateway with a selection: %v", r)
	}
	if r := gSel.post(t, "/charges", "via-old", auth, `{"amount":2,"ts":1}`); r.status != http.StatusUnprocessableEntity {
		t.Errorf("the old release's job took a member its fingerprint counted: %v, want 422", r)
	}
	gSel.stop()
	for _, r := range []response{viaNew, viaOld} {
		if st, atts := jobState(t, b, r.header.Get("Idempotency-Job-Id")); st != "completed" || len(atts) != 1 || atts[0] != "succeeded" {
			t.Errorf("ledger: job %s attempts %v", st, atts)
		}
	}

	// A duplicate waiting on the old gateway gets the new one's answer:
	// the new functions notify the channel the old gateway listens on. The
	// lease (60s) outlasts the wait (5s): only the notification wakes it.
	first := make(chan response, 1)
	go func() { first <- gNew.post(t, "/charges", "held", auth, `{"amount":3}`) }()
	eventually(t, "the new gateway's attempt reaches the provider", func() bool { return up.count("held") == 1 })
	const reserves = `caddy_idempotency_ledger_seconds_count{operation="reserve"}`
	before := gOld.metricValue(t, reserves)
	waiter := make(chan response, 1)
	go func() { waiter <- gOld.post(t, "/charges", "held", auth, `{"amount":3}`) }()
	eventually(t, "the old gateway's duplicate is waiting", func() bool { return gOld.metricValue(t, reserves) > before })
	close(release)
	a, w := <-first, <-waiter
	if a.status != http.StatusCreated || w.status != a.status || w.body != a.body ||
		w.header.Get("Idempotent-Replayed") != "true" || w.header.Get("Idempotency-Job-Id") != a.header.Get("Idempotency-Job-Id") {
		t.Errorf("new: %v\nold waiter: %v", a, w)
	}
	if n := up.count("held"); n != 1 {
		t.Errorf("the provider saw the held request %d times", n)
	}
}
