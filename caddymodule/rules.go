package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"

	"github.com/onejob/onejob/contract"
	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/proxy"
)

// The rules a handler's config is held to. Each is written once and
// applied twice: by Provision to the JSON config (`caddy validate`, a
// load), where 0 and "" mean the default, and by the Caddyfile parser to
// the value on its line, where an error names the file and line. A value
// written as 0 or "" in a Caddyfile is itself a mistake (the Caddyfile has
// no way to ask for the default but to leave the line out), so the parser
// refuses it before these rules see it.

// fieldError is a config mistake and the subdirective it is about, by its
// Caddyfile name: the parser points at that subdirective's line.
type fieldError struct {
	name string
	err  error
	with string // a second field the rule holds name to, if any
}

func (e *fieldError) Error() string { return e.err.Error() }
func (e *fieldError) Unwrap() error { return e.err }

// maxSize bounds max_request_body and max_response_body.
const maxSize = 1 << 40

// checkSize is the rule of a size: 0 is the default (in JSON), negative is
// an error, and more than 1 TiB is no bound.
func checkSize(name string, n int64) error {
	switch {
	case n < 0:
		return fmt.Errorf("%s must not be negative, not %d", name, n)
	case n > maxSize:
		return fmt.Errorf("%s: %d bytes is more than 1TiB", name, n)
	}
	return nil
}

// checkDuration is the rule of a duration: 0 is the default (in JSON),
// negative is an error.
func checkDuration(name string, d caddy.Duration) error {
	if d < 0 {
		return fmt.Errorf("%s must not be negative, not %v", name, time.Duration(d))
	}
	return nil
}

// checkOwner refuses an owner that is empty or only white space: every
// request would have the same owner, or none.
func checkOwner(owner string) error {
	if strings.TrimSpace(owner) == "" {
		return fmt.Errorf("owner must not be empty or blank, not %q: leave it out for the default", owner)
	}
	return nil
}

// checkOwnerSecret refuses an empty secret: leave it out for plain
// SHA-256.
func checkOwnerSecret(secret string) error {
	if secret == "" {
		return errors.New("owner_secret must not be empty: leave it out for plain SHA-256")
	}
	return nil
}

// checkKeyHeader refuses a key header that is not a header name, or that
// is one of the headers the gateway sets on upstream requests (the
// provider would get the gateway's value instead of the client's key).
func checkKeyHeader(name string) error {
	if err := checkHeaderName(name); err != nil {
		return fmt.Errorf("key_header: %w", err)
	}
	switch k := http.CanonicalHeaderKey(name); k {
	case proxy.HeaderJobID, proxy.HeaderAttempt, proxy.HeaderDeadline:
		return fmt.Errorf("key_header: %s is set by the gateway on every upstream request; choose another header", k)
	}
	return nil
}

// checkMethod refuses a methods entry that is not an HTTP method token.
func checkMethod(m string) error {
	if !validMethod(m) {
		return fmt.Errorf("methods: %q is not an HTTP method", m)
	}
	return nil
}

// checkFingerprint refuses an unknown fingerprint mode; "" is the default
// in JSON.
func checkFingerprint(mode string) error {
	if mode == "" {
		return nil
	}
	_, err := fingerprint.ParseBodyMode(mode)
	return err
}

// checkFailoverOn parses failover_on and refuses an answer that cannot
// show a provider did not act: a 1xx is never final, and a 2xx shows
// that it did.
func checkFailoverOn(words []string) (fallback.FailoverOn, error) {
	f, err := fallback.ParseFailoverOn(words)
	if err != nil {
		return f, err
	}
	for _, w := range words {
		switch {
		case len(w) == 3 && w[0] == '1':
			return f, fmt.Errorf("failover_on: %s is not a final answer", w)
		case len(w) == 3 && w[0] == '2':
			return f, fmt.Errorf("failover_on: %s is a success: it shows the provider acted", w)
		}
	}
	return f, nil
}

// check is the rule a contract is held to, without reading its files
// (Provision compiles them): known statuses, a media type, and at least
// one thing to check.
func (c *ContractConfig) check() error {
	if len(c.Status) == 0 && c.ContentType == "" && c.JSONSchema == "" && c.GraphQLSchema == "" {
		return errors.New("contract names nothing to check: give status, content_type, json_schema or graphql_schema")
	}
	_, err := contract.Compile(contract.Spec{Statuses: c.Status, ContentType: c.ContentType})
	return err
}

// check is every rule of the handler's config that can be judged before
// anything is opened: each value on its own, then the values together
// (with the defaults of those left out). Provision applies it to JSON; the
// Caddyfile parser applies it once the directive is read (checkGiven),
// pointing at the line of the subdirective an error names. Fingerprint
// selections and the files a contract names are judged when they are
// compiled. What it parses on the way is returned, for Provision to use
// as it is.
func (h *Handler) check() (checked, error) { return h.checkGiven(nil) }

// checked holds the values check parsed.
type checked struct {
	failoverOn fallback.FailoverOn // failover_on, parsed; the zero value when it is not set
}

// checkGiven is check, given which subdirectives a Caddyfile wrote: an
// empty string written there (scope "") is judged, where JSON's empty
// field is one left out.
func (h *Handler) checkGiven(given func(name string) bool) (checked, error) {
	var c checked
	if err := h.checkValues(given, &c); err != nil {
		return c, err
	}
	return c, h.checkTogether(c)
}

