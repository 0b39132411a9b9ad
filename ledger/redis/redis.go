package redis

import (
	"cmp"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/internal/pubsub"
	"github.com/onejob/onejob/ledger/notify"
)

// DefaultPrefix starts every key of a ledger whose Options.Prefix is empty.
const DefaultPrefix = "onejob:"

// Options configure a Ledger.
type Options struct {
	// Prefix starts every key and the pub/sub channel; default "onejob:".
	// Gateways that share a ledger use the same prefix. On Redis Cluster
	// it must not contain braces.
	Prefix string
	// Replicas, when more than 0, is how many replicas must acknowledge a
	// transition's writes before it answers: each script that writes is
	// followed by WAIT on the master that ran it, and a transition fewer
	// replicas acknowledged within ReplicaTimeout fails (it ran on the
	// master, but a failover could lose it). 0 acknowledges what the
	// master alone has, as Redis replicates asynchronously.
	Replicas int
	// ReplicaTimeout bounds the wait for Replicas; DefaultReplicaTimeout
	// when 0. It must be shorter than the client's read timeout (the URL's
	// read_timeout, 5s when the URL gives none).
	ReplicaTimeout time.Duration

	// buckets, when not 0, lays a single server's keys out in that many
	// buckets, as on a cluster (tests run the bucketed layout on miniredis
	// with it).
	buckets int
	// dial, when not nil, opens the connections (tests put a proxy in
	// between).
	dial dialer
}

// Ledger is a Redis ledger.
type Ledger struct {
	client redis.UniversalClient
	// cluster is client on Redis Cluster, else nil.
	cluster *redis.ClusterClient
	prefix  string
	// buckets are the key prefixes of the ledger's buckets (layout.go):
	// one on a single server, clusterBuckets on a cluster.
	buckets []string
	// ids remembers the buckets of the jobs this process saw.
	ids     idCache
	scripts *scriptSet
	listen  *notify.Subscriber
	// replays holds completed jobs read lately.
	replays *near.Cache
	// counts is the walk of Counts (counts.go).
	counts countWalk
	// replicas and replicaTimeout are Options.Replicas and ReplicaTimeout
	// (ack.go).
	replicas       int
	replicaTimeout time.Duration
	// startErr is why the scripts could not be loaded at Open, the server
	// being out of reach then (see StartError).
	startErr error
}

// Open connects to the Redis server at url (redis://, rediss:// or
// unix://, as redis.ParseURL reads it), or to a Redis Cluster: when url
// names more nodes with addr= parameters (as redis.ParseClusterURL reads
// it), or when the one server it names says it is part of a cluster (INFO
// cluster). It loads the ledger's scripts and returns the ledger. It does
// not judge the server's durability settings: call CheckDurability for
// that.
func Open(ctx context.Context, url string, opts Options) (*Ledger, error) {
	prefix := opts.Prefix
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if err := CheckReplicas(opts.Replicas, opts.ReplicaTimeout); err != nil {
		return nil, err
	}
	wait := cmp.Or(opts.ReplicaTimeout, DefaultReplicaTimeout)
	client, cluster, err := connect(ctx, url, opts.dial)
	if err != nil {
		return nil, fmt.Errorf("redis ledger: %w", err)
	}
	if rt := readTimeout(client); opts.Replicas > 0 && rt > 0 && wait >= rt {
		client.Close()
		return nil, fmt.Errorf("redis ledger: replica timeout %v is not shorter than the client's read timeout %v (read_timeout in the URL): "+
			"WAIT's answer would be taken for a lost reply", wait, rt)
	}
	n, publish := opts.buckets, "PUBLISH"
	if cluster != nil {
		if strings.ContainsAny(prefix, "{}") {
			client.Close()
			return nil, fmt.Errorf("redis ledger: the prefix %q has a brace: on Redis Cluster the ledger's hash tags follow it", prefix)
		}
		n, publish = clusterBuckets, "SPUBLISH"
	}
	l := &Ledger{client: client, cluster: cluster, prefix: prefix, buckets: newBuckets(prefix, n),
		scripts: scriptsFor(publish), replays: near.New(10000, 64<<20), replicas: opts.Replicas, replicaTimeout: wait}
	if err := l.preload(ctx); err != nil {
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
	channels := make([]string, len(l.buckets))
	for i, bp := range l.buckets {
		channels[i] = channelOf(bp)
	}
	if cluster != nil {
		l.listen = notify.NewSubscriber(pubsub.Sharded(cluster, channels), nil)
	} else {
		l.listen = notify.NewSubscriber(pubsub.Session(client, channels...), nil)
	}
	l.replays.Follow(l.listen)
	return l, nil
}

// readTimeout returns the read timeout of client's connections, 0 for none.
func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
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

// Client returns the ledger's Redis client: a *redis.Client on a single
// server, a *redis.ClusterClient on a cluster.
func (l *Ledger) Client() redis.UniversalClient { return l.client }

// Prefix returns the prefix of the ledger's keys.
func (l *Ledger) Prefix() string { return l.prefix }

// Close stops the pub/sub subscription and closes the client.
func (l *Ledger) Close() error {
	l.listen.Close()
	return l.client.Close()
}

// identity names (owner, key) in keys and index members.
func identity(owner, key []byte) string {
	return hex.EncodeToString(owner) + ":" + hex.EncodeToString(key)
}

// validID reports whether id can name a job; other ids are simply not found.
func validID(id string) bool {
	_, err := uuid.Parse(id)
	return err == nil
}
