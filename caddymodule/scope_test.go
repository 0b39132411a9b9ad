package caddymodule

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestScopeRegistry: two handlers with providers of the same names keep
// separate entries, probe results and failover eligibility.
func TestScopeRegistry(t *testing.T) {
	names := []string{"primary", "fallback"}
	unA := registerProviders("site-a", names)
	unB := registerProviders("site-b", names)
	defer unB()
	var got []string
	for _, p := range listProviders() {
		got = append(got, p.Scope+"/"+p.Name)
	}
	if want := []string{"site-a/primary", "site-a/fallback", "site-b/primary", "site-b/fallback"}; !slices.Equal(got, want) {
		t.Fatalf("providers %v, want %v", got, want)
	}

	setProbe("site-a", "fallback", ProbeResult{OK: false, Error: "status 500", Status: 500, At: time.Now()})
	setProbe("site-b", "fallback", ProbeResult{OK: true, Status: 200, At: time.Now()})
	if r := probeOf("site-a", "fallback"); r == nil || r.OK || r.Status != 500 {
		t.Errorf("site-a's fallback probe %+v", r)
	}
	if r := probeOf("site-b", "fallback"); r == nil || !r.OK || r.Status != 200 {
		t.Errorf("site-b's fallback probe %+v", r)
	}
	eligA, eligB := probedEligible("site-a", names), probedEligible("site-b", names)
	if eligA(1) || !eligB(1) {
		t.Errorf("fallback eligible: site-a %v (want false), site-b %v (want true)", eligA(1), eligB(1))
	}
	if eligA(0) || eligB(0) {
		t.Error("a primary with no probe result is eligible")
	}

	unA()
	if eligA(1) || !eligB(1) || probeOf("site-b", "fallback") == nil {
		t.Error("site-a's cleanup changed site-b's providers")
	}
	setProbe("site-a", "fallback", ProbeResult{OK: true}) // a probe loop outliving site-a
	if eligA(1) {
		t.Error("a probe of an unregistered scope was recorded")
	}
}

// loadConfig runs cfg as Caddy's config in this process, until the test
// ends.
func loadConfig(t *testing.T, cfg string) {
	t.Helper()
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatalf("load: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Error(err)
		}
	})
}

// scopeConfig is a Caddy config of two servers: api has three idempotency
// handlers (the last one named), shop one. Each handler has a primary and
// a fallback provider, probed.
func scopeConfig(t *testing.T, upstreams map[string]string) string {
	handler := func(scope, primary, fallback string) string {
		s := ""
		if scope != "" {
			s = `"scope":"` + scope + `",`
		}
		return `{"handler":"idempotency",` + s + `"ledger":{"backend":"memory"},"attempt_timeout":"5s",
			"probe":{"method":"GET","path":"/probe","every":"1h"},
			"providers":[
				{"name":"primary","routes":[{"handle":[{"handler":"reverse_proxy","upstreams":[{"dial":"` + primary + `"}]}]}]},
				{"name":"fallback","routes":[{"handle":[{"handler":"reverse_proxy","upstreams":[{"dial":"` + fallback + `"}]}]}]}]}`
	}
	route := func(path, h string) string {
		return `{"match":[{"path":["` + path + `"]}],"handle":[` + h + `],"terminal":true}`
	}
	return `{"admin":{"disabled":true,"config":{"persist":false}},
		"storage":{"module":"file_system","root":"` + t.TempDir() + `"},
		"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{
			"api":{"listen":["127.0.0.1:0"],"automatic_https":{"disable":true},"routes":[` +
		route("/a/*", handler("", upstreams["busy"], upstreams["good"])) + `,` +
		route("/b/*", handler("", upstreams["busy"], upstreams["badprobe"])) + `,` +
		route("/c/*", handler("billing", upstreams["good"], upstreams["good"])) + `]},
			"shop":{"listen":["localhost:0"],"automatic_https":{"disable":true},"routes":[` +
		route("/*", handler("", upstreams["good"], upstreams["badprobe"])) + `]}}}}}`
}

