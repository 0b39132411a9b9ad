package caddymodule

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"

	"github.com/onejob/onejob/ledger"
)

// Provider is one upstream a job's attempts can go to: its own list of
// routes, as in a subroute (usually a reverse_proxy).
type Provider struct {
	// Identifies the provider in the ledger, logs and metrics: 1 to 100
	// visible characters, no spaces, not "admin", unique within its
	// handler. Providers of the same name in two handlers are kept apart
	// by each handler's scope.
	Name string `json:"name"`
	// The routes that handle the provider's attempts; at least one. A
	// reverse_proxy among them must not send a request again on its own:
	// retry_match and request_buffers are refused.
	Routes caddyhttp.RouteList `json:"routes,omitempty"`
	// The request header the provider honours as its own idempotency key
	// (Idempotency-Key, for many payment APIs): each attempt sends the job
	// id there, never the client's key. Empty: the provider does not
	// deduplicate.
	Deduplicates string `json:"deduplicates,omitempty"`
	// Asks the provider whether an attempt whose outcome is unknown acted,
	// once its attempt_deadline passed: the reconciler settles the attempt
	// by the answer. Without one, the provider's unknown attempts wait for
	// an operator (or a re-send, when it deduplicates).
	Lookup *LookupConfig `json:"lookup,omitempty"`

	handler caddyhttp.Handler
}

// LookupConfig is the request a reconciler sends through a provider's
// routes to learn whether an unknown attempt acted.
type LookupConfig struct {
	// The lookup's HTTP method.
	Method string `json:"method"`
	// The lookup's path and query, with the placeholders
	// {idempotency.job_id} and {idempotency.attempt}: the values the
	// provider received in Idempotency-Job-Id and Idempotency-Attempt.
	URI string `json:"uri"`
	// The statuses that mean the provider never acted on the attempt: it
	// failed, and a retry may run the job again. Default 404. A 2xx means
	// it acted, and the answer becomes the job's; any other status leaves
	// the attempt unknown until the next lookup.
	Absent []int `json:"absent,omitempty"`
}

// check is the rule a lookup is held to, in JSON and in a Caddyfile: a
// method, a path (the lookup goes through the provider's handlers, in
// process) and absent statuses that are final answers other than 2xx.
func (c *LookupConfig) check() error {
	if !validMethod(c.Method) {
		return fmt.Errorf("lookup: %q is not an HTTP method", c.Method)
	}
	if !strings.HasPrefix(c.URI, "/") {
		return fmt.Errorf("lookup: the URI must be a path starting with /, not %q", c.URI)
	}
	for _, code := range c.Absent {
		if code < 300 || code > 599 {
			return fmt.Errorf("lookup: absent %d: want a status from 300 to 599 (a 2xx means the provider acted)", code)
		}
	}
	return nil
}

// checkProviderName is the rule a provider's name is held to, in JSON and
// in a Caddyfile: it is given, 1 to 100 visible characters with no spaces,
// not "admin" (the provider of the attempts an operator completes), and
// no earlier provider of the handler has it.
func checkProviderName(name string, earlier []*Provider) error {
	switch {
	case name == "":
		return fmt.Errorf("provider %d has no name", len(earlier)+1)
	case !validName(name):
		return fmt.Errorf("provider name %q: want 1 to %d visible characters, no spaces", name, maxNameLen)
	case name == ledger.AdminProvider:
		return fmt.Errorf("provider name %q is reserved for the attempts an operator completes", name)
	}
	for _, q := range earlier {
		if q.Name == name {
			return fmt.Errorf("provider %q is defined twice", name)
		}
	}
	return nil
}

// check is the rule a provider is held to, in JSON and in a Caddyfile: its
// name (checkProviderName) and at least one route to send attempts to.
func (p *Provider) check(earlier []*Provider) error {
	if err := checkProviderName(p.Name, earlier); err != nil {
		return err
	}
	if len(p.Routes) == 0 {
		return fmt.Errorf("provider %s has no handlers: every attempt would find no one to answer it", p.Name)
	}
	if p.Deduplicates != "" {
		if err := checkHeaderName(p.Deduplicates); err != nil {
			return fmt.Errorf("provider %s: deduplicates: %w", p.Name, err)
		}
	}
	if p.Lookup != nil {
		if err := p.Lookup.check(); err != nil {
			return fmt.Errorf("provider %s: %w", p.Name, err)
		}
	}
	return nil
}

// errNoAnswer is returned when no route of a provider answers: nothing was
// sent anywhere, so the failure is definitive.
var errNoAnswer = errors.New("no handler of the provider answered")

