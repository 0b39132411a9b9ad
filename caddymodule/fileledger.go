package caddymodule

import (
	"fmt"
	"path/filepath"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file"
)

// FileLedger keeps jobs in a local directory (a log of changes with one
// fdatasync per group of writes, and snapshots): durable across restarts
// with no server to run, for one gateway on one machine. The default.
type FileLedger struct {
	// The ledger's directory (a bbolt file of the earlier releases there
	// is migrated at start). Default: onejob/ledger.db in Caddy's data
	// directory.
	Path string `json:"path,omitempty"`

	LedgerHolder
}

// CaddyModule returns the Caddy module information.
func (FileLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.file",
		New: func() caddy.Module { return new(FileLedger) },
	}
}

// Provision opens the ledger, or shares it with the config being
// replaced: one process holds a ledger directory, so reloads reuse the
// open ledger.
func (f *FileLedger) Provision(ctx caddy.Context) error {
	path := caddy.NewReplacer().ReplaceAll(f.Path, "")
	if path == "" {
		path = filepath.Join(caddy.AppDataDir(), "onejob", "ledger.db")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("file ledger: %w", err)
	}
	warnOneProc(ctx.Logger())
	return f.Open(ctx, "file\x00"+abs, func() (ledger.Ledger, error) {
		return file.Open(abs, file.Options{Timeout: 10 * time.Second})
	})
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger file [<path>] {
//		path <path>
//	}
func (f *FileLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "ledger file [<path>]", setting{name: "path", dst: &f.Path})
}
