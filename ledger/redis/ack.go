package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Acknowledgement by replicas (Options.Replicas). Redis replicates
// asynchronously: a write the master acknowledged can be missing from the
// replica promoted when the master fails. With Replicas set, a script that
// writes is followed, on the same connection and in the same round trip,
// by a write of the bucket's ack key and WAIT: the transition answers only
// once that many replicas hold everything the master had by then, else it
// fails (the gateway fails closed). WAIT has no key and counts the
// replicas that acknowledged the connection's last write; so it must go
// to the node that ran the script, on its connection, and the ack key's
// write makes that last write one that follows every earlier write of the
// master (this call's, or those of the call a repeat answers for, or
// another gateway's that the script read), whether or not the script
// itself wrote anything.
//
// On a cluster the script goes to the master of its keys' slot through
// that node's client: the cluster client would send a keyless WAIT to a
// master of its choosing (or, by WAIT's command tips, to every master). A
// MOVED or ASK is followed here, as the cluster client would follow it: the
// node that refused the script did not run it.

// DefaultReplicaTimeout is how long a write waits for its replicas when
// Options.ReplicaTimeout is 0.
const DefaultReplicaTimeout = time.Second

// ErrReplicas is in the error of a transition that the master ran but
// fewer replicas than Options.Replicas acknowledged in time: it happened,
// but a failover could lose it.
var ErrReplicas = errors.New("not acknowledged by enough replicas")

// CheckReplicas is the rule of Options.Replicas and ReplicaTimeout that
// does not depend on the server (Open also holds the timeout to the
// client's read timeout): a count not negative, a timeout of 0 (the
// default) or of 1ms or more (WAIT counts milliseconds, and WAIT 0 would
// wait for ever), and a timeout only with a count.
func CheckReplicas(replicas int, timeout time.Duration) error {
	switch {
	case replicas < 0:
		return fmt.Errorf("redis ledger: replicas must not be negative, not %d", replicas)
	case timeout < 0 || timeout > 0 && timeout < time.Millisecond:
		return fmt.Errorf("redis ledger: replica timeout must be 1ms or more, not %v", timeout)
	case timeout > 0 && replicas == 0:
		return fmt.Errorf("redis ledger: a replica timeout (%v) has no meaning without replicas", timeout)
	}
	return nil
}

// evalAcked runs a script that writes, as eval does, and then waits for
// Options.Replicas replicas to acknowledge it. The script is sent once
// (never again after a network error); a shortfall of replicas is an
// error, not a sign that it did not run.
func (l *Ledger) evalAcked(ctx context.Context, s script, keys []string, args ...any) *redis.Cmd {
	if l.replicas == 0 {
		return l.eval(ctx, s, keys, args...)
	}
	mark := ackKey(l.bucketOfKey(keys[0]))
	name, body := "evalsha", s.Hash()
	var (
		node   *redis.Client // the job's master, on a cluster
		asking bool
		err    error
	)
	redirects := 0
	if l.cluster != nil {
		redirects = l.cluster.Options().MaxRedirects
		if node, err = l.cluster.MasterForKey(ctx, keys[0]); err != nil {
			return errCmd(ctx, err)
		}
	}
	for {
		var target redis.Cmdable = l.client
		if node != nil {
			target = node
		}
		c, w := l.sendAcked(ctx, target, asking, name, body, keys, args, mark)
		asking = false
		err := c.Err()
		if redis.HasErrorPrefix(err, "NOSCRIPT") && name == "evalsha" {
			name, body = "eval", s.src
			continue
		}
		if l.cluster != nil && err != nil {
			moved, ask, addr := isRedirect(err)
			switch {
			case (moved || ask || isReadOnly(err)) && redirects > 0:
				redirects--
				if node, err = l.redirect(ctx, keys[0], ask, addr); err != nil {
					return errCmd(ctx, err)
				}
				asking = ask
				continue
			case !isReplyError(err):
				// The node may be gone (a failover): the next call
				// asks the cluster where the slot is.
				l.cluster.ReloadState(ctx)
			}
		}
		if err != nil {
			return c
		}
		switch n, werr := w.Result(); {
		case werr != nil:
			c.SetErr(fmt.Errorf("the master ran it, but WAIT for %d replica(s) got no answer (%w): a failover could lose it", l.replicas, werr))
		case n < int64(l.replicas):
			c.SetErr(fmt.Errorf("%w: the master ran it, but %d of the %d replica(s) asked for acknowledged it within %v: a failover could lose it",
				ErrReplicas, n, l.replicas, l.replicaTimeout))
		}
		return c
	}
}

