package caddymodule

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// jsonConfig is a whole Caddy config whose one server runs an idempotency
// handler with the given providers (a JSON array), as `caddy validate`
// would read it.
func jsonConfig(providers string) []byte {
	return []byte(`{"admin":{"disabled":true},"apps":{"http":{"servers":{"api":{"listen":["127.0.0.1:0"],
		"automatic_https":{"disable":true},
		"routes":[{"handle":[{"handler":"idempotency","ledger":{"backend":"memory"},"providers":` + providers + `}]}]}}}}}`)
}

// validate provisions a config as `caddy validate` does, and unloads it.
func validate(t *testing.T, cfgJSON []byte) error {
	t.Helper()
	var cfg caddy.Config
	if err := json.Unmarshal(cfgJSON, &cfg); err != nil {
		t.Fatal(err)
	}
	return caddy.Validate(&cfg)
}

// TestRefuseResendsJSON: a provider whose reverse_proxy would send a
// request again on its own is refused when the JSON config is provisioned,
// wherever in the provider's routes it is.
func TestRefuseResendsJSON(t *testing.T) {
	const proxy = `{"handler":"reverse_proxy","upstreams":[{"dial":"127.0.0.1:1"}]%s}`
	rp := func(opts string) string { return fmt.Sprintf(proxy, opts) }
	sub := func(inner string) string { return `{"handler":"subroute","routes":[{"handle":[` + inner + `]}]}` }
	for _, tc := range []struct{ name, handlers, want string }{
		{"plain", rp(""), ""},
		{"lb_retries only", rp(`,"load_balancing":{"retries":2}`), ""},
		{"response_buffers", rp(`,"response_buffers":4096`), ""},
		{"retry_match", rp(`,"load_balancing":{"retries":2,"retry_match":[{"method":["POST"]}]}`), "reverse_proxy retry_match (lb_retry_match in a Caddyfile) is not allowed inside a provider"},
		{"request_buffers", rp(`,"request_buffers":4096`), "reverse_proxy request_buffers is not allowed inside a provider"},
		{"request_buffers unlimited", rp(`,"request_buffers":-1`), "reverse_proxy request_buffers"},
		{"in a subroute", sub(rp(`,"request_buffers":1024`)), "reverse_proxy request_buffers"},
		{"in a nested subroute", sub(sub(rp(`,"load_balancing":{"retry_match":[{"method":["POST"]}]}`))), "reverse_proxy retry_match"},
		{"in a subroute's errors", `{"handler":"subroute","routes":[{"handle":[` + rp("") + `]}],"errors":{"routes":[{"handle":[` + rp(`,"request_buffers":1`) + `]}]}}`, "reverse_proxy request_buffers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validate(t, jsonConfig(`[{"name":"primary","routes":[{"handle":[`+rp("")+`]}]},{"name":"backup","routes":[{"handle":[`+tc.handlers+`]}]}]`))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "provider backup: ") {
				t.Fatalf("error %v, want one about provider backup containing %q", err, tc.want)
			}
		})
	}
}

// TestRefuseResendsDecoded: the rule also judges handlers already decoded
// (set in Go, or provisioned), where retry_match is no longer JSON.
func TestRefuseResendsDecoded(t *testing.T) {
	for _, tc := range []struct {
		name string
		h    caddyhttp.MiddlewareHandler
		want string
	}{
		{"plain", &reverseproxy.Handler{}, ""},
		{"retry_match", &reverseproxy.Handler{LoadBalancing: &reverseproxy.LoadBalancing{RetryMatch: caddyhttp.MatcherSets{{}}}}, "retry_match"},
		{"request_buffers", &caddyhttp.Subroute{Routes: caddyhttp.RouteList{{Handlers: []caddyhttp.MiddlewareHandler{&reverseproxy.Handler{RequestBuffers: 10}}}}}, "request_buffers"},
	} {
		err := refuseResends(caddyhttp.RouteList{{Handlers: []caddyhttp.MiddlewareHandler{tc.h}}})
		if (tc.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestRefuseResendsCaddyfile: the same refusal in the Caddyfile, with the
// file and line of the option.
func TestRefuseResendsCaddyfile(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"retry_match", `:8080 {
	idempotency {
		provider a {
			reverse_proxy 127.0.0.1:1 {
				lb_retries 2
				lb_retry_match {
					method POST
				}
			}
		}
	}
}`, "provider a: reverse_proxy retry_match (lb_retry_match in a Caddyfile) is not allowed inside a provider: it re-sends requests that already left, a send the ledger never sees; remove it (reverse_proxy may still retry what never left), at Caddyfile:6"},
		{"request_buffers", `:8080 {
	idempotency {
		provider a {
			reverse_proxy 127.0.0.1:1
		}
		provider b {
			reverse_proxy 127.0.0.1:2 {
				request_buffers 4KiB
			}
		}
	}
}`, "provider b: reverse_proxy request_buffers is not allowed inside a provider: with it an empty body becomes none, and Go's HTTP client re-sends a keyed request on a broken reused connection, a send the ledger never sees; remove it (reverse_proxy may still retry what never left), at Caddyfile:8"},
		{"request_buffers in a handle block", `:8080 {
	idempotency {
		provider a {
			handle /v1/* {
				reverse_proxy 127.0.0.1:1 {
					request_buffers unlimited
				}
			}
		}
	}
}`, "provider a: reverse_proxy request_buffers is not allowed inside a provider: with it an empty body becomes none, and Go's HTTP client re-sends a keyed request on a broken reused connection, a send the ledger never sees; remove it (reverse_proxy may still retry what never left), at Caddyfile:6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := adapt(t, tc.in)
			if err == nil || !strings.HasSuffix(err.Error(), ": "+tc.want) {
				t.Fatalf("error %v\nwant       %s\n(adapted: %s)", err, tc.want, out)
			}
		})
	}
}

// TestAdaptPlainProviderValidates: a provider with an ordinary
// reverse_proxy (it may still retry what never left) adapts and passes
// provisioning.
func TestAdaptPlainProviderValidates(t *testing.T) {
	out, err := adapt(t, `{
	admin off
	auto_https off
}
:8080 {
	idempotency {
		ledger memory
		provider primary {
			reverse_proxy 127.0.0.1:1 {
				lb_retries 2
				lb_try_duration 1s
				response_buffers 4KiB
			}
		}
		provider fallback {
			handle /v1/* {
				reverse_proxy 127.0.0.1:2
			}
		}
	}
}`)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), `"retries":2`) {
		t.Errorf("lb_retries dropped: %s", out)
	}
	if err := validate(t, out); err != nil {
		t.Fatalf("validate: %v\n%s", err, out)
	}
}
