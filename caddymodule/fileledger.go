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

// FileLedger keeps jobs in a local directory (an embedded Pebble database:
// jobs and answers on disk, a bounded cache of them in memory, one fsync
// per group of writes): durable across restarts with no server to run,
// for one gateway on one machine. The default.
type FileLedger struct {
	// The ledger's directory (a bbolt file of the earlier releases there
	// is migrated at start). Default: onejob/ledger.db in Caddy's data
	// directory.
	Path string `json:"path,omitempty"`

	// The memory the ledger may take, in bytes: its memtables (the writes
	// not yet in a table on disk), the stored jobs read lately, and (an
	// eighth) the answers replayed lately. Default 96 MiB. The ledger's
	// memory does not grow with the number of jobs stored.
	CacheSize int64 `json:"cache_size,omitempty"`

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
	if f.CacheSize < 0 || f.CacheSize > maxSize {
		return fmt.Errorf("file ledger: cache_size %d: want 1 byte to 1TiB, or none for the default", f.CacheSize)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("file ledger: %w", err)
	}
	warnOneProc(ctx.Logger())
	return f.Open(ctx, "file\x00"+abs, func() (ledger.Ledger, error) {
		return file.Open(abs, file.Options{Timeout: 10 * time.Second, CacheSize: f.CacheSize})
	})
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger file [<path>] {
//		path <path>
//		cache_size <size>
//	}
func (f *FileLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "ledger file [<path>]", setting{name: "path", dst: &f.Path},
		setting{name: "cache_size", named: true, parse: func(d *caddyfile.Dispenser, v string) (err error) {
			f.CacheSize, err = size(d, "cache_size", []string{v})
			return err
		}})
}
