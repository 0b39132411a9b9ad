//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// scopedSite is a site whose gateway has a primary and a fallback provider,
// both probed.
func scopedSite(port int, primary, fallback string) string {
	return fmt.Sprintf(`http://127.0.0.1:%d {
	idempotency {
		ledger memory
		attempt_timeout 5s
		probe GET /probe {
			every 1h
		}
		provider primary {
			reverse_proxy %s
		}
		provider fallback {
			reverse_proxy %s
		}
	}
}
`, port, primary, fallback)
}

// startTwoSites runs one caddy with two sites (two servers: one port each).
// The gateway's url is site A's; site B's is returned.
func startTwoSites(t *testing.T, siteA, siteB func(port int) string) (g *gateway, urlB string, portA, portB int) {
	t.Helper()
	g = &gateway{t: t, home: t.TempDir()}
	portA, portB = freePort(t), freePort(t)
	g.admin = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	caddyfile := fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n}\n\n%s\n%s", g.admin, siteA(portA), siteB(portB))
	g.config = filepath.Join(g.home, "Caddyfile")
	if err := os.WriteFile(g.config, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()
	t.Cleanup(g.stop)
	g.url = fmt.Sprintf("http://127.0.0.1:%d", portA)
	return g, fmt.Sprintf("http://127.0.0.1:%d", portB), portA, portB
}

// serverNames maps each listen port of the running config to its server's
// name, as the admin API shows the config.
func serverNames(t *testing.T, g *gateway) map[int]string {
	t.Helper()
	_, body := g.adminCall(t, http.MethodGet, "/config/apps/http/servers", "")
	var servers map[string]struct {
		Listen []string `json:"listen"`
	}
	if err := json.Unmarshal([]byte(body), &servers); err != nil {
		t.Fatalf("servers: %v: %s", err, body)
	}
	out := map[int]string{}
	for name, s := range servers {
		for _, l := range s.Listen {
			var port int
			if i := strings.LastIndexByte(l, ':'); i >= 0 {
				fmt.Sscan(l[i+1:], &port)
			}
			out[port] = name
		}
	}
	return out
}

// TestProvidersScopedPerSite: two sites both have a provider named
// fallback; site A's fails its probe, site B's passes. Each site fails
// over by its own fallback's probe, and the admin API and the metrics list
// the two fallbacks apart, under each site's scope (its server's name).
func TestProvidersScopedPerSite(t *testing.T) {
	busyPrimary := func(name string) func(w http.ResponseWriter, r *http.Request, n int) {
		return func(w http.ResponseWriter, r *http.Request, n int) {
			if r.URL.Path == "/probe" {
				io.WriteString(w, `{"ok":true}`)
				return
			}
			http.Error(w, name+" overloaded", http.StatusServiceUnavailable)
		}
	}
	primaryA, primaryB := newUpstream(t, busyPrimary("a")), newUpstream(t, busyPrimary("b"))
	fallbackA := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/probe" {
			http.Error(w, "probe refused", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, `{"from":"fallback a"}`)
	})
	fallbackB := newUpstream(t, answering(`{"from":"fallback b"}`))
	g, urlB, portA, portB := startTwoSites(t,
		func(port int) string { return scopedSite(port, primaryA.addr(), fallbackA.addr()) },
		func(port int) string { return scopedSite(port, primaryB.addr(), fallbackB.addr()) })

	names := serverNames(t, g)
	scopeA, scopeB := names[portA], names[portB]
	if scopeA == "" || scopeB == "" || scopeA == scopeB {
		t.Fatalf("server names by port: %v", names)
	}

	type providerJSON struct {
		Scope string `json:"scope"`
		Name  string `json:"name"`
		Probe *struct {
			OK     bool `json:"ok"`
			Status int  `json:"status"`
		} `json:"probe"`
	}
	var list struct {
		Providers []providerJSON `json:"providers"`
	}
	eventually(t, "all four probes ran", func() bool {
		_, body := g.adminCall(t, http.MethodGet, "/idempotency/providers", "")
		list.Providers = nil
		if err := json.Unmarshal([]byte(body), &list); err != nil {
			t.Fatalf("providers: %v: %s", err, body)
		}
		for _, p := range list.Providers {
			if p.Probe == nil {
				return false
			}
		}
		return len(list.Providers) == 4
	})
	probes := map[string]string{}
	for _, p := range list.Providers {
		probes[p.Scope+"/"+p.Name] = fmt.Sprintf("%v %d", p.Probe.OK, p.Probe.Status)
	}
	want := map[string]string{
		scopeA + "/primary": "true 200", scopeA + "/fallback": "false 500",
		scopeB + "/primary": "true 200", scopeB + "/fallback": "true 200",
	}
	if fmt.Sprint(probes) != fmt.Sprint(want) {
		t.Fatalf("providers %v, want %v", probes, want)
	}

	// Site A: no failover to a fallback whose own probe failed.
	a := g.post(t, "/charges", "scoped-a", auth, `{}`)
	if a.status != http.StatusServiceUnavailable || a.body != "a overloaded\n" {
		t.Errorf("site A: %v, want the primary's 503", a)
	}
	if n := fallbackA.count("scoped-a"); n != 0 {
		t.Errorf("site A's fallback got %d attempts", n)
	}
	// Site B: its fallback passed its probe, whatever A's did.
	gb := &gateway{t: t, url: urlB, admin: g.admin}
	b := gb.post(t, "/charges", "scoped-b", auth, `{}`)
	if b.status != http.StatusOK || b.body != `{"from":"fallback b"}` {
		t.Errorf("site B: %v, want its fallback's answer", b)
	}
	if primaryB.count("scoped-b") != 1 || fallbackB.count("scoped-b") != 1 {
		t.Errorf("site B: primary %d, fallback %d attempts", primaryB.count("scoped-b"), fallbackB.count("scoped-b"))
	}

	_, metrics := g.adminCall(t, http.MethodGet, "/metrics", "")
	for _, line := range []string{
		fmt.Sprintf(`caddy_idempotency_probe_ok{provider="fallback",scope=%q} 0`, scopeA),
		fmt.Sprintf(`caddy_idempotency_probe_ok{provider="fallback",scope=%q} 1`, scopeB),
		fmt.Sprintf(`caddy_idempotency_attempts_total{provider="primary",result="failed",scope=%q} 1`, scopeA),
		fmt.Sprintf(`caddy_idempotency_attempts_total{provider="primary",result="failed",scope=%q} 1`, scopeB),
		fmt.Sprintf(`caddy_idempotency_attempts_total{provider="fallback",result="succeeded",scope=%q} 1`, scopeB),
	} {
		if !strings.Contains(metrics, line) {
			t.Errorf("metrics lack %s", line)
		}
	}
	if strings.Contains(metrics, fmt.Sprintf(`caddy_idempotency_attempts_total{provider="fallback",result="succeeded",scope=%q}`, scopeA)) {
		t.Error("site A counts a fallback attempt")
	}
}