// sendAcked sends, in one pipeline on one connection of target, the
// script (preceded by ASKING after an ASK), the write of the ack key and
// WAIT. The script goes out as an onceCmd: a pipeline that holds one is
// never re-sent.
func (l *Ledger) sendAcked(ctx context.Context, target redis.Cmdable, asking bool, name, body string, keys []string, args []any, mark string) (*redis.Cmd, *redis.IntCmd) {
	c := scriptCmd(ctx, name, body, keys, args)
	// A pipeline reads WAIT's answer within the client's read timeout,
	// which Open keeps longer than replicaTimeout.
	w := redis.NewIntCmd(ctx, "wait", l.replicas, l.replicaTimeout.Milliseconds())
	p := target.Pipeline()
	if asking {
		_ = p.Process(ctx, redis.NewCmd(ctx, "asking"))
	}
	_ = p.Process(ctx, onceCmd{c})
	if asking {
		_ = p.Process(ctx, redis.NewCmd(ctx, "asking")) // ASKING holds for one command
	}
	set := p.Set(ctx, mark, "1", 0)
	_ = p.Process(ctx, w)
	_, _ = p.Exec(ctx)
	if err := set.Err(); err != nil && c.Err() == nil && w.Err() == nil {
		// WAIT would count the replicas of an earlier write only.
		w.SetErr(fmt.Errorf("the write of %s failed: %w", mark, err))
	}
	return c, w
}

// redirect returns the client of the master a MOVED or ASK named (addr),
// or, after a MOVED or a refusal by a replica, of the slot's master once
// the cluster's layout is read again.
func (l *Ledger) redirect(ctx context.Context, key string, ask bool, addr string) (*redis.Client, error) {
	ch := make(chan *redis.Client, 1)
	// ForEachMaster reads the layout again before it walks the masters.
	err := l.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		if addr != "" && c.Options().Addr == addr {
			ch <- c
		}
		return nil
	})
	select {
	case c := <-ch:
		return c, nil
	default:
	}
	if !ask {
		return l.cluster.MasterForKey(ctx, key)
	}
	if err == nil {
		err = fmt.Errorf("asked to try %s, which is no master the cluster lists", addr)
	}
	return nil, err
}

// isRedirect reads a MOVED or ASK error.
func isRedirect(err error) (moved, ask bool, addr string) {
	s := err.Error()
	switch {
	case strings.HasPrefix(s, "MOVED "):
		moved = true
	case strings.HasPrefix(s, "ASK "):
		ask = true
	default:
		return false, false, ""
	}
	// MOVED <slot> <addr>
	f := strings.Fields(s)
	if len(f) != 3 {
		return false, false, ""
	}
	return moved, ask, f[2]
}

// isReadOnly reports a write refused by a replica: the node the client
// took for the master is one no more.
func isReadOnly(err error) bool { return redis.HasErrorPrefix(err, "READONLY") }

// isReplyError reports whether err is the server's answer.
func isReplyError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// errCmd is a command that failed before it was sent.
func errCmd(ctx context.Context, err error) *redis.Cmd {
	c := redis.NewCmd(ctx)
	c.SetErr(err)
	return c
}

// bucketOfKey returns the prefix of the bucket key k is in.
func (l *Ledger) bucketOfKey(k string) string {
	for _, bp := range l.buckets {
		if strings.HasPrefix(k, bp) {
			return bp
		}
	}
	return l.buckets[0]
}
