package caddymodule

import (
	"fmt"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/cache"
)

func init() {
	caddy.RegisterModule(RedisCache{})
}

// CacheModule is a replay cache module (namespace idempotency.caches): it
// stands in front of a handler's ledger, which stays the source of truth.
type CacheModule interface {
	// Front opens (or shares) the cache in front of truth and returns
	// what the handler uses as its ledger. secret keys the cache's checks
	// of its entries (the handler's owner_secret). It is called once,
	// after Provision; the module's Cleanup releases what it opened.
	Front(truth LedgerModule, secret []byte) (LedgerModule, error)
}

// RedisCache is a replay cache in Redis: completed answers are replayed
// from it, each verified before it is trusted, and completions are
// published so that waiters on every instance wake at once. Losing it
// loses nothing: every miss and error falls back to the ledger.
type RedisCache struct {
	// The URL of the Redis server (redis:// or rediss://). Placeholders
	// such as {env.REDIS_URL} are expanded. Logs and errors show it
	// without its password.
	URL string `json:"url"`
	// The start of every cache key; default "onejob:cache:".
	Prefix string `json:"prefix,omitempty"`

	url, shown string // expanded, and as logs show it
	logger     *zap.Logger
	key        string // the pool entry Front opened
}

// CaddyModule returns the Caddy module information.
func (RedisCache) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "idempotency.caches.redis",
		New: func() caddy.Module { return new(RedisCache) },
	}
}

// Provision checks the URL; the cache opens when Front puts it in front of
// a ledger.
func (c *RedisCache) Provision(ctx caddy.Context) error {
	var err error
	c.url, c.shown, err = serverURL("redis cache", c.URL)
	c.logger = ctx.Logger()
	return err
}

// UnmarshalCaddyfile sets up the cache from Caddyfile tokens. Syntax:
//
//	cache redis [<url> [<prefix>]] {
//		url <url>
//		prefix <prefix>
//	}
//
// The URL is required, on the line or in the block.
func (c *RedisCache) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	return unmarshalSettings(d, "cache redis <url> [<prefix>]",
		setting{name: "url", dst: &c.URL, required: true, check: checkServerURL("redis cache")}, setting{name: "prefix", dst: &c.Prefix})
}

// caches holds the open replay caches of this process, by ledger, Redis
// server and secret. They are kept apart from ledgers: the admin API lists
// the ledgers, and a cache is no second source of jobs.
var caches = caddy.NewUsagePool()

// cached is one open cache in the pool.
type cached struct {
	*cache.Ledger
}

// Destruct closes the cache's pub/sub and its Redis client; the ledger
// behind it belongs to its own pool entry.
func (c cached) Destruct() error { return c.Ledger.Close() }

// Front opens the cache in front of truth, or shares the one open for the
// same ledger, server, prefix and secret.
func (c *RedisCache) Front(truth LedgerModule, secret []byte) (LedgerModule, error) {
	th, ok := truth.(interface{ poolKey() string })
	if !ok {
		return nil, fmt.Errorf("redis cache: the ledger %T cannot have a cache (it does not embed LedgerHolder)", truth)
	}
	key := th.poolKey() + "\x00cache\x00" + c.url + "\x00" + c.Prefix + "\x00" + string(secret)
	v, _, err := caches.LoadOrNew(key, func() (caddy.Destructor, error) {
		rdb, err := cache.NewClient(c.url)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.shown, err)
		}
		return cached{cache.New(truth.Ledger(), rdb, cache.Options{Prefix: c.Prefix, Logger: c.logger, Secret: secret, CloseClient: true})}, nil
	})
	if err != nil {
		return nil, err
	}
	c.key = key
	return &cacheFront{key: key, truth: truth, c: v.(cached).Ledger}, nil
}

// Cleanup releases this config's hold on the cache.
func (c *RedisCache) Cleanup() error {
	if c.key != "" {
		_, err := caches.Delete(c.key)
		return err
	}
	return nil
}

// cacheFront is a cache with the ledger behind it, as a handler uses them.
type cacheFront struct {
	key   string
	truth LedgerModule
	c     *cache.Ledger
}

// Ledger returns the cache, which reads and writes through to the ledger.
func (f *cacheFront) Ledger() ledger.Ledger { return f.c }

// Hold keeps the cache and its ledger open until release.
func (f *cacheFront) Hold() func() {
	releaseTruth, releaseCache := f.truth.Hold(), holdPooled(caches, f.key)
	return func() {
		releaseCache()
		releaseTruth()
	}
}

// Interface guards
var (
	_ caddy.Provisioner     = (*RedisCache)(nil)
	_ caddy.CleanerUpper    = (*RedisCache)(nil)
	_ caddyfile.Unmarshaler = (*RedisCache)(nil)
	_ CacheModule           = (*RedisCache)(nil)
	_ LedgerModule          = (*cacheFront)(nil)
	_ caddy.Destructor      = cached{}
)