// TestResendOptionsRefused: `caddy validate` refuses a provider whose
// reverse_proxy would re-send on its own, in a Caddyfile (with its line)
// and in JSON.
func TestResendOptionsRefused(t *testing.T) {
	dir := t.TempDir()
	validate := func(file, adapter string) (string, error) {
		args := []string{"validate", "--config", file}
		if adapter != "" {
			args = append(args, "--adapter", adapter)
		}
		cmd := exec.Command(binary, args...)
		cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir+"/data", "XDG_CONFIG_HOME="+dir+"/config")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name, option, want string
		line               int // the option's
	}{
		{"request_buffers", "request_buffers 4KiB", "reverse_proxy request_buffers is not allowed inside a provider", 9},
		{"lb_retry_match", "lb_retries 2\n\t\t\t\tlb_retry_match {\n\t\t\t\t\tmethod POST\n\t\t\t\t}", "reverse_proxy retry_match (lb_retry_match in a Caddyfile) is not allowed inside a provider", 10},
	} {
		t.Run("Caddyfile "+tc.name, func(t *testing.T) {
			cf := write("Caddyfile-"+tc.name, "{\n\tadmin off\n}\n:8080 {\n\tidempotency {\n\t\tledger memory\n\t\tprovider a {\n\t\t\treverse_proxy 127.0.0.1:1 {\n\t\t\t\t"+tc.option+"\n\t\t\t}\n\t\t}\n\t}\n}\n")
			out, err := validate(cf, "caddyfile")
			if err == nil || !strings.Contains(out, tc.want) || !strings.Contains(out, fmt.Sprintf("Caddyfile-%s:%d", tc.name, tc.line)) {
				t.Errorf("validate: %v\n%s", err, out)
			}
		})
	}
	for _, tc := range []struct{ name, opts, want string }{
		{"request_buffers", `"request_buffers":4096`, "reverse_proxy request_buffers is not allowed inside a provider"},
		{"retry_match", `"load_balancing":{"retries":2,"retry_match":[{"method":["POST"]}]}`, "reverse_proxy retry_match (lb_retry_match in a Caddyfile) is not allowed inside a provider"},
	} {
		t.Run("JSON "+tc.name, func(t *testing.T) {
			cfg := write(tc.name+".json", `{"admin":{"disabled":true},"apps":{"http":{"servers":{"srv0":{"listen":[":8080"],
				"routes":[{"handle":[{"handler":"idempotency","ledger":{"backend":"memory"},"providers":[
					{"name":"a","routes":[{"handle":[{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:1"}],`+tc.opts+`}]}]}]}]}]}}}}}`)
			out, err := validate(cfg, "")
			if err == nil || !strings.Contains(out, "provider a: "+tc.want) {
				t.Errorf("validate: %v\n%s", err, out)
			}
		})
	}
	// The same provider without those options is valid.
	ok := write("ok.json", `{"admin":{"disabled":true},"apps":{"http":{"servers":{"srv0":{"listen":[":8080"],
		"routes":[{"handle":[{"handler":"idempotency","ledger":{"backend":"memory"},"providers":[
			{"name":"a","routes":[{"handle":[{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:1"}],"load_balancing":{"retries":2}}]}]}]}]}]}}}}}`)
	if out, err := validate(ok, ""); err != nil {
		t.Errorf("a plain provider: %v\n%s", err, out)
	}
}