// TestScopesOfAConfig: each handler gets its scope (derived from its
// server and place, or set), keeps its own probe results, fails over by
// them alone, and labels its provider metrics; a reload keeps the scopes.
func TestScopesOfAConfig(t *testing.T) {
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"from":"good"}`)
	}))
	defer good.Close()
	busy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "busy", http.StatusServiceUnavailable)
	}))
	defer busy.Close()
	badProbe := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/probe" {
			http.Error(w, "not today", http.StatusInternalServerError)
			return
		}
		io.WriteString(w, `{"from":"badprobe"}`)
	}))
	defer badProbe.Close()
	host := func(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }
	cfg := scopeConfig(t, map[string]string{"good": host(good), "busy": host(busy), "badprobe": host(badProbe)})
	loadConfig(t, cfg)

	wantScopes := []string{"api/primary", "api/fallback", "api#2/primary", "api#2/fallback",
		"billing/primary", "billing/fallback", "shop/primary", "shop/fallback"}
	probed := func() map[string]*ProbeResult {
		m := map[string]*ProbeResult{}
		for _, p := range listProviders() {
			m[p.Scope+"/"+p.Name] = p.Probe
		}
		return m
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := probed()
		done := len(m) == len(wantScopes)
		for _, r := range m {
			done = done && r != nil
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probes did not all run: %v", listProviders())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var got []string
	for _, p := range listProviders() {
		got = append(got, p.Scope+"/"+p.Name)
	}
	slices.Sort(got)
	want := slices.Sorted(slices.Values(wantScopes))
	if !slices.Equal(got, want) {
		t.Fatalf("providers %v, want %v", got, want)
	}
	m := probed()
	for key, ok := range map[string]bool{
		"api/fallback": true, "api#2/fallback": false, "billing/fallback": true, "shop/fallback": false,
		"api/primary": false, "shop/primary": true,
	} {
		if m[key].OK != ok {
			t.Errorf("probe of %s: %+v, want ok %v", key, m[key], ok)
		}
	}

	active := caddy.ActiveContext()
	app, err := active.App("http")
	if err != nil {
		t.Fatal(err)
	}
	srv := app.(*caddyhttp.App).Servers["api"]
	handlerAt := func(i int) *Handler { return srv.Routes[i].Handlers[0].(*Handler) }
	if h1, h2 := handlerAt(0), handlerAt(1); h1.scope != "api" || h2.scope != "api#2" || !h1.eligible(1) || h2.eligible(1) {
		t.Errorf("handlers %q (fallback eligible %v) and %q (fallback eligible %v), want api true, api#2 false",
			h1.scope, h1.eligible(1), h2.scope, h2.eligible(1))
	}

	// Each handler's primary answers 503; only the one whose own fallback
	// passed its probe fails over.
	base := "http://" + srv.Listeners()[0].Addr().String()
	post := func(path, key string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+path, strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, body := post("/a/charge", "k1"); st != http.StatusOK || body != `{"from":"good"}` {
		t.Errorf("api: %d %s, want the fallback's answer", st, body)
	}
	if st, body := post("/b/charge", "k2"); st != http.StatusServiceUnavailable {
		t.Errorf("api#2: %d %s, want the primary's 503 (its fallback failed its probe)", st, body)
	}

	reg := active.GetMetricsRegistry()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP caddy_idempotency_probe_ok 1 when the provider's latest probe passed the contract, 0 when it failed, by handler scope and provider.
# TYPE caddy_idempotency_probe_ok gauge
caddy_idempotency_probe_ok{provider="fallback",scope="api"} 1
caddy_idempotency_probe_ok{provider="fallback",scope="api#2"} 0
caddy_idempotency_probe_ok{provider="fallback",scope="billing"} 1
caddy_idempotency_probe_ok{provider="fallback",scope="shop"} 0
caddy_idempotency_probe_ok{provider="primary",scope="api"} 0
caddy_idempotency_probe_ok{provider="primary",scope="api#2"} 0
caddy_idempotency_probe_ok{provider="primary",scope="billing"} 1
caddy_idempotency_probe_ok{provider="primary",scope="shop"} 1
`), "caddy_idempotency_probe_ok"); err != nil {
		t.Error(err)
	}
	m2, err := newMetrics(reg, "")
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(testutil.ToFloat64(m2.attempts.WithLabelValues("api", "fallback", "succeeded")), " ",
		testutil.ToFloat64(m2.attempts.WithLabelValues("api#2", "primary", "failed"))); got != "1 1" {
		t.Errorf("attempts api/fallback/succeeded and api#2/primary/failed: %s, want 1 1", got)
	}

	// A reload of the same config keeps every scope: one entry each.
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	got = got[:0]
	for _, p := range listProviders() {
		got = append(got, p.Scope+"/"+p.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("after a reload: %v, want %v", got, want)
	}
}

