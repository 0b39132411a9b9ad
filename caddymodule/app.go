package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
)

func init() {
	caddy.RegisterModule(App{})
}

// App is the idempotency app: what the idempotency handlers of one config
// share, kept for as long as that config runs and no longer. It has
// nothing to configure and nothing to start; there is no need to write it
// in a config: Caddy creates it, empty, the first time one of the
// config's handlers asks for it, and a reload gets a new one.
//
// It holds the config's scopes: Caddy gives a handler no id of its own,
// so a handler's default scope is derived from the server it is in and
// its place among that server's idempotency handlers (srv0, srv0#2), and
// two handlers of one config may not share a scope (see the handler's
// scope). What must outlive a reload (the open ledgers, the provider
// list the admin API shows) is kept elsewhere, in the process.
type App struct {
	scopes *configScopes
}

// CaddyModule returns the Caddy module information.
func (App) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency",
		New: func() caddy.Module { return new(App) },
	}
}

// Provision prepares the app's empty state.
func (a *App) Provision(caddy.Context) error {
	a.scopes = newConfigScopes()
	return nil
}

// Start does nothing: the app holds state, it runs nothing.
func (*App) Start() error { return nil }

// Stop does nothing: the app's state goes with its config.
func (*App) Stop() error { return nil }

// appOf returns the idempotency app of the config ctx belongs to.
func appOf(ctx caddy.Context) (*App, error) {
	v, err := ctx.App("idempotency")
	if err != nil {
		return nil, fmt.Errorf("idempotency app: %w", err)
	}
	return v.(*App), nil
}

// Interface guards
var (
	_ caddy.App         = (*App)(nil)
	_ caddy.Provisioner = (*App)(nil)
)
