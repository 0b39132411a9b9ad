package redis

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/pubsub"
)

// DefaultPrefix starts every key of a ledger whose Options.Prefix is empty.
const DefaultPrefix = "onejob:"

// Options configure a Ledger.
type Options struct {
	// Prefix starts every key and the pub/sub channel; default "onejob:".
	// Gateways that share a ledger use the same prefix.
	Prefix string
}

// Ledger is a Redis ledger.
type Ledger struct {
	client *redis.Client
	prefix string
	listen *ledger.Subscriber
	// replays holds completed jobs read lately.
	replays *near.Cache
	// counts is the walk of Counts (counts.go).
	counts countWalk
	// startErr is why the scripts could not be loaded at Open, the server
	// being out of reach then (see StartError).
	startErr error
}

// Open connects to the Redis server at url (redis://, rediss:// or
// unix://, as redis.ParseURL reads it), loads the ledger's scripts, and
// returns the ledger. It does not judge the server's durability settings:
// call CheckDurability for that.
func Open(ctx context.Context, url string, opts Options) (*Ledger, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	o, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis ledger: %w", err)
	}
	// Never re-send a command on its own: go-redis re-sends after a read
	// error (EOF, timeout) by default, and a script whose reply was lost
	// would then run twice. The caller repeats a transition instead, as it
	// is idempotent by the ids it carries. The pub/sub listener uses this
	// client too, and resubscribes on its own after a broken connection.
	o.MaxRetries = -1
	client := redis.NewClient(o)
	l := &Ledger{client: client, prefix: prefix, replays: near.New(10000, 64<<20)}
	if err := preload(ctx, client); err != nil {
		// A server that answered with an error (a password, a digest) is
		// a mistake to refuse now. One out of reach is not: a gateway
		// restarted during a network blip must come up, answer 503 while
		// the ledger cannot be reached, and work once it can (a script
		// the server lacks is loaded by its first run, EVALSHA then EVAL).
		var reply redis.Error
		if errors.As(err, &reply) || !unreachable(err) {
			client.Close()
			return nil, fmt.Errorf("redis ledger: %w", err)
		}
		l.startErr = fmt.Errorf("redis ledger: server out of reach at start (%w): calls fail until it answers", err)
	}
	l.listen = ledger.NewSubscriber(pubsub.Session(client, l.channel()), nil)
	return l, nil
}

// StartError says why Open could not load the scripts, the server being out
// of reach then; nil when it could. The ledger works once the server
// answers.
func (l *Ledger) StartError() error { return l.startErr }

// unreachable reports whether err says the server could not be reached or
// the connection broke, rather than that it answered.
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// Client returns the ledger's Redis client.
func (l *Ledger) Client() *redis.Client { return l.client }

// Prefix returns the prefix of the ledger's keys.
func (l *Ledger) Prefix() string { return l.prefix }

// Close stops the pub/sub subscription and closes the client.
func (l *Ledger) Close() error {
	l.listen.Close()
	return l.client.Close()
}

func (l *Ledger) jobKey(id string) string      { return l.prefix + "j:" + id }
func (l *Ledger) attemptsKey(id string) string { return l.prefix + "a:" + id }
func (l *Ledger) identKey(ident string) string { return l.prefix + "k:" + ident }
func (l *Ledger) idxKey() string               { return l.prefix + "idx" }
func (l *Ledger) leasesKey() string            { return l.prefix + "leases" }
func (l *Ledger) expiryKey() string            { return l.prefix + "expiry" }
func (l *Ledger) channel() string              { return l.prefix + "jobs" }

// identity names (owner, key) in keys and index members.
func identity(owner, key []byte) string {
	return hex.EncodeToString(owner) + ":" + hex.EncodeToString(key)
}

// validID reports whether id can name a job; other ids are simply not found.
func validID(id string) bool {
	_, err := uuid.Parse(id)
	return err == nil
}
