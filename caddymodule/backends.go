package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/ledger/postgres"
	redisledger "github.com/onejob/onejob/ledger/redis"
)

func init() {
	caddy.RegisterModule(MemoryLedger{})
	caddy.RegisterModule(FileLedger{})
	caddy.RegisterModule(PostgresLedger{})
	caddy.RegisterModule(RedisLedger{})
}

// openTimeout bounds connecting to a ledger's server and migrating it.
const openTimeout = 30 * time.Second

// MemoryLedger keeps jobs in process memory: for tests and demos. Jobs
// survive config reloads but not a restart.
type MemoryLedger struct {
	LedgerHolder
}

// CaddyModule returns the Caddy module information.
func (MemoryLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.memory",
		New: func() caddy.Module { return new(MemoryLedger) },
	}
}

// Provision opens (or shares) the process's memory ledger.
func (m *MemoryLedger) Provision(ctx caddy.Context) error {
	ctx.Logger().Warn("idempotency ledger is in memory: nothing survives a restart")
	return m.Open(ctx, "memory", func() (ledger.Ledger, error) { return memory.New(), nil })
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger memory
func (m *MemoryLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "ledger memory")
}

// FileLedger keeps jobs in a local directory (a log of changes with one
// fdatasync per group of writes, and snapshots): durable across restarts
// with no server to run, for one gateway on one machine. The default.
type FileLedger struct {
	// Path of the ledger's directory (a bbolt file of the earlier
	// releases there is migrated at start). Default: onejob/ledger.db in
	// Caddy's data directory.
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
	flushProcs(ctx.Logger())
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

// PostgresLedger keeps jobs in PostgreSQL, shared by many gateway instances.
type PostgresLedger struct {
	// DSN is the PostgreSQL connection string (URL or key=value form).
	// Placeholders such as {env.DATABASE_URL} are expanded. Logs and
	// errors show it without its password.
	DSN string `json:"dsn"`
	// Schema holds the ledger's tables, created or migrated at start;
	// default "onejob".
	Schema string `json:"schema,omitempty"`

	LedgerHolder
}

// CaddyModule returns the Caddy module information.
func (PostgresLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.postgres",
		New: func() caddy.Module { return new(PostgresLedger) },
	}
}

// Provision connects (or shares the connection pool) and migrates the schema.
func (p *PostgresLedger) Provision(ctx caddy.Context) error {
	dsn := caddy.NewReplacer().ReplaceAll(p.DSN, "")
	if dsn == "" {
		return errors.New("postgres ledger: dsn is required")
	}
	schema := p.Schema
	if schema == "" {
		schema = postgres.DefaultSchema
	}
	return p.Open(ctx, "postgres\x00"+dsn+"\x00"+schema, dial(postgres.Redacted(dsn), func(octx context.Context) (ledger.Ledger, error) {
		return postgres.Open(octx, dsn, postgres.Options{Schema: schema})
	}))
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger postgres [<dsn> [<schema>]] {
//		dsn <dsn>
//		schema <schema>
//	}
//
// The DSN is required, on the line or in the block.
func (p *PostgresLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "ledger postgres <dsn> [<schema>]",
		setting{name: "dsn", dst: &p.DSN, required: true}, setting{name: "schema", dst: &p.Schema})
}

// RedisLedger keeps jobs in Redis or Redis Cluster, shared by many gateway
// instances. It is only as durable as the server's persistence, eviction
// and replication settings: the gateway warns at start when they cannot
// keep the no-duplicate promise.
type RedisLedger struct {
	// URL of the Redis server (redis:// or rediss://), or of a Redis
	// Cluster: one node's URL, or the cluster URL form
	// redis://host1:port?addr=host2:port&addr=host3:port. Placeholders
	// such as {env.REDIS_URL} are expanded. Logs and errors show it
	// without its password.
	URL string `json:"url"`
	// Prefix starts every key; default "onejob:". Gateways that share a
	// ledger use the same prefix. On a cluster it must not contain braces.
	Prefix string `json:"prefix,omitempty"`
	// Replicas, when set, is how many replicas must hold each write of a
	// transition before the gateway acts on it: each script is followed
	// by WAIT on the job's master, and a transition fewer replicas
	// acknowledged in time fails (a reservation then answers 503 and is
	// never forwarded). Without it a reservation the master acknowledged
	// can be lost when the master fails before replicating it. See
	// docs/ledgers.md for what each setting promises.
	Replicas int `json:"replicas,omitempty"`
	// ReplicaTimeout bounds the wait for Replicas; default 1s. It must be
	// shorter than the client's read timeout (the URL's read_timeout, 5s
	// when the URL gives none).
	ReplicaTimeout caddy.Duration `json:"replica_timeout,omitempty"`

	LedgerHolder
}

// CaddyModule returns the Caddy module information.
func (RedisLedger) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.ledgers.redis",
		New: func() caddy.Module { return new(RedisLedger) },
	}
}

