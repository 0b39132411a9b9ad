package caddymodule

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

// everyOption is a directive with most subdirectives (also a fuzz seed).
const everyOption = `idempotency {
	ledger postgres postgres://u@127.0.0.1/db myschema
	owner {http.request.header.X-Api-Key}
	owner_secret s3cret
	key_header X-Idempotency-Key
	methods post put
	require_key
	fingerprint raw
	fingerprint_headers Content-Type X-Tenant
	max_request_body 2MiB
	max_response_body 1KB
	retention 48h
	attempt_timeout 2s
	attempt_deadline 1m
	in_flight wait 5s
	failover_on connect_error 503
}`

func TestUnmarshalCaddyfile(t *testing.T) {
	in := everyOption
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"ledger":{"backend":"postgres","dsn":"postgres://u@127.0.0.1/db","schema":"myschema"},` +
		`"owner":"{http.request.header.X-Api-Key}","owner_secret":"s3cret","key_header":"X-Idempotency-Key",` +
		`"methods":["POST","PUT"],"require_key":true,"fingerprint":"raw","fingerprint_headers":["Content-Type","X-Tenant"],` +
		`"max_request_body":2097152,"max_response_body":1000,"retention":172800000000000,"attempt_timeout":2000000000,` +
		`"attempt_deadline":60000000000,"in_flight":"wait","in_flight_wait":5000000000,"failover_on":["connect_error","503"]}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
}

func TestUnmarshalCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"argument on the directive", `idempotency foo`, "wrong argument count"},
		{"unknown subdirective", "idempotency {\n\tbogus\n}", `unknown subdirective "bogus", at Testfile:2`},
		{"duplicate", "idempotency {\n\tretention 1h\n\tretention 2h\n}", `duplicate subdirective "retention", at Testfile:3`},
		{"ledger unknown", "idempotency {\n\tledger mysql x\n}", `unknown ledger "mysql" (want file, `},
		{"ledger missing", "idempotency {\n\tledger\n}", "wrong argument count or unexpected line ending after 'ledger', at Testfile:2"},
		{"ledger postgres without dsn", "idempotency {\n\tledger postgres\n}", "ledger postgres <dsn>"},
		{"ledger file args", "idempotency {\n\tledger file a b\n}", "usage: ledger file [<path>]"},
		{"bad fingerprint", "idempotency {\n\n\tfingerprint xml\n}", `fingerprint must be raw, json or graphql, not "xml", at Testfile:3`},
		{"bad size", "idempotency {\n\tmax_request_body lots\n}", `invalid size "lots", at Testfile:2`},
		{"bad duration", "idempotency {\n\tretention forever\n}", `invalid duration "forever", at Testfile:2`},
		{"negative duration", "idempotency {\n\tattempt_timeout -1s\n}", `invalid duration "-1s"`},
		{"in_flight bogus", "idempotency {\n\tin_flight maybe\n}", "in_flight must be wait [<duration>] or reject"},
		{"in_flight reject arg", "idempotency {\n\tin_flight reject 1s\n}", "wrong argument count"},
		{"failover_on bad", "idempotency {\n\tfailover_on 503 teapot\n}", `failover_on: "teapot" is not connect_error, contract or a status code, at Testfile:2`},
		{"failover_on empty", "idempotency {\n\tfailover_on\n}", "wrong argument count"},
		{"owner two args", "idempotency {\n\towner a b\n}", "wrong argument count"},
		{"require_key arg", "idempotency {\n\trequire_key yes\n}", "wrong argument count"},
		{"methods empty", "idempotency {\n\tmethods\n}", "wrong argument count"},
		{"key_header not a name", "idempotency {\n\tkey_header \"Idempotency Key\"\n}", `invalid header name "Idempotency Key", at Testfile:2`},
		{"max_wait zero", "idempotency {\n\tmax_wait 0s\n}", `max_wait: invalid duration "0s": it must be more than 0, at Testfile:2`},
		{"max_wait negative", "idempotency {\n\tmax_wait -5s\n}", `invalid duration "-5s": max_wait must not be negative, not -5s, at Testfile:2`},
		{"max_wait not a duration", "idempotency {\n\tmax_wait long\n}", `invalid duration "long", at Testfile:2`},
		{"max_wait missing", "idempotency {\n\tmax_wait\n}", "wrong argument count"},
		{"max_wait two args", "idempotency {\n\tmax_wait 1s 2s\n}", "wrong argument count"},
		{"status_path relative", "idempotency {\n\tstatus_path jobs\n}", `status_path must be a path starting with / other than /, not "jobs", at Testfile:2`},
		{"status_path root", "idempotency {\n\n\tstatus_path /\n}", `not "/", at Testfile:3`},
		{"status_path slashes", "idempotency {\n\tstatus_path //\n}", `not "//", at Testfile:2`},
		{"status_path empty", "idempotency {\n\tstatus_path \"\"\n}", `not "", at Testfile:2`},
		{"status_path missing", "idempotency {\n\tstatus_path\n}", "wrong argument count"},
		{"status_path two args", "idempotency {\n\tstatus_path /a /b\n}", "wrong argument count"},
		{"fingerprint block on raw", "idempotency {\n\tfingerprint raw {\n\t\tinclude /a\n\t}\n}", `fingerprint raw takes no block: include and exclude select members of JSON bodies, at Testfile:3`},
		{"fingerprint block unknown", "idempotency {\n\tfingerprint json {\n\t\tonly /a\n\t}\n}", `fingerprint json: unknown "only", want include or exclude, at Testfile:3`},
		{"fingerprint include empty", "idempotency {\n\tfingerprint json {\n\t\tinclude\n\t}\n}", `fingerprint json: include needs at least one JSON pointer, at Testfile:3`},
		{"fingerprint bad pointer", "idempotency {\n\tfingerprint json {\n\t\texclude /ts meta/trace\n\t}\n}", `fingerprint json: exclude: JSON pointer "meta/trace" must start with /, at Testfile:3`},
		{"fingerprint dash pointer", "idempotency {\n\tfingerprint json {\n\t\tinclude /items/-\n\t}\n}", `names no element a request holds, at Testfile:3`},
		{"fingerprint bad escape", "idempotency {\n\tfingerprint json {\n\t\tinclude /a~2\n\t}\n}", `"~" must be followed by 0 or 1, at Testfile:3`},
		{"fingerprint include and exclude", "idempotency {\n\tfingerprint json {\n\t\tinclude /a\n\t\texclude /b\n\t}\n}", `fingerprint json: include and exclude together: name the members that count, or those that do not, at Testfile:4`},
		{"fingerprint_headers not a name", "idempotency {\n\tfingerprint_headers X-A X:B\n}", `invalid header name "X:B", at Testfile:2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
			if err == nil {
				t.Fatalf("no error for %q", tc.in)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestUnmarshalMaxWaitStatusPath: the values max_wait and status_path
// take, and their JSON.
func TestUnmarshalMaxWaitStatusPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"max_wait 5s", `{"max_wait":5000000000}`},
		{"max_wait 2m", `{"max_wait":120000000000}`},
		{"max_wait 1d", `{"max_wait":86400000000000}`},
		{"status_path /jobs", `{"status_path":"/jobs"}`},
		{"status_path /jobs/", `{"status_path":"/jobs/"}`},
		{"status_path /api/v1/idempotency", `{"status_path":"/api/v1/idempotency"}`},
		{"fingerprint json {\n\t\texclude /ts /meta/trace~1id\n\t}", `{"fingerprint":"json","fingerprint_exclude":["/ts","/meta/trace~1id"]}`},
		{"fingerprint json {\n\t\tinclude /amount\n\t\tinclude /currency /items/0\n\t}", `{"fingerprint":"json","fingerprint_include":["/amount","/currency","/items/0"]}`},
		{"fingerprint json", `{"fingerprint":"json"}`},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var h Handler
			if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\t" + tc.in + "\n}")); err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(h)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
}

// TestMaxWaitStatusPathRules: the JSON rules Provision applies (0 is the
// default, negative an error; "" is off).
func TestMaxWaitStatusPathRules(t *testing.T) {
	for _, d := range []caddy.Duration{0, caddy.Duration(time.Second)} {
		if _, err := (&Handler{MaxWait: d}).check(); err != nil {
			t.Errorf("max_wait %v: %v", d, err)
		}
	}
	if _, err := (&Handler{MaxWait: -caddy.Duration(time.Second)}).check(); err == nil || err.Error() != "max_wait must not be negative, not -1s" {
		t.Errorf("max_wait -1s: %v", err)
	}
	for _, p := range []string{"/jobs", "/a/b", "/jobs/"} {
		if err := checkStatusPath(p); err != nil {
			t.Errorf("status_path %q: %v", p, err)
		}
	}
	for _, p := range []string{"", "/", "//", "jobs", "jobs/"} {
		if err := checkStatusPath(p); err == nil {
			t.Errorf("status_path %q: no error", p)
		}
	}
}

// TestAdapt pins the documented syntax: the directive is ordered before
// handle blocks without a global order option, and adapts to this JSON.
func TestAdapt(t *testing.T) {
	in := `:8080 {
	handle /api/* {
		reverse_proxy 127.0.0.1:9000
	}
	idempotency {
		ledger memory
		in_flight reject
	}
}`
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfile.Format([]byte(in)), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(warnings) > 0 {
		t.Errorf("warnings: %v", warnings)
	}
	routes := adaptedRoutes(t, out)
	if len(routes) != 2 {
		t.Fatalf("routes: %s", out)
	}
	first := string(routes[0][0])
	want := `{"handler":"idempotency","in_flight":"reject","ledger":{"backend":"memory"}}`
	if first != want {
		t.Errorf("first route handler = %s, want %s (the directive must come before handle)", first, want)
	}
	if !strings.Contains(string(routes[1][0]), `"handler":"subroute"`) {
		t.Errorf("second route = %s, want the handle block", routes[1][0])
	}
}

func TestAdaptErrorHasLine(t *testing.T) {
	in := ":8080 {\n\tidempotency {\n\t\tretention 1h\n\t\tretention_typo 2h\n\t}\n}\n"
	_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(in), map[string]any{"filename": "Caddyfile"})
	if err == nil || !strings.Contains(err.Error(), "Caddyfile:4") || !strings.Contains(err.Error(), "retention_typo") {
		t.Errorf("error = %v, want one naming Caddyfile:4 and the subdirective", err)
	}
}

// adaptedRoutes returns the handlers of each route of server srv0 in an
// adapted config.
func adaptedRoutes(t *testing.T, out []byte) [][]json.RawMessage {
	t.Helper()
	var cfg struct {
		Apps struct {
			HTTP struct {
				Servers map[string]struct {
					Routes []struct {
						Handle []json.RawMessage `json:"handle"`
					} `json:"routes"`
				} `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &cfg); err != nil {
		t.Fatal(err)
	}
	var routes [][]json.RawMessage
	for _, r := range cfg.Apps.HTTP.Servers["srv0"].Routes {
		routes = append(routes, r.Handle)
	}
	return routes
}

func adapt(t *testing.T, in string) ([]byte, error) {
	t.Helper()
	out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(caddyfile.Format([]byte(in)), map[string]any{"filename": "Caddyfile"})
	return out, err
}

func TestAdaptProviders(t *testing.T) {
	out, err := adapt(t, `:8080 {
	idempotency {
		hedge_after 250ms
		failover_on connect_error 503
		provider primary {
			reverse_proxy 127.0.0.1:9001 {
				transport http {
					keepalive_idle_conns_per_host 64
				}
			}
		}
		provider fallback {
			header_up_placeholder_is_not_a_directive_here
		}
	}
}`)
	if err == nil {
		t.Fatalf("an unknown directive inside a provider was accepted: %s", out)
	}
	out, err = adapt(t, `:8080 {
	idempotency {
		hedge_after 250ms
		provider primary {
			reverse_proxy 127.0.0.1:9001
		}
		provider fallback {
			rewrite * /v2{uri}
			reverse_proxy 127.0.0.1:9002
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Handler    string `json:"handler"`
		HedgeAfter int64  `json:"hedge_after"`
		Providers  []struct {
			Name   string            `json:"name"`
			Routes []json.RawMessage `json:"routes"`
		} `json:"providers"`
	}
	if err := json.Unmarshal(adaptedRoutes(t, out)[0][0], &h); err != nil {
		t.Fatal(err)
	}
	if h.Handler != "idempotency" || h.HedgeAfter != 250e6 || len(h.Providers) != 2 ||
		h.Providers[0].Name != "primary" || h.Providers[1].Name != "fallback" {
		t.Fatalf("adapted handler: %s", out)
	}
	if !strings.Contains(string(h.Providers[0].Routes[0]), `"upstreams":[{"dial":"127.0.0.1:9001"}]`) {
		t.Errorf("primary routes: %s", h.Providers[0].Routes[0])
	}
	// rewrite orders before reverse_proxy inside the provider, as in a site.
	fb := string(h.Providers[1].Routes[0]) + string(h.Providers[1].Routes[1])
	if strings.Index(fb, `"rewrite"`) > strings.Index(fb, `"reverse_proxy"`) {
		t.Errorf("fallback routes out of order: %s", fb)
	}
}

// TestAdaptDeduplicates: deduplicates and lookup (with its block) are the provider block's own lines,
// taken out before the rest is parsed as handler directives; a nested
// block's line of that name is left to its directive.
func TestAdaptDeduplicates(t *testing.T) {
	out, err := adapt(t, `:8080 {
	idempotency {
		provider pay {
			deduplicates
			reverse_proxy 127.0.0.1:9001 {
				header_up X-From onejob
			}
		}
		provider other {
			lookup GET /charges/{idempotency.job_id}?n={idempotency.attempt} {
				absent 404 410
			}
			reverse_proxy 127.0.0.1:9002
			deduplicates X-Request-Key
		}
		provider plain {
			reverse_proxy 127.0.0.1:9003
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	var h struct {
		Providers []struct {
			Name         string            `json:"name"`
			Deduplicates string            `json:"deduplicates"`
			Lookup       *LookupConfig     `json:"lookup"`
			Routes       []json.RawMessage `json:"routes"`
		} `json:"providers"`
	}
	if err := json.Unmarshal(adaptedRoutes(t, out)[0][0], &h); err != nil {
		t.Fatal(err)
	}
	want := []string{"Idempotency-Key", "X-Request-Key", ""}
	for i, p := range h.Providers {
		if p.Deduplicates != want[i] || len(p.Routes) != 1 || !strings.Contains(string(p.Routes[0]), `"reverse_proxy"`) {
			t.Errorf("provider %s: deduplicates %q, routes %s", p.Name, p.Deduplicates, p.Routes)
		}
	}
	if len(h.Providers) != 3 || !strings.Contains(string(h.Providers[0].Routes[0]), `"X-From"`) {
		t.Errorf("adapted: %s", out)
	}
	if l := h.Providers[1].Lookup; l == nil || l.Method != "GET" || l.URI != "/charges/{idempotency.job_id}?n={idempotency.attempt}" ||
		!slices.Equal(l.Absent, []int{404, 410}) || h.Providers[0].Lookup != nil {
		t.Errorf("lookups: %+v, %+v", h.Providers[0].Lookup, l)
	}
}

func TestAdaptProviderErrors(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"lb_retry_match", ":8080 {\n\tidempotency {\n\t\tprovider a {\n\t\t\treverse_proxy 127.0.0.1:1 {\n\t\t\t\tlb_retries 2\n\t\t\t\tlb_retry_match {\n\t\t\t\t\tmethod POST\n\t\t\t\t}\n\t\t\t}\n\t\t}\n\t}\n}\n",
			"remove it (reverse_proxy may still retry what never left), at Caddyfile:6"},
		{"no name", ":8080 {\n\tidempotency {\n\t\tprovider {\n\t\t\treverse_proxy 127.0.0.1:1\n\t\t}\n\t}\n}\n", "usage: provider <name>"},
		{"no block", ":8080 {\n\tidempotency {\n\t\tprovider a\n\t}\n}\n", "expected a block"},
		{"twice", ":8080 {\n\tidempotency {\n\t\tprovider a {\n\t\t\treverse_proxy 127.0.0.1:1\n\t\t}\n\t\tprovider a {\n\t\t\treverse_proxy 127.0.0.1:2\n\t\t}\n\t}\n}\n", `provider "a" is defined twice`},
		{"bad hedge", ":8080 {\n\tidempotency {\n\t\thedge_after soon\n\t}\n}\n", `invalid duration "soon", at Caddyfile:3`},
		{"deduplicates two headers", ":8080 {\n\tidempotency {\n\t\tprovider a {\n\t\t\treverse_proxy 127.0.0.1:1\n\t\t\tdeduplicates A B\n\t\t}\n\t}\n}\n",
			"provider a: usage: deduplicates [<header>], at Caddyfile:5"},
		{"deduplicates bad header", ":8080 {\n\tidempotency {\n\t\tprovider a {\n\t\t\tdeduplicates \"Idem Key\"\n\t\t\treverse_proxy 127.0.0.1:1\n\t\t}\n\t}\n}\n",
			`provider a: deduplicates: invalid header name "Idem Key", at Caddyfile:4`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := adapt(t, tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

// contractAndProbe is a directive with a contract and a probe block (also
// a fuzz seed).
const contractAndProbe = `idempotency {
	contract {
		status 2xx 404
		content_type application/json
		json_schema /etc/schemas/charge.json
		graphql_schema /etc/schemas/api.graphql
	}
	probe post /health /etc/probe.json {
		every 15s
	}
}`

func TestUnmarshalContractAndProbe(t *testing.T) {
	// A probe needs providers, which only the adapter parses.
	site := ":8080 {\n" + strings.Replace(contractAndProbe, "\tprobe", "\tprovider a {\n\t\treverse_proxy 127.0.0.1:1\n\t}\n\tprovider b {\n\t\treverse_proxy 127.0.0.1:2\n\t}\n\tprobe", 1) + "\n}\n"
	out, err := adapt(t, site)
	if err != nil {
		t.Fatal(err)
	}
	var h Handler
	if err := json.Unmarshal(adaptedRoutes(t, out)[0][0], &h); err != nil {
		t.Fatal(err)
	}
	got, _ := json.Marshal(struct {
		Contract *ContractConfig `json:"contract"`
		Probe    *ProbeConfig    `json:"probe"`
	}{h.Contract, h.Probe})
	want := `{"contract":{"status":["2xx","404"],"content_type":"application/json","json_schema":"/etc/schemas/charge.json",` +
		`"graphql_schema":"/etc/schemas/api.graphql"},"probe":{"method":"POST","path":"/health","body_file":"/etc/probe.json","every":15000000000}}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	var at Handler
	if err := at.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\tcontract {\n\t\tjson_schema /etc/answer.json at /choices/0/message/content\n\t}\n}")); err != nil {
		t.Fatal(err)
	}
	if got, _ := json.Marshal(at); string(got) != `{"contract":{"json_schema":"/etc/answer.json","json_schema_at":"/choices/0/message/content"}}` {
		t.Errorf("json_schema at: %s", got)
	}
	for _, tc := range []struct{ in, want string }{
		{"idempotency {\n\tcontract {\n\t\tstatus 7xx\n\t}\n}", `contract: status "7xx" is not a class 1xx to 5xx, at Testfile:3`},
		{"idempotency {\n\tcontract {\n\t\tschema x\n\t}\n}", `contract: unknown rule "schema"`},
		{"idempotency {\n\tcontract {\n\t\tcontent_type a/b\n\t\tcontent_type b/c\n\t}\n}", `contract: duplicate "content_type", at Testfile:4`},
		{"idempotency {\n\tcontract x\n}", "wrong argument count"},
		{"idempotency {\n\tcontract {\n\t\tjson_schema\n\t}\n}", "usage: json_schema <file> [at <json-pointer>], at Testfile:3"},
		{"idempotency {\n\tcontract {\n\t\tjson_schema a.json at\n\t}\n}", "usage: json_schema <file> [at <json-pointer>], at Testfile:3"},
		{"idempotency {\n\tcontract {\n\t\tjson_schema a.json in /x\n\t}\n}", "usage: json_schema <file> [at <json-pointer>], at Testfile:3"},
		{"idempotency {\n\tcontract {\n\n\t\tjson_schema a.json at choices/0\n\t}\n}", `contract: json_schema at: JSON pointer "choices/0" must start with /, at Testfile:4`},
		{"idempotency {\n\tcontract {\n\t\tjson_schema a.json at /a~x\n\t}\n}", `"~" must be followed by 0 or 1, at Testfile:3`},
		{"idempotency {\n\tprobe GET\n}", "usage: probe <method> <path>"},
		{"idempotency {\n\tprobe GET health\n}", `probe: the path must start with /, not "health"`},
		{"idempotency {\n\tprobe G(T /h\n}", `probe: invalid method "G(T", at Testfile:2`},
		{"idempotency {\n\tprobe GET /h {\n\t\tevery never\n\t}\n}", `invalid duration "never", at Testfile:3`},
		{"idempotency {\n\tprobe GET /h {\n\t\ttimeout 1s\n\t}\n}", `probe: unknown option "timeout"`},
	} {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want %q", tc.in, err, tc.want)
		}
	}
}

// TestAdaptProviderStrayBrace: a block closed by two braces on one line
// has one brace too many, in a provider as in a route's handle block: the
// adapter refuses both, since a provider's handler directives reach it as
// they were written.
func TestAdaptProviderStrayBrace(t *testing.T) {
	for _, in := range []string{
		":8080 {\n\troute {\n\t\thandle {\n\t\t\trespond 200\n\t\t} }\n}\n",
		":8080 {\n\tidempotency {\n\t\tprovider a {\n\t\t\trespond 200\n\t\t} }\n}\n",
	} {
		if out, err := adaptAs(in); err == nil || !strings.Contains(err.Error(), "unrecognized directive: }") {
			t.Errorf("%q: error %v, want the stray brace refused (adapted: %s)", in, err, out)
		}
	}
}