// configContext returns the context of a new config with nothing in it,
// as Caddy hands it to the modules it provisions, cancelled when the test
// ends.
func configContext(t *testing.T) (caddy.Context, context.CancelFunc) {
	t.Helper()
	base, err := caddy.ProvisionContext(&caddy.Config{Logging: &caddy.Logging{Logs: map[string]*caddy.CustomLog{
		"default": {BaseLog: caddy.BaseLog{Level: "ERROR"}},
	}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := caddy.NewContext(base)
	t.Cleanup(cancel)
	return ctx, cancel
}

// TestClaimScope: default scopes are numbered per server within one config
// load; a scope two handlers of a load would share is refused; another
// load numbers afresh.
func TestClaimScope(t *testing.T) {
	ctx, _ := configContext(t)
	for _, tc := range []struct{ explicit, want, err string }{
		{"", "idempotency", ""},
		{"api.example.com", "api.example.com", ""},
		{"", "idempotency#3", ""},
		{"api.example.com", "", `scope "api.example.com" is another idempotency handler's in this config`},
		{"idempotency#6", "idempotency#6", ""},
		{"", "", `scope "idempotency#6" is another idempotency handler's`},
		{"two words", "", `scope "two words": want 1 to 100 visible characters, no spaces`},
		{strings.Repeat("x", 101), "", "want 1 to 100 visible characters"},
	} {
		got, err := claimScope(ctx, tc.explicit)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("claim %q: %q, %v; want error %q", tc.explicit, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("claim %q: %q, %v; want %q", tc.explicit, got, err, tc.want)
		}
	}

	other, _ := configContext(t)
	if got, err := claimScope(other, ""); err != nil || got != "idempotency" {
		t.Errorf("another load's first handler: %q, %v", got, err)
	}
	if got, err := claimScope(other, "api.example.com"); err != nil || got != "api.example.com" {
		t.Errorf("another load's named handler: %q, %v", got, err)
	}
}

// TestScopesPerConfig: the scopes are kept by each config's idempotency
// app, one per config, created by the first handler that asks: two
// configs running side by side (an old one and its reload) each have the
// same servers' handlers, and each config's two handlers of one server
// get srv and srv#2; neither config's claims are the other's.
func TestScopesPerConfig(t *testing.T) {
	// serverCtx is ctx as the HTTP app hands it to the handlers of its
	// server name (the app names its servers when it is provisioned).
	serverCtx := func(ctx caddy.Context, name string) caddy.Context {
		srv := &caddyhttp.Server{Listen: []string{"127.0.0.1:0"}}
		app := &caddyhttp.App{Servers: map[string]*caddyhttp.Server{name: srv}}
		if err := app.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { app.Cleanup() })
		ctx.Context = context.WithValue(ctx.Context, caddyhttp.ServerCtxKey, srv)
		return ctx
	}
	oldCfg, cancelOld := configContext(t)
	newCfg, _ := configContext(t)
	oldSrv, newSrv := serverCtx(oldCfg, "srv"), serverCtx(newCfg, "srv")

	for _, step := range []struct {
		ctx       caddy.Context
		want, err string
	}{
		{ctx: oldSrv, want: "srv"},
		{ctx: newSrv, want: "srv"},
		{ctx: oldSrv, want: "srv#2"},
		{ctx: newSrv, want: "srv#2"},
	} {
		if got, err := claimScope(step.ctx, ""); err != nil || got != step.want {
			t.Errorf("claim: %q, %v; want %q", got, err, step.want)
		}
	}
	if _, err := claimScope(oldSrv, "srv#2"); err == nil {
		t.Error("the old config handed out srv#2 twice")
	}
	if got, err := claimScope(newSrv, "billing"); err != nil || got != "billing" {
		t.Errorf("new config's billing: %q, %v", got, err)
	}
	if got, err := claimScope(oldSrv, "billing"); err != nil || got != "billing" {
		t.Errorf("old config's billing, claimed by the new one too: %q, %v", got, err)
	}

	oldApp, err := appOf(oldCfg)
	if err != nil {
		t.Fatal(err)
	}
	again, err := appOf(oldSrv)
	if err != nil {
		t.Fatal(err)
	}
	newApp, err := appOf(newCfg)
	if err != nil {
		t.Fatal(err)
	}
	if oldApp != again || oldApp == newApp {
		t.Errorf("apps: old %p and %p (want the same), new %p (want another)", oldApp, again, newApp)
	}

	// The old config goes; the new one's claims stay as they were.
	cancelOld()
	if _, err := claimScope(newSrv, "billing"); err == nil {
		t.Error("the new config handed out billing twice after the old config ended")
	}
	// Every handler of the server counts, named or not: this is its fifth.
	if got, err := claimScope(newSrv, ""); err != nil || got != "srv#5" {
		t.Errorf("new config's fifth handler in srv: %q, %v; want srv#5", got, err)
	}
}

// TestScopeConflictRefused: a config whose two handlers would share a
// scope does not load.
func TestScopeConflictRefused(t *testing.T) {
	h := func(scope string) string {
		return `{"handler":"idempotency","scope":"` + scope + `","ledger":{"backend":"memory"}}`
	}
	cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{
		"a":{"listen":["127.0.0.1:0"],"automatic_https":{"disable":true},"routes":[{"handle":[` + h("same") + `]}]},
		"b":{"listen":["localhost:0"],"automatic_https":{"disable":true},"routes":[{"handle":[` + h("same") + `]}]}}}}}`
	if err := validate(t, []byte(cfg)); err == nil || !strings.Contains(err.Error(), `scope "same" is another idempotency handler's in this config`) {
		t.Fatalf("error %v", err)
	}
}

func TestUnmarshalScope(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\tscope api.example.com\n}")); err != nil || h.Scope != "api.example.com" {
		t.Fatalf("scope %q, %v", h.Scope, err)
	}
	for _, tc := range []struct{ in, want string }{
		{"idempotency {\n\tscope\n}", "wrong argument count"},
		{"idempotency {\n\tscope a b\n}", "wrong argument count"},
		{"idempotency {\n\tscope a\n\tscope b\n}", `duplicate subdirective "scope", at Testfile:3`},
		{"idempotency {\n\tscope \"a b\"\n}", `scope "a b": want 1 to 100 visible characters, no spaces, at Testfile:2`},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
	out, err := adapt(t, ":8080 {\n\tidempotency {\n\t\tscope billing\n\t}\n}\n")
	if err != nil || !strings.Contains(string(out), `"handler":"idempotency","scope":"billing"`) {
		t.Errorf("adapted: %s %v", out, err)
	}
}
