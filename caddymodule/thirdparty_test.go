package caddymodule_test

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/onejob/onejob/caddymodule"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// guestLedger is a ledger module as a third party writes one, outside
// package caddymodule: a module of namespace idempotency.ledgers that
// embeds LedgerHolder and has its own Caddyfile syntax.
type guestLedger struct {
	// Store names the store; two modules with the same store share it.
	Store string `json:"store"`

	caddymodule.LedgerHolder
}

// guestOpened counts the guest ledgers opened.
var guestOpened atomic.Int32

func init() { caddy.RegisterModule(guestLedger{}) }

func (guestLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{ID: "idempotency.ledgers.guesttest", New: func() caddy.Module { return new(guestLedger) }}
}

func (g *guestLedger) Provision(ctx caddy.Context) error {
	return g.Open(ctx, "guesttest\x00"+g.Store, func() (ledger.Ledger, error) {
		guestOpened.Add(1)
		return memory.New(), nil
	})
}

// UnmarshalCaddyfile: ledger guesttest <store>
func (g *guestLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the module's name
	if !d.NextArg() {
		return d.ArgErr()
	}
	g.Store = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		return d.Errf("unknown subdirective %q", d.Val())
	}
	return nil
}

// TestThirdPartyLedger: a ledger module from another package is named in
// a Caddyfile and in JSON, provisioned into the shared pool, and records
// jobs, with no change to package caddymodule.
func TestThirdPartyLedger(t *testing.T) {
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n\tidempotency {\n\t\tledger guesttest shop\n\t}\n}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"ledger":{"backend":"guesttest","store":"shop"}`) {
		t.Fatalf("adapted: %s", out)
	}
	if _, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(":8080 {\n\tidempotency {\n\t\tledger guesttest\n\t}\n}\n"), nil); err == nil {
		t.Error("the guest's own syntax was not applied: `ledger guesttest` with no store accepted")
	}

	cfg := `{"admin":{"disabled":true,"config":{"persist":false}},
		"storage":{"module":"file_system","root":"` + t.TempDir() + `"},
		"logging":{"logs":{"default":{"level":"ERROR"}}},
		"apps":{"http":{"servers":{"api":{"listen":["127.0.0.1:0"],"automatic_https":{"disable":true},"routes":[{"handle":[
			{"handler":"idempotency","ledger":{"backend":"guesttest","store":"` + t.Name() + `"}},
			{"handler":"static_response","status_code":201,"body":"{\"n\":1}"}]}]}}}}}`
	if err := caddy.Load([]byte(cfg), true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Error(err)
		}
	})
	app, err := caddy.ActiveContext().App("http")
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + app.(*caddyhttp.App).Servers["api"].Listeners()[0].Addr().String()
	post := func() (int, string) {
		req, _ := http.NewRequest(http.MethodPost, base+"/charge", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k1")
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		return resp.StatusCode, resp.Header.Get("Idempotent-Replayed")
	}
	if st, replayed := post(); st != http.StatusCreated || replayed == "true" {
		t.Errorf("first request: %d, replayed %q", st, replayed)
	}
	if st, replayed := post(); st != http.StatusCreated || replayed != "true" {
		t.Errorf("retry: %d, replayed %q; want the stored answer from the guest ledger", st, replayed)
	}
	if n := guestOpened.Load(); n != 1 {
		t.Errorf("guest ledger opened %d times, want 1", n)
	}
}
