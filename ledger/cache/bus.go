package cache

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger/internal/pubsub"
	"github.com/onejob/onejob/ledger/notify"
)

// bus holds the one Redis subscription of a cache Ledger (a
// notify.Subscriber), to the channel on which every instance publishes the
// ids of jobs that changed.
//
// Publications are hints: a waiter woken by one reads the truth before it
// believes anything, so a lost, late or forged publication costs at most a
// read, and the truth's own Wait keeps running beside it.
type bus struct {
	sub *notify.Subscriber
	// readyWait bounds how long a waiter waits for the subscription to be
	// confirmed before it reads the truth anyway.
	readyWait time.Duration
}

func newBus(rdb *redis.Client, channel string, readyWait time.Duration, log *logThrottle) *bus {
	lost := func(err error) {
		log.warn("redis cache: subscription lost; waiters rely on the ledger's own notifications",
			zap.String("channel", channel), zap.Error(err))
	}
	return &bus{sub: notify.NewSubscriber(pubsub.Session(rdb, channel), lost), readyWait: readyWait}
}

// subscribe registers a waiter for jobID. It returns once the subscription
// is confirmed, or at once while Redis is known to be down, or after
// readyWait: the waiter's reads of the truth then follow its subscription
// whenever Redis allows. The returned channel receives a value when the
// job's id is published and after every resubscription; cancel unregisters
// the waiter.
func (b *bus) subscribe(ctx context.Context, jobID string) (<-chan struct{}, func()) {
	ch, cancel, ready, down, err := b.sub.Register(jobID)
	if err != nil {
		return nil, func() {}
	}
	if !down {
		t := time.NewTimer(b.readyWait)
		select {
		case <-ready:
		case <-t.C:
		case <-ctx.Done():
		case <-b.sub.Closed():
		}
		t.Stop()
	}
	return ch, cancel
}

// close ends the subscription and waits for its loop to stop.
func (b *bus) close() { b.sub.Close() }