func (p *Provider) provision(ctx caddy.Context) error {
	// Judged on the routes as configured, before provisioning drops their
	// JSON and before any health check starts.
	if err := refuseResends(p.Routes); err != nil {
		return fmt.Errorf("provider %s: %w", p.Name, err)
	}
	if err := p.Routes.Provision(ctx); err != nil {
		return fmt.Errorf("provider %s: %w", p.Name, err)
	}
	p.handler = p.Routes.Compile(caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
		return fmt.Errorf("provider %s: %w", p.Name, errNoAnswer)
	}))
	return nil
}

// ServeHTTP sends one attempt through the provider's routes.
func (p *Provider) ServeHTTP(w http.ResponseWriter, r *http.Request) error {
	return p.handler.ServeHTTP(w, r)
}

// resendError is a reverse_proxy option that would send a request again
// below the gateway: a send the ledger never sees.
type resendError struct {
	// Option is the reverse_proxy option as JSON names it.
	Option string
	// Subdirective is its name in reverse_proxy's Caddyfile block.
	Subdirective string
	why          string
}

func (e *resendError) Error() string {
	name := e.Option
	if e.Subdirective != e.Option {
		name += " (" + e.Subdirective + " in a Caddyfile)"
	}
	return "reverse_proxy " + name + " is not allowed inside a provider: " + e.why +
		", a send the ledger never sees; remove it (reverse_proxy may still retry what never left)"
}

// refuseResends is the one rule against a provider's reverse_proxy sending a
// request again on its own; each send to a provider must be an attempt in
// the ledger. It refuses:
//   - retry_match, which re-sends requests that already left;
//   - request_buffers, with which reverse_proxy turns an empty body into
//     none, and Go's HTTP client then re-sends a keyed request when a
//     reused connection breaks before the answer.
//
// It reads the routes as configured: their handlers' JSON (and any handler
// already decoded), walking into subroutes (handle, route, handle_path). So
// the same rule judges a JSON config when the handler is provisioned and the
// Caddyfile adapter's output, where the error gets its file and line.
func refuseResends(routes caddyhttp.RouteList) error {
	for _, route := range routes {
		for _, raw := range route.HandlersRaw {
			if err := refuseResendsRaw(raw); err != nil {
				return err
			}
		}
		for _, h := range route.Handlers {
			var err error
			switch h := h.(type) {
			case *reverseproxy.Handler:
				retry := h.LoadBalancing != nil && (len(h.LoadBalancing.RetryMatch) > 0 || len(h.LoadBalancing.RetryMatchRaw) > 0)
				err = resends(retry, h.RequestBuffers)
			case *caddyhttp.Subroute:
				err = refuseResendsSubroute(h)
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// refuseResendsRaw judges one handler of a route in its JSON form.
func refuseResendsRaw(raw json.RawMessage) error {
	var mod struct {
		Handler string `json:"handler"`
	}
	if err := json.Unmarshal(raw, &mod); err != nil {
		return fmt.Errorf("decoding a handler: %w", err)
	}
	switch mod.Handler {
	case "reverse_proxy":
		var h reverseproxy.Handler
		if err := json.Unmarshal(raw, &h); err != nil {
			return fmt.Errorf("decoding reverse_proxy: %w", err)
		}
		return resends(h.LoadBalancing != nil && len(h.LoadBalancing.RetryMatchRaw) > 0, h.RequestBuffers)
	case "subroute":
		var sr caddyhttp.Subroute
		if err := json.Unmarshal(raw, &sr); err != nil {
			return fmt.Errorf("decoding subroute: %w", err)
		}
		return refuseResendsSubroute(&sr)
	}
	return nil
}

func refuseResendsSubroute(sr *caddyhttp.Subroute) error {
	if err := refuseResends(sr.Routes); err != nil {
		return err
	}
	if sr.Errors != nil {
		return refuseResends(sr.Errors.Routes)
	}
	return nil
}

// resends names the option of a reverse_proxy that would send a request
// again on its own, or returns nil.
func resends(retryMatch bool, requestBuffers int64) error {
	switch {
	case retryMatch:
		return &resendError{Option: "retry_match", Subdirective: "lb_retry_match", why: "it re-sends requests that already left"}
	case requestBuffers != 0:
		return &resendError{Option: "request_buffers", Subdirective: "request_buffers", why: "with it an empty body becomes none, and Go's HTTP client re-sends a keyed request on a broken reused connection"}
	}
	return nil
}
