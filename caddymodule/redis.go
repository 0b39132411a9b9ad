package caddymodule

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/cache"
	redisledger "github.com/onejob/onejob/ledger/redis"
)

func init() {
	caddy.RegisterModule(RedisLedger{})
}

// RedisLedger keeps jobs in Redis, shared by many gateway instances. It is
// only as durable as the server's persistence, eviction and replication
// settings: the gateway warns at start when they cannot keep the
// no-duplicate promise.
type RedisLedger struct {
	// URL of the Redis server (redis:// or rediss://). Placeholders such
	// as {env.REDIS_URL} are expanded.
	URL string `json:"url"`
	// Prefix starts every key; default "onejob:". Gateways that share a
	// ledger use the same prefix.
	Prefix string `json:"prefix,omitempty"`

	holder
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
	url := caddy.NewReplacer().ReplaceAll(r.URL, "")
	if url == "" {
		return fmt.Errorf("redis ledger: url is required")
	}
	log := ctx.Logger()
	return r.open("redis\x00"+url+"\x00"+r.Prefix, func() (ledger.Ledger, error) {
		octx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		l, err := redisledger.Open(octx, url, redisledger.Options{Prefix: r.Prefix})
		if err != nil {
			return nil, err
		}
		for _, w := range l.CheckDurability(octx) {
			log.Warn("redis ledger cannot keep the no-duplicate promise: "+w, zap.String("url", redactURL(url)))
		}
		return l, nil
	}, log)
}

// CacheConfig puts a Redis replay cache in front of the ledger.
type CacheConfig struct {
	// Backend is "redis".
	Backend string `json:"backend"`
	// URL of the Redis server.
	URL string `json:"url"`
	// Prefix starts every cache key; default "onejob:cache:".
	Prefix string `json:"prefix,omitempty"`
}

// caches holds the open replay caches of this process, by ledger and
// Redis server. They are kept apart from ledgers: the admin API lists the
// ledgers, and a cache is no second source of jobs.
var caches = caddy.NewUsagePool()

// cached is one open cache in the pool.
type cached struct {
	*cache.Ledger
}

// Destruct closes the cache's pub/sub and its Redis client; the ledger
// behind it belongs to its own pool entry.
func (c cached) Destruct() error { return c.Ledger.Close() }

// cacheHolder is a handler's hold on a cache and the ledger behind it.
type cacheHolder struct {
	key   string
	truth LedgerModule
	c     *cache.Ledger
}

func openCache(ctx caddy.Context, cfg *CacheConfig, truth LedgerModule, secret []byte) (*cacheHolder, error) {
	if cfg.Backend != "redis" {
		return nil, fmt.Errorf("cache: unknown backend %q (want redis)", cfg.Backend)
	}
	url := caddy.NewReplacer().ReplaceAll(cfg.URL, "")
	if url == "" {
		return nil, fmt.Errorf("cache redis: url is required")
	}
	th, ok := truth.(interface{ poolKey() string })
	if !ok {
		return nil, fmt.Errorf("cache redis: this ledger cannot have a cache")
	}
	key := th.poolKey() + "\x00cache\x00" + url + "\x00" + cfg.Prefix + "\x00" + string(secret)
	log := ctx.Logger()
	v, _, err := caches.LoadOrNew(key, func() (caddy.Destructor, error) {
		rdb, err := cache.NewClient(url)
		if err != nil {
			return nil, err
		}
		return cached{cache.New(truth.Ledger(), rdb, cache.Options{Prefix: cfg.Prefix, Logger: log, Secret: secret, CloseClient: true})}, nil
	})
	if err != nil {
		return nil, err
	}
	return &cacheHolder{key: key, truth: truth, c: v.(cached).Ledger}, nil
}

// hold keeps the cache and its ledger open until release.
func (h *cacheHolder) hold() func() {
	releaseTruth, releaseCache := h.truth.Hold(), holdPooled(caches, h.key)
	return func() {
		releaseCache()
		releaseTruth()
	}
}

func (h *cacheHolder) cleanup() {
	caches.Delete(h.key)
}

// redactURL drops the user information of a URL for logs.
func redactURL(u string) string {
	i, j := strings.Index(u, "://"), strings.LastIndex(u, "@")
	if i >= 0 && j > i {
		return u[:i+3] + "…" + u[j:]
	}
	return u
}

// Interface guards
var (
	_ caddy.Provisioner  = (*RedisLedger)(nil)
	_ caddy.CleanerUpper = (*RedisLedger)(nil)
	_ LedgerModule       = (*RedisLedger)(nil)
	_ caddy.Destructor   = cached{}
)
