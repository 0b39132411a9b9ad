// Package pubsub is the Redis side of ledger.Subscriber: one session on a
// Redis pub/sub channel, shared by the Redis ledger's waiters and the
// replay cache's.
package pubsub

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
)

// idle is how long a subscription may be silent before it is pinged; a
// ping left unanswered as long again means the connection is dead.
const idle = 15 * time.Second

// Session returns a ledger.Session on channel: it subscribes on a
// connection of its own, is confirmed by Redis's subscribe reply, and wakes
// the job whose id each message carries.
func Session(client *redis.Client, channel string) ledger.Session {
	return func(ctx context.Context, ready func(), wake func(string)) error {
		ps := client.Subscribe(ctx, channel)
		defer ps.Close()
		// Closing the subscription is what interrupts a blocked receive.
		defer context.AfterFunc(ctx, func() { ps.Close() })()
		pinged := false
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
				if m.Kind == "subscribe" && m.Channel == channel {
					ready()
				}
			case *redis.Message:
				if m.Channel == channel {
					wake(m.Payload)
				}
			}
		}
	}
}
