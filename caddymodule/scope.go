package caddymodule

import (
	"fmt"
	"strconv"
	"sync"
	"unicode"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// maxNameLen bounds a scope and a provider's name: each is a metric label
// value and a column of the jobs page.
const maxNameLen = 100

// validName accepts 1 to maxNameLen visible characters, no white space:
// the rule of a scope and of a provider's name.
func validName(s string) bool {
	if s == "" || len(s) > maxNameLen {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return false
		}
	}
	return true
}

// configScopes are the scopes handed out to the idempotency handlers of
// one config, kept by the config's App.
type configScopes struct {
	mu       sync.Mutex
	handlers map[string]int  // idempotency handlers provisioned so far, by server
	taken    map[string]bool // scopes handed out
}

func newConfigScopes() *configScopes {
	return &configScopes{handlers: make(map[string]int), taken: make(map[string]bool)}
}

// claimScope returns the handler's scope: explicit when set, else derived
// as the Scope field's doc comment says. It fails when another handler of
// the same config already has that scope.
func claimScope(ctx caddy.Context, explicit string) (string, error) {
	if explicit != "" && !validName(explicit) {
		return "", fmt.Errorf("scope %q: want 1 to %d visible characters, no spaces", explicit, maxNameLen)
	}
	server := defaultScopeBase
	if srv, ok := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server); ok && srv != nil && validName(srv.Name()) {
		server = srv.Name()
	}
	app, err := appOf(ctx)
	if err != nil {
		return "", err
	}
	return app.scopes.claim(server, explicit)
}

// claim hands out the scope of the next handler in server: explicit, or
// the server's name, numbered from the server's second handler on.
func (c *configScopes) claim(server, explicit string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.handlers[server]++
	scope := explicit
	if scope == "" {
		scope = server
		if n := c.handlers[server]; n > 1 {
			scope += "#" + strconv.Itoa(n)
		}
	}
	if c.taken[scope] {
		return "", fmt.Errorf("scope %q is another idempotency handler's in this config: give each handler its own scope", scope)
	}
	c.taken[scope] = true
	return scope, nil
}

// defaultScopeBase stands for the server name of a handler provisioned
// outside an HTTP server.
const defaultScopeBase = "idempotency"
