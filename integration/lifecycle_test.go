//go:build integration

package integration

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPlaceholders(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		var mu sync.Mutex
		var seen []string
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			mu.Lock()
			seen = append(seen, r.Header.Get("X-Job")+" "+r.Header.Get("X-Attempt"))
			mu.Unlock()
			io.WriteString(w, "ok")
		})
		g := startGateway(t, b, fmt.Sprintf(`	idempotency {
		{ledger}
	}
	reverse_proxy %s {
		header_up X-Job {http.idempotency.job_id}
		header_up X-Attempt {http.idempotency.attempt}
	}
`, up.addr()))
		r := g.post(t, "/x", "ph-1", auth, "{}")
		mu.Lock()
		defer mu.Unlock()
		want := r.header.Get("Idempotency-Job-Id") + " 1"
		if len(seen) != 1 || seen[0] != want {
			t.Errorf("upstream saw placeholders %q, want %q", seen, want)
		}
	})
}

// TestReloadKeepsRunningAttempt reloads the config, onto another ledger,
// while an attempt runs: the attempt holds its own reference to the old
// ledger, so its result is still recorded there.
func TestReloadKeepsRunningAttempt(t *testing.T) {
	old, next := pgBackend(t), pgBackend(t)
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		<-release
		io.WriteString(w, `{"through":"reload"}`)
	})
	g := startGateway(t, old, site(up.addr(), "attempt_timeout 20s"))
	done := make(chan response, 1)
	go func() { done <- g.post(t, "/charges", "reload-1", auth, `{}`) }()
	eventually(t, "the attempt reaches the upstream", func() bool { return up.count("reload-1") == 1 })

	g.reload(t, old.line, next.line)
	close(release)
	r := <-done
	if r.status != http.StatusOK || r.body != `{"through":"reload"}` {
		t.Fatalf("answer across the reload: %v", r)
	}
	if st, atts := jobState(t, old, r.header.Get("Idempotency-Job-Id")); st != "completed" || atts[0] != "succeeded" {
		t.Errorf("old ledger after reload: job %s attempts %v; the attempt lost its ledger", st, atts)
	}
}

func readConfig(g *gateway) (string, error) {
	b, err := os.ReadFile(g.config)
	return string(b), err
}

// TestFailClosed cuts the gateway off from PostgreSQL: ledgered requests
// get 503 and are not forwarded; others still pass.
func TestFailClosed(t *testing.T) {
	b := pgBackend(t)
	u, err := url.Parse(postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	cut := newCutter(t, u.Host)
	u.Host = cut.addr()
	b.line = "ledger postgres " + u.String() + " " + b.schema
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) { io.WriteString(w, "ok") })
	g := startGateway(t, b, site(up.addr()))
	if r := g.post(t, "/x", "fc-1", auth, "{}"); r.status != http.StatusOK {
		t.Fatalf("before the cut: %v", r)
	}
	cut.cut()
	r := g.post(t, "/x", "fc-2", auth, "{}")
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "ledger-unavailable") {
		t.Errorf("ledger cut off: %v", r)
	}
	if c := up.count("fc-2"); c != 0 {
		t.Errorf("a request the ledger could not record was forwarded %d times", c)
	}
	if r := g.post(t, "/x", "", auth, "{}"); r.status != http.StatusOK {
		t.Errorf("a request without a key: %v", r)
	}
}

// cutter forwards TCP to target until cut, then refuses and drops every
// connection.
type cutter struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	down   bool
}

func newCutter(t *testing.T, target string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, target: target}
	t.Cleanup(func() { ln.Close(); c.cut() })
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			c.mu.Lock()
			if c.down {
				c.mu.Unlock()
				in.Close()
				continue
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				c.mu.Unlock()
				in.Close()
				continue
			}
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { io.Copy(out, in); out.Close() }()
			go func() { io.Copy(in, out); in.Close() }()
		}
	}()
	return c
}

func (c *cutter) addr() string { return c.ln.Addr().String() }

func (c *cutter) cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = true
	for _, conn := range c.conns {
		conn.Close()
	}
	c.conns = nil
}
