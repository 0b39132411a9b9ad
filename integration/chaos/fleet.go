package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/onejob/onejob/integration/ports"
)

// gatewayConfig is what every instance of the fleet shares.
type gatewayConfig struct {
	Binary          string
	Ledger          string // the ledger subdirective
	Cache           string // the cache subdirective, if any
	OwnerSecret     string
	AttemptTimeout  time.Duration
	AttemptDeadline time.Duration
	InFlightWait    time.Duration
	HedgeAfter      time.Duration     // 0: no hedging
	Providers       []string          // in order: the first is the primary
	Upstreams       map[string]string // provider → host:port
	Dedup           string            // the deduplicating provider's host:port; "": no such route
}

// ledgerLines are the ledger subdirective and the cache's, if any.
func (c gatewayConfig) ledgerLines() string {
	if c.Cache == "" {
		return c.Ledger
	}
	return c.Ledger + "\n\t\t\t" + c.Cache
}

// caddyfile is an instance's whole configuration.
func (c gatewayConfig) caddyfile(port, admin int) string {
	ledger := c.ledgerLines()
	providers := ""
	if c.HedgeAfter > 0 {
		providers = fmt.Sprintf("\t\t\thedge_after %s\n", c.HedgeAfter)
	}
	for _, p := range c.Providers {
		providers += fmt.Sprintf("\t\t\tprovider %s {\n\t\t\t\treverse_proxy %s\n\t\t\t}\n", p, c.Upstreams[p])
	}
	return fmt.Sprintf(`{
	admin 127.0.0.1:%d
	auto_https off
	persist_config off
}

http://127.0.0.1:%d {
	bind 127.0.0.1
%s	handle {
		idempotency {
			%s
			owner {http.request.header.Authorization}
			owner_secret %s
			attempt_timeout %s
			attempt_deadline %s
			in_flight wait %s
%s		}
	}
}
`, admin, port, dedupRoute(c), ledger, c.OwnerSecret, c.AttemptTimeout, c.AttemptDeadline, c.InFlightWait, providers)
}

// gateway is one instance of the fleet: a caddy process that can be
// killed and started again on the same ports.
type gateway struct {
	n      int
	url    string // the site
	admin  string // host:port of the admin endpoint
	dir    string
	binary string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	starts int
}

// newGateway writes an instance's config in dir/gw<n>: its site on port,
// its admin endpoint on admin.
func newGateway(n int, dir string, cfg gatewayConfig, port, admin int) (*gateway, error) {
	g := &gateway{
		n: n, binary: cfg.Binary,
		url:   fmt.Sprintf("http://127.0.0.1:%d", port),
		admin: fmt.Sprintf("127.0.0.1:%d", admin),
		dir:   filepath.Join(dir, fmt.Sprintf("gw%d", n)),
	}
	if err := os.MkdirAll(g.dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(g.dir, "Caddyfile"), []byte(cfg.caddyfile(port, admin)), 0o600); err != nil {
		return nil, err
	}
	return g, nil
}

// freePorts returns n distinct loopback ports for gateways (package ports).
func freePorts(n int) ([]int, error) {
	ps := make([]int, 0, n)
	for range n {
		p, err := ports.Free()
		if err != nil {
			return nil, err
		}
		ps = append(ps, p)
	}
	return ps, nil
}

var adminClient = &http.Client{Timeout: 10 * time.Second}

// start runs caddy and waits until its admin endpoint answers (30 s at most).
func (g *gateway) start() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	logf, err := os.OpenFile(filepath.Join(g.dir, "caddy.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child has its own descriptor
	fmt.Fprintf(logf, "---- start %d at %s\n", g.starts+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(g.binary, "run", "--config", filepath.Join(g.dir, "Caddyfile"), "--adapter", "caddyfile")
	cmd.Env = append(os.Environ(), "HOME="+g.dir, "XDG_DATA_HOME="+g.dir+"/data", "XDG_CONFIG_HOME="+g.dir+"/config")
	cmd.Stdout, cmd.Stderr = logf, logf
	// No gateway outlives the driver, however the driver ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	g.cmd, g.exited = cmd, exited
	g.starts++

	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := adminClient.Get("http://" + g.admin + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-exited:
			g.cmd = nil
			return fmt.Errorf("gateway %d exited at start (see %s)", g.n, filepath.Join(g.dir, "caddy.log"))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			g.cmd = nil
			return fmt.Errorf("gateway %d did not start in 30s (see %s)", g.n, filepath.Join(g.dir, "caddy.log"))
		}
	}
}

// kill ends the instance with SIGKILL: no cleanup, attempts die mid-way.
func (g *gateway) kill() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return
	}
	g.cmd.Process.Signal(syscall.SIGKILL)
	<-g.exited
	g.cmd = nil
}

// stop ends the instance gracefully, or kills it after 10 s.
func (g *gateway) stop() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cmd == nil {
		return
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		g.cmd.Process.Kill()
		<-g.exited
	}
	g.cmd = nil
}

func (g *gateway) running() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cmd != nil
}

// fleet is the gateways of a run.
type fleet []*gateway

func (f fleet) urls() []string {
	out := make([]string, len(f))
	for i, g := range f {
		out[i] = g.url
	}
	return out
}

// anyRunning returns a running instance, for the admin API.
func (f fleet) anyRunning() *gateway {
	for _, g := range f {
		if g.running() {
			return g
		}
	}
	return nil
}

func (f fleet) stop() {
	var wg sync.WaitGroup
	for _, g := range f {
		wg.Go(g.stop)
	}
	wg.Wait()
}

// startAll starts every instance; a start that fails is tried again once
// (the ledger may be restarting).
func (f fleet) startAll(ctx context.Context) error {
	for _, g := range f {
		if err := g.start(); err != nil {
			if !sleep(ctx, 2*time.Second) {
				return err
			}
			if err := g.start(); err != nil {
				return err
			}
		}
	}
	return nil
}