// checkValues judges each value on its own, and keeps in c what it
// parsed.
func (h *Handler) checkValues(given func(name string) bool, c *checked) error {
	at := func(name string, err error) error {
		if err == nil {
			return nil
		}
		return &fieldError{name: name, err: err}
	}
	set := func(name, v string) bool { return v != "" || (given != nil && given(name)) }
	if set("scope", h.Scope) && !validName(h.Scope) {
		return at("scope", fmt.Errorf("scope %q: want 1 to %d visible characters, no spaces", h.Scope, maxNameLen))
	}
	if set("owner", h.Owner) {
		if err := checkOwner(h.Owner); err != nil {
			return at("owner", err)
		}
	}
	if set("key_header", h.KeyHeader) {
		if err := checkKeyHeader(h.KeyHeader); err != nil {
			return at("key_header", err)
		}
	}
	for _, m := range h.Methods {
		if err := checkMethod(m); err != nil {
			return at("methods", err)
		}
	}
	if err := checkFingerprint(h.Fingerprint); err != nil {
		return at("fingerprint", err)
	}
	for _, name := range h.FingerprintHeaders {
		if err := checkHeaderName(name); err != nil {
			return at("fingerprint_headers", fmt.Errorf("fingerprint_headers: %w", err))
		}
	}
	for _, name := range h.NeverStore {
		if err := checkNeverStore(name); err != nil {
			return at("never_store", fmt.Errorf("never_store: %w", err))
		}
	}
	if set("status_path", h.StatusPath) {
		if err := checkStatusPath(h.StatusPath); err != nil {
			return at("status_path", err)
		}
	}
	for _, s := range []struct {
		name string
		n    int64
	}{{"max_request_body", h.MaxRequestBody}, {"max_response_body", h.MaxResponseBody}} {
		if err := checkSize(s.name, s.n); err != nil {
			return at(s.name, err)
		}
	}
	for _, d := range []struct {
		name, json string
		d          caddy.Duration
	}{
		{"retention", "retention", h.Retention},
		{"attempt_timeout", "attempt_timeout", h.AttemptTimeout},
		{"attempt_deadline", "attempt_deadline", h.AttemptDeadline},
		{"in_flight", "in_flight_wait", h.InFlightWait},
		{"max_wait", "max_wait", h.MaxWait},
		{"hedge_after", "hedge_after", h.HedgeAfter},
		{"reconcile_every", "reconcile_every", h.ReconcileEvery},
	} {
		if err := checkDuration(d.json, d.d); err != nil {
			return at(d.name, err)
		}
	}
	if _, err := inFlightReject(h.InFlight); err != nil {
		return at("in_flight", err)
	}
	if len(h.FailoverOn) > 0 {
		f, err := checkFailoverOn(h.FailoverOn)
		if err != nil {
			return at("failover_on", err)
		}
		c.failoverOn = f
	}
	for i, p := range h.Providers {
		if err := p.check(h.Providers[:i]); err != nil {
			return at("provider", err)
		}
	}
	if h.Contract != nil {
		if err := h.Contract.check(); err != nil {
			return at("contract", err)
		}
	}
	if h.Probe != nil {
		if err := h.Probe.check(); err != nil {
			return at("probe", err)
		}
	}
	return nil
}

// checkTogether holds the values to each other, the defaults standing in
// for those left out; c is what checkValues parsed.
func (h *Handler) checkTogether(c checked) error {
	timeout := orDefault(h.AttemptTimeout, proxy.DefaultAttemptTimeout)
	deadline := orDefault(h.AttemptDeadline, proxy.DefaultAttemptDeadline)
	if deadline < timeout {
		name := "attempt_deadline"
		if h.AttemptDeadline == 0 {
			name = "attempt_timeout"
		}
		return &fieldError{name: name, err: fmt.Errorf("attempt_deadline (%v) is shorter than attempt_timeout (%v): an attempt's lease must outlast the wait for its answer", deadline, timeout)}
	}
	if h.InFlight == "reject" && h.InFlightWait != 0 {
		return &fieldError{name: "in_flight", err: errors.New("in_flight reject answers duplicates at once: in_flight_wait has no meaning with it")}
	}
	if h.HedgeAfter != 0 {
		if len(h.Providers) < 2 {
			return &fieldError{name: "hedge_after", err: errors.New("hedge_after needs two provider blocks or more: a hedge goes to the next provider")}
		}
		if hedge := time.Duration(h.HedgeAfter); hedge >= timeout {
			return &fieldError{name: "hedge_after", err: fmt.Errorf("hedge_after (%v) must be shorter than attempt_timeout (%v): the attempt times out before a hedge would start", hedge, timeout)}
		}
	}
	if h.Contract == nil && c.failoverOn.Contract {
		return &fieldError{name: "failover_on", err: errors.New("failover_on contract needs a contract: without one no answer breaks it")}
	}
	if err := proxy.CheckImplicitKey(time.Duration(h.ImplicitKey), h.RequireKey); err != nil {
		return &fieldError{name: "implicit_key", with: "require_key", err: err}
	}
	if h.ReconcileEvery != 0 && !slices.ContainsFunc(h.Providers, func(p *Provider) bool { return p.Lookup != nil }) {
		return &fieldError{name: "reconcile_every", err: errors.New("reconcile_every needs a provider with a lookup: only lookups are run by the reconciler")}
	}
	if h.Probe != nil && len(h.Providers) == 0 {
		return &fieldError{name: "probe", err: errors.New("probe needs provider blocks: in drop-in mode there is no provider to probe")}
	}
	return nil
}

// orDefault is d, or def when d is 0.
func orDefault(d caddy.Duration, def time.Duration) time.Duration {
	if d == 0 {
		return def
	}
	return time.Duration(d)
}