// Provision connects (or shares the connection) and checks the server's
// durability settings.
func (r *RedisLedger) Provision(ctx caddy.Context) error {
	raw, shown, err := serverURL("redis ledger", r.URL)
	if err != nil {
		return err
	}
	opts := redisledger.Options{Prefix: r.Prefix, Replicas: r.Replicas, ReplicaTimeout: time.Duration(r.ReplicaTimeout)}
	if err := redisledger.CheckReplicas(opts.Replicas, opts.ReplicaTimeout); err != nil {
		return err
	}
	log := ctx.Logger()
	// Routes that wait for different replicas never share a ledger.
	key := fmt.Sprintf("redis\x00%s\x00%s\x00%d\x00%d", raw, r.Prefix, opts.Replicas, opts.ReplicaTimeout)
	return r.Open(ctx, key, dial(shown, func(octx context.Context) (ledger.Ledger, error) {
		l, err := redisledger.Open(octx, raw, opts)
		if err == nil && l.StartError() != nil {
			// It starts anyway: requests get 503 until the server answers.
			log.Warn("redis ledger unreachable at start", zap.String("url", shown), zap.Error(l.StartError()))
		} else if err == nil {
			for _, w := range l.CheckDurability(octx) {
				log.Warn("redis ledger cannot keep the no-duplicate promise: "+w, zap.String("url", shown))
			}
		}
		return l, err
	}))
}

// UnmarshalCaddyfile sets up the ledger from Caddyfile tokens. Syntax:
//
//	ledger redis [<url> [<prefix>]] {
//		url <url>
//		prefix <prefix>
//		replicas <count>
//		replica_timeout <duration>
//	}
//
// The URL is required, on the line or in the block; replicas and
// replica_timeout are given in the block only.
func (r *RedisLedger) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	err := unmarshalSettings(d, "ledger redis <url> [<prefix>]",
		setting{name: "url", dst: &r.URL, required: true, check: checkServerURL("redis ledger")}, setting{name: "prefix", dst: &r.Prefix},
		setting{name: "replicas", named: true, parse: func(d *caddyfile.Dispenser, v string) error {
			n, err := strconv.Atoi(v)
			if err != nil || n <= 0 {
				return d.Errf("replicas: invalid count %q: it must be a whole number more than 0; leave it out for none", v)
			}
			r.Replicas = n
			return nil
		}},
		setting{name: "replica_timeout", named: true, parse: func(d *caddyfile.Dispenser, v string) (err error) {
			r.ReplicaTimeout, err = duration(d, "replica_timeout", []string{v})
			return err
		}})
	if err != nil {
		return err
	}
	if err := redisledger.CheckReplicas(r.Replicas, time.Duration(r.ReplicaTimeout)); err != nil {
		return d.WrapErr(err)
	}
	return nil
}

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
