package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// connect returns a client for url: a cluster client (and the same client
// as cluster) when url names more nodes with addr= parameters or when the
// server it names runs with cluster-enabled, else a client of that server.
//
// Neither client ever sends a command twice on its own (MaxRetries -1):
// go-redis re-sends after a read error (EOF, timeout) by default, and a
// script whose reply was lost would then run twice. The caller repeats a
// transition instead, as it is idempotent by the ids it carries. The
// cluster client still follows MOVED and ASK (MaxRedirects): a redirected
// command did not run where it was refused. Its other re-sends (after a
// network error, on the same node or another) are closed to scripts by
// sending them as onceCmd.
func connect(ctx context.Context, url string, dial dialer) (redis.UniversalClient, *redis.ClusterClient, error) {
	u, err := neturl.Parse(url)
	if err != nil {
		return nil, nil, errors.New("invalid URL") // url.Error shows the password
	}
	if u.Query().Has("addr") {
		c, err := newCluster(url, dial)
		return c, c, err
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, nil, err
	}
	o.MaxRetries = -1
	if dial != nil {
		o.Dialer = dial
	}
	c := redis.NewClient(o)
	on, err := detect(ctx, c)
	if err != nil {
		c.Close()
		return nil, nil, err
	}
	if !on {
		return c, nil, nil
	}
	c.Close()
	if o.DB != 0 {
		return nil, nil, fmt.Errorf("database %d named on Redis Cluster, which has only database 0", o.DB)
	}
	cc, err := newCluster(url, dial)
	return cc, cc, err
}

// dialer opens a connection, as redis.Options.Dialer does.
type dialer = func(ctx context.Context, network, addr string) (net.Conn, error)

// newCluster returns a cluster client for url, as redis.ParseClusterURL
// reads it.
func newCluster(url string, dial dialer) (*redis.ClusterClient, error) {
	o, err := redis.ParseClusterURL(url)
	if err != nil {
		return nil, err
	}
	o.MaxRetries = -1
	if dial != nil {
		o.Dialer = dial
	}
	o.ReadOnly, o.RouteByLatency, o.RouteRandomly = false, false, false
	return redis.NewClusterClient(o), nil
}

// detectFor is how long Open keeps asking a server out of reach whether it
// is a cluster node: the layout of the keys depends on the answer, so it
// is never guessed, but a gateway restarted during a network blip should
// not stay down for it.
const detectFor = 15 * time.Second

// detect is clusterEnabled, asked again while the server is out of reach,
// for detectFor at most (or until ctx ends).
func detect(ctx context.Context, c *redis.Client) (bool, error) {
	deadline, pause := time.Now().Add(detectFor), 100*time.Millisecond
	for {
		on, err := clusterEnabled(ctx, c)
		if err == nil || !unreachable(err) || time.Now().Add(pause).After(deadline) {
			return on, err
		}
		select {
		case <-ctx.Done():
			return on, err
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// clusterEnabled asks the server whether it runs in cluster mode. A server
// that does not know INFO cluster (an old or a minimal one) is not a
// cluster node.
func clusterEnabled(ctx context.Context, c *redis.Client) (bool, error) {
	info, err := c.Info(ctx, "cluster").Result()
	var re redis.Error
	if errors.As(err, &re) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(info, "\n") {
		if strings.TrimSpace(line) == "cluster_enabled:1" {
			return true, nil
		}
	}
	return false, nil
}

// onceCmd is a command go-redis never sends a second time once it may have
// been written: the cluster client's redirect loop re-sends a command after
// a network error, apart from MaxRetries, unless the command says NoRetry.
// MOVED, ASK and a refusal by a replica (READONLY) are still followed: the
// node that refused did not run it.
type onceCmd struct{ *redis.Cmd }

// NoRetry implements redis.Cmder.
func (onceCmd) NoRetry() bool { return true }

// eval runs a script once: EVALSHA, then EVAL if the server lacks the
// script (NOSCRIPT: it ran nothing), each sent as an onceCmd.
func (l *Ledger) eval(ctx context.Context, s script, keys []string, args ...any) *redis.Cmd {
	c := l.send(ctx, "evalsha", s.Hash(), keys, args)
	if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
		c = l.send(ctx, "eval", s.src, keys, args)
	}
	return c
}

func (l *Ledger) send(ctx context.Context, name, body string, keys []string, args []any) *redis.Cmd {
	c := scriptCmd(ctx, name, body, keys, args)
	_ = l.client.Process(ctx, onceCmd{c})
	return c
}

// scriptCmd is the command that runs a script: name is evalsha (body the
// digest) or eval (body the source).
func scriptCmd(ctx context.Context, name, body string, keys []string, args []any) *redis.Cmd {
	a := make([]any, 0, 3+len(keys)+len(args))
	a = append(a, name, body, len(keys))
	for _, k := range keys {
		a = append(a, k)
	}
	a = append(a, args...)
	return redis.NewCmd(ctx, a...)
}

// preload loads every script into the script cache of the server (or of
// every master of a cluster) in one round trip each, so that each
// transition is then a single EVALSHA. (eval still falls back to EVAL if
// the cache was flushed since, e.g. by a restart or a failover.) It sends
// SCRIPT LOAD itself: redis.Script.Load in a pipeline would record the
// digest before the server answered, as empty.
func (l *Ledger) preload(ctx context.Context) error {
	if l.cluster == nil {
		return loadScripts(ctx, l.client, l.scripts)
	}
	return l.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		if err := loadScripts(ctx, c, l.scripts); err != nil {
			return fmt.Errorf("%s: %w", c.Options().Addr, err)
		}
		return nil
	})
}

func loadScripts(ctx context.Context, c redis.Cmdable, set *scriptSet) error {
	all := set.all()
	cmds := make([]*redis.StringCmd, len(all))
	_, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, s := range all {
			cmds[i] = p.ScriptLoad(ctx, s.src)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for i, s := range all {
		if got := cmds[i].Val(); got != s.Hash() {
			return fmt.Errorf("script digest %s, server says %s", s.Hash(), got)
		}
	}
	return nil
}
