package caddymodule

import (
	"reflect"
	"strings"
	"testing"

	"github.com/onejob/onejob/fallback"
)

func TestValidMethod(t *testing.T) {
	for m, want := range map[string]bool{
		"GET": true, "POST": true, "M-SEARCH": true, "PROPFIND": true, "x!#$%&'*+.^_`|~1": true,
		"": false, "GE T": false, "G(T": false, "GET\r\n": false, "GÉT": false, "G\x00T": false, "G\x7fT": false, "a/b": false,
	} {
		if got := validMethod(m); got != want {
			t.Errorf("validMethod(%q) = %v, want %v", m, got, want)
		}
	}
}

func TestCheckStoredHeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   string // "" is accepted
	}{
		{"Content-Type", []string{"application/json"}, ""},
		{"x-custom", []string{"a", "b\tc"}, ""},
		{"Bad Name", nil, `invalid header name "Bad Name"`},
		{"", nil, `invalid header name ""`},
		{"connection", []string{"close"}, "header Connection is never stored"},
		{"Date", []string{"x"}, "header Date is never stored"},
		{"set-cookie", []string{"s=1"}, "header Set-Cookie is never stored"},
		{"idempotency-expires", []string{"Thu, 01 Jan 1970 00:00:00 GMT"}, "header Idempotency-Expires is the gateway's own"},
		{"Idempotent-Replayed", []string{"true"}, "header Idempotent-Replayed is the gateway's own"},
		{"X-A", []string{"a\r\nb"}, "invalid value for header X-A"},
		{"X-A", []string{"a\x00"}, "invalid value for header X-A"},
		{"X-A", []string{"a\x01"}, "invalid value for header X-A"},
	} {
		err := checkStoredHeader(tc.name, tc.values)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("checkStoredHeader(%q, %q) = %v, want %q", tc.name, tc.values, err, tc.want)
		}
	}
}

// TestProvisionRules: the rules the Caddyfile parser applies are applied
// to a JSON config too, by the same functions.
func TestProvisionRules(t *testing.T) {
	for _, tc := range []struct {
		h    Handler
		want string
	}{
		{Handler{KeyHeader: "Idempotency Key"}, `key_header: invalid header name "Idempotency Key"`},
		{Handler{FingerprintHeaders: []string{"X-A", "X:B"}}, `fingerprint_headers: invalid header name "X:B"`},
	} {
		if _, err := tc.h.check(); err == nil || err.Error() != tc.want {
			t.Errorf("%+v: error %v, want %q", tc.h, err, tc.want)
		}
	}
	for mode, reject := range map[string]bool{"": false, "wait": false, "reject": true} {
		if got, err := inFlightReject(mode); err != nil || got != reject {
			t.Errorf("in_flight %q: %v, %v", mode, got, err)
		}
	}
	if _, err := inFlightReject("maybe"); err == nil {
		t.Error(`in_flight "maybe" accepted`)
	}
	p := &ProbeConfig{Method: "GET", Path: "health"}
	if err := p.check(); err == nil || !strings.Contains(err.Error(), "must start with /") {
		t.Errorf("probe path: %v", err)
	}
	for _, tc := range []struct {
		name    string
		earlier []*Provider
		want    string
	}{
		{"", []*Provider{{Name: "a"}}, "provider 2 has no name"},
		{"a", []*Provider{{Name: "a"}}, `provider "a" is defined twice`},
		{"b", []*Provider{{Name: "a"}}, ""},
	} {
		err := checkProviderName(tc.name, tc.earlier)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || err.Error() != tc.want) {
			t.Errorf("checkProviderName(%q): %v, want %q", tc.name, err, tc.want)
		}
	}
}

// TestProvisionFailoverOn: the failover_on that check parsed is the one
// the request flow runs with; without it, the flow's default.
func TestProvisionFailoverOn(t *testing.T) {
	for _, tc := range []struct {
		field string
		want  fallback.FailoverOn
	}{
		{`,"failover_on":["connect_error","500"]`, fallback.FailoverOn{ConnectError: true, Statuses: map[int]bool{500: true}}},
		{``, fallback.DefaultFailoverOn()},
	} {
		h, err := provisioned(t, `{"ledger":{"backend":"memory"}`+tc.field+`}`)
		if err != nil {
			t.Fatalf("%s: %v", tc.field, err)
		}
		if got := h.mw.Config().FailoverOn; !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: the flow fails over on %+v, want %+v", tc.field, got, tc.want)
		}
	}
}
