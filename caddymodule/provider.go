package caddymodule

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
)

// Provider is one upstream a job's attempts can go to: its own list of
// routes, as in a subroute (usually a reverse_proxy).
type Provider struct {
	// Name identifies the provider in the ledger, logs and metrics.
	Name string `json:"name"`
	// Routes handle the provider's attempts.
	Routes caddyhttp.RouteList `json:"routes,omitempty"`

	handler caddyhttp.Handler
}

// errNoAnswer is returned when no route of a provider answers: nothing was
// sent anywhere, so the failure is definitive.
var errNoAnswer = errors.New("no handler of the provider answered")

func (p *Provider) provision(ctx caddy.Context) error {
	if err := p.Routes.Provision(ctx); err != nil {
		return fmt.Errorf("provider %s: %w", p.Name, err)
	}
	if err := refuseRetries(p.Name, p.Routes); err != nil {
		return err
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

// refuseRetries rejects a reverse_proxy that re-sends requests on its own
// (retry_match): each send to a provider must be an attempt in the ledger.
func refuseRetries(provider string, routes caddyhttp.RouteList) error {
	for _, route := range routes {
		for _, h := range route.Handlers {
			switch h := h.(type) {
			case *reverseproxy.Handler:
				if h.LoadBalancing != nil && len(h.LoadBalancing.RetryMatch) > 0 {
					return fmt.Errorf("provider %s: reverse_proxy retry_match re-sends requests the ledger never saw; remove it (reverse_proxy may still retry what never left)", provider)
				}
			case *caddyhttp.Subroute:
				if err := refuseRetries(provider, h.Routes); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
