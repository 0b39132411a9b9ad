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

// The scopes of one config load: Caddy gives a handler no id, so the
// default scope is derived from the server the handler is in and its place
// among that server's idempotency handlers, and two handlers of one load
// may not share a scope. A load is told apart by its context's Done
// channel: one per config, shared by every module it provisions.
var scopeLoads = struct {
	sync.Mutex
	m map[<-chan struct{}]*loadScopes
}{m: make(map[<-chan struct{}]*loadScopes)}

type loadScopes struct {
	handlers map[string]int  // idempotency handlers provisioned so far, by server
	taken    map[string]bool // scopes handed out
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

	done := ctx.Done()
	scopeLoads.Lock()
	defer scopeLoads.Unlock()
	load := scopeLoads.m[done]
	if load == nil {
		load = &loadScopes{handlers: make(map[string]int), taken: make(map[string]bool)}
		if done != nil {
			scopeLoads.m[done] = load
			go func() {
				<-done
				scopeLoads.Lock()
				delete(scopeLoads.m, done)
				scopeLoads.Unlock()
			}()
		}
	}
	load.handlers[server]++
	scope := explicit
	if scope == "" {
		scope = server
		if n := load.handlers[server]; n > 1 {
			scope += "#" + strconv.Itoa(n)
		}
	}
	if load.taken[scope] {
		return "", fmt.Errorf("scope %q is another idempotency handler's in this config: give each handler its own scope", scope)
	}
	load.taken[scope] = true
	return scope, nil
}

// defaultScopeBase stands for the server name of a handler provisioned
// outside an HTTP server.
const defaultScopeBase = "idempotency"
