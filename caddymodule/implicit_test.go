package caddymodule

import (
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalImplicitKey(t *testing.T) {
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n\timplicit_key 10m\n}")); err != nil {
		t.Fatal(err)
	}
	if time.Duration(h.ImplicitKey) != 10*time.Minute {
		t.Errorf("implicit_key %v, want 10m", h.ImplicitKey)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"missing", "idempotency {\n\timplicit_key\n}", "wrong argument count"},
		{"two args", "idempotency {\n\timplicit_key 1m 2m\n}", "wrong argument count"},
		{"not a duration", "idempotency {\n\timplicit_key soon\n}", `invalid duration "soon", at Testfile:2`},
		{"zero", "idempotency {\n\timplicit_key 0s\n}", `implicit_key: invalid duration "0s": it must be more than 0, at Testfile:2`},
		{"after require_key", "idempotency {\n\trequire_key\n\n\timplicit_key 1m\n}",
			"implicit_key and require_key together: a request without a key is either refused or keyed by its fingerprint, not both, at Testfile:4"},
		{"before require_key", "idempotency {\n\timplicit_key 1m\n\trequire_key\n}", "not both, at Testfile:3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// TestImplicitKeyJSONRules: JSON that sets implicit_key with require_key,
// or a negative window, does not provision.
func TestImplicitKeyJSONRules(t *testing.T) {
	for _, tc := range []struct{ handler, want string }{
		{`"implicit_key":"5m","require_key":true`, "implicit_key and require_key together"},
		{`"implicit_key":"-5m"`, "implicit_key must be a positive window"},
	} {
		cfg := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"a":{"listen":["127.0.0.1:0"],"automatic_https":{"disable":true},` +
			`"routes":[{"handle":[{"handler":"idempotency","ledger":{"backend":"memory"},` + tc.handler + `}]}]}}}}}`
		if err := validate(t, []byte(cfg)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", tc.handler, err, tc.want)
		}
	}
	ok := `{"admin":{"disabled":true},"apps":{"http":{"servers":{"a":{"listen":["127.0.0.1:0"],"automatic_https":{"disable":true},` +
		`"routes":[{"handle":[{"handler":"idempotency","ledger":{"backend":"memory"},"implicit_key":"5m"}]}]}}}}}`
	if err := validate(t, []byte(ok)); err != nil {
		t.Errorf("implicit_key alone: %v", err)
	}
}
