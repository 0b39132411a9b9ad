// Package pubsub is the Redis side of notify.Subscriber: one session on
// Redis pub/sub channels, shared by the Redis ledger's waiters and the
// replay cache's; on Redis Cluster, one sharded session per master.
package pubsub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger/notify"
)

// idle is how long a subscription may be silent before it is pinged; a
// ping left unanswered as long again means the connection is dead.
const idle = 15 * time.Second

// Session returns a notify.Session on channels: it subscribes on a
// connection of its own, is confirmed once Redis confirmed every channel,
// and wakes the job whose id each message carries.
func Session(client redis.UniversalClient, channels ...string) notify.Session {
	return func(ctx context.Context, ready func(), wake func(string)) error {
		return receive(ctx, client.Subscribe(ctx, channels...), "subscribe", channels, ready, wake)
	}
}

// Sharded returns a notify.Session on the shard channels of a cluster
// (SSUBSCRIBE): one connection to each master, subscribed to the channels
// whose slots it serves, one SSUBSCRIBE per channel (a command may not span
// slots). It is confirmed once every master confirmed its channels, and
// ends when any connection fails or a master gives up a channel's slot (a
// slot migrated or a failover: the server unsubscribes it), so that the
// next session subscribes where the slots are now.
func Sharded(client *redis.ClusterClient, channels []string) notify.Session {
	return func(ctx context.Context, ready func(), wake func(string)) error {
		// The previous session may have ended because slots moved: have
		// the client read the cluster's slots again (a redirect, if it is
		// not done yet, ends this session too, and the next one retries).
		client.ReloadState(ctx)
		groups := map[string][]string{}
		nodes := map[string]*redis.Client{}
		for _, ch := range channels {
			n, err := client.MasterForKey(ctx, ch)
			if err != nil {
				return err
			}
			addr := n.Options().Addr
			groups[addr] = append(groups[addr], ch)
			nodes[addr] = n
		}
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		errs := make(chan error, len(groups))
		confirmed := make(chan string, len(groups))
		for addr, chans := range groups {
			go func() {
				ps := nodes[addr].SSubscribe(ctx, chans[0])
				for _, ch := range chans[1:] {
					if err := ps.SSubscribe(ctx, ch); err != nil {
						ps.Close()
						errs <- err
						return
					}
				}
				err := receive(ctx, ps, "ssubscribe", chans, func() { confirmed <- addr }, wake)
				errs <- fmt.Errorf("%s: %w", addr, err)
			}()
		}
		waiting := len(groups)
		var err error
		for err == nil {
			select {
			case addr := <-confirmed:
				if err = serves(ctx, nodes[addr], groups[addr][0]); err == nil {
					if waiting--; waiting == 0 {
						ready()
					}
				}
			case err = <-errs:
			}
		}
		cancel()
		for range len(groups) - 1 {
			<-errs
		}
		return err
	}
}

// serves checks, once a node confirmed a shard subscription, that it is
// the master of the channel's slot. A replica accepts the subscription
// too, but hears a publication only if its master knows it as a replica
// by then, which a master that just took over may not: a client whose slot
// map predates a failover would subscribe on the old master and miss
// completions. A master that gives up the slot later unsubscribes the
// channel, which ends the session; a replica is told by the redirect its
// keys get (the ledger's cluster client never sends READONLY).
func serves(ctx context.Context, node *redis.Client, channel string) error {
	err := node.Exists(ctx, channel).Err()
	if err != nil && !redis.HasErrorPrefix(err, "ASK") {
		return fmt.Errorf("%s does not serve %s as master: %w", node.Options().Addr, channel, err)
	}
	return nil
}

// errUnsubscribed ends a session whose server dropped a channel.
var errUnsubscribed = errors.New("the server unsubscribed a channel")

// receive reads ps until it fails or ctx ends: it calls ready once every
// channel is confirmed (kind "subscribe" or "ssubscribe"), and wake with
// each message's payload.
func receive(ctx context.Context, ps *redis.PubSub, kind string, channels []string, ready func(), wake func(string)) error {
	defer ps.Close()
	// Closing the subscription is what interrupts a blocked receive.
	defer context.AfterFunc(ctx, func() { ps.Close() })()
	want := make(map[string]bool, len(channels))
	pending := make(map[string]bool, len(channels))
	for _, ch := range channels {
		want[ch], pending[ch] = true, true
	}
	pinged, confirmed := false, false
	for {
		msg, err := ps.ReceiveTimeout(ctx, idle)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() && !pinged {
				pinged = true
				pctx, cancel := context.WithTimeout(ctx, idle)
				err = ps.Ping(pctx)
				cancel()
				if err == nil {
					continue
				}
			}
			return err
		}
		pinged = false
		switch m := msg.(type) {
		case *redis.Subscription:
			switch {
			case m.Kind == kind && pending[m.Channel]:
				delete(pending, m.Channel)
				if len(pending) == 0 && !confirmed {
					confirmed = true
					ready()
				}
			case (m.Kind == "unsubscribe" || m.Kind == "sunsubscribe") && want[m.Channel]:
				return fmt.Errorf("%w: %s", errUnsubscribed, m.Channel)
			}
		case *redis.Message:
			if want[m.Channel] {
				wake(m.Payload)
			}
		}
	}
}
