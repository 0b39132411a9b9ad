package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/onejob/onejob/ledger"
)

func init() {
	caddy.RegisterModule(MemoryLedger{})
	caddy.RegisterModule(FileLedger{})
	caddy.RegisterModule(PostgresLedger{})
	caddy.RegisterModule(RedisLedger{})
}

// openTimeout bounds connecting to a ledger's server and migrating it.
const openTimeout = 30 * time.Second

// dial is how a ledger on a server opens: within openTimeout, and an error
// names the server as shown, without its password.
func dial(shown string, open func(context.Context) (ledger.Ledger, error)) func() (ledger.Ledger, error) {
	return func() (ledger.Ledger, error) {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		defer cancel()
		l, err := open(ctx)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", shown, err)
		}
		return l, nil
	}
}

// serverURL expands the placeholders of a server's URL (what names the
// module that has it) and returns it with the form logs and errors show:
// its password replaced (url.URL.Redacted). An error never shows the URL.
func serverURL(what, configured string) (raw, shown string, err error) {
	raw = caddy.NewReplacer().ReplaceAll(configured, "")
	if raw == "" {
		return "", "", fmt.Errorf("%s: url is required", what)
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // url.Error repeats the URL, password and all
		}
		return "", "", fmt.Errorf("%s: invalid url: %w", what, err)
	}
	switch u.Scheme {
	case "redis", "rediss", "unix":
	default:
		return "", "", fmt.Errorf("%s: invalid url: the scheme must be redis, rediss or unix, not %q", what, u.Scheme)
	}
	return raw, u.Redacted(), nil
}

// checkServerURL is serverURL's rule for the Caddyfile: a URL without
// placeholders is judged as written; one with placeholders when the config
// loads, where they are expanded.
func checkServerURL(what string) func(string) error {
	return func(v string) error {
		if strings.Contains(v, "{") {
			return nil
		}
		_, _, err := serverURL(what, v)
		return err
	}
}

// ledgerModule is what each ledger module of this file is.
type ledgerModule interface {
	caddy.Provisioner
	caddy.CleanerUpper
	caddyfile.Unmarshaler
	LedgerModule
}

// Interface guards
var (
	_ ledgerModule = (*MemoryLedger)(nil)
	_ ledgerModule = (*FileLedger)(nil)
	_ ledgerModule = (*PostgresLedger)(nil)
	_ ledgerModule = (*RedisLedger)(nil)
)
