package caddymodule

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	redisledger "github.com/onejob/onejob/ledger/redis"
)

// RedisLedger keeps jobs in Redis or Redis Cluster, shared by many gateway
// instances. It is only as durable as the server's persistence, eviction
// and replication settings: the gateway warns at start when they cannot
// keep the no-duplicate promise.
type RedisLedger struct {
	// The URL of the Redis server (redis:// or rediss://), or of a Redis
	// Cluster: one node's URL, or the cluster URL form
	// redis://host1:port?addr=host2:port&addr=host3:port. Placeholders
	// such as {env.REDIS_URL} are expanded. Logs and errors show it
	// without its password.
	URL string `json:"url"`
	// The start of every key; default "onejob:". Gateways that share a
	// ledger use the same prefix. On a cluster it must not contain braces.
	Prefix string `json:"prefix,omitempty"`
	// When set, how many replicas must hold each write of a transition
	// before the gateway acts on it: each script is followed by WAIT on
	// the job's master, and a transition fewer replicas acknowledged in
	// time fails (a reservation then answers 503 and is never forwarded).
	// Without it a reservation the master acknowledged can be lost when
	// the master fails before replicating it. See docs/ledgers.md for what
	// each setting promises.
	Replicas int `json:"replicas,omitempty"`
	// Bounds the wait for replicas; default 1s. It must be shorter than
	// the client's read timeout (the url's read_timeout, 5s when the url
	// gives none).
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
