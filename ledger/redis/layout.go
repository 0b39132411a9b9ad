package redis

import (
	"context"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
)

// A ledger's keys live in buckets (see the keyspace in doc.go). On a single
// server there is one bucket whose key prefix is the ledger's prefix: the
// keyspace of every earlier release, unchanged. On Redis Cluster there are
// clusterBuckets buckets, each with its own hash tag, so that each bucket
// is one slot: a job's keys, its identity key and the indexes that name it
// all sit in the bucket of its identity, and every script touches one slot.

// clusterBuckets is the number of buckets of a ledger on Redis Cluster. It
// is part of the stored layout: gateways sharing a ledger must agree on it.
const clusterBuckets = 64

// clusterSlots is the number of hash slots of Redis Cluster.
const clusterSlots = 16384

var (
	tagsOnce sync.Once
	tags     []string
)

// bucketTags returns the hash tag of each cluster bucket: the first of the
// strings "j0", "j1", ... whose slot is the middle slot of the bucket's
// share of the slot space (bucket i of n owns slots i*16384/n up to the
// next bucket's). Spread this way, the buckets divide evenly among masters
// that own contiguous ranges of slots, as redis-cli --cluster create and
// rebalance assign them. The tags are part of the stored layout.
func bucketTags() []string {
	tagsOnce.Do(func() {
		width := clusterSlots / clusterBuckets
		want := make(map[int]int, clusterBuckets) // slot -> bucket
		for i := 0; i < clusterBuckets; i++ {
			want[i*width+width/2] = i
		}
		tags = make([]string, clusterBuckets)
		for k := 0; len(want) > 0; k++ {
			t := "j" + strconv.Itoa(k)
			if i, ok := want[slot(t)]; ok {
				tags[i] = t
				delete(want, slot(t))
			}
		}
	})
	return tags
}

// slot is the cluster hash slot of key, as Redis computes it: CRC16
// (XMODEM) of the key's hash tag, or of the whole key if it has none,
// modulo 16384.
func slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % clusterSlots
}

// newBuckets returns the key prefix of each bucket: the ledger's prefix
// alone for the single-server keyspace (n = 0), else the prefix followed by
// each bucket's hash tag in braces.
func newBuckets(prefix string, n int) []string {
	if n == 0 {
		return []string{prefix}
	}
	t := bucketTags()
	b := make([]string, n)
	for i := range b {
		b[i] = prefix + "{" + t[i] + "}"
	}
	return b
}

// bucketOf returns the bucket of an identity.
func (l *Ledger) bucketOf(ident string) int {
	if len(l.buckets) == 1 {
		return 0
	}
	return int(crc32.ChecksumIEEE([]byte(ident)) % uint32(len(l.buckets)))
}

// where returns the key prefix of the bucket that holds job id: from the
// ids this process saw (every reply that carries a job tells its bucket),
// else by asking each bucket's index whether it names the job, in one
// pipeline (one round trip per node). A job no bucket names does not exist.
func (l *Ledger) where(ctx context.Context, id string) (string, error) {
	if len(l.buckets) == 1 {
		return l.buckets[0], nil
	}
	if b, ok := l.ids.get(id); ok {
		return l.buckets[b], nil
	}
	cmds := make([]*redis.FloatCmd, len(l.buckets))
	_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, bp := range l.buckets {
			cmds[i] = p.ZScore(ctx, idxKey(bp), id)
		}
		return nil
	})
	for i, c := range cmds {
		if c.Err() == nil {
			l.ids.put(id, i)
			return l.buckets[i], nil
		}
		if c.Err() != redis.Nil && err == nil {
			err = c.Err()
		}
	}
	if err != nil && err != redis.Nil {
		// A bucket that did not answer may hold the job.
		return "", fmt.Errorf("redis ledger: find job %s: %w", id, err)
	}
	return "", ledger.ErrNotFound
}

// saw records the bucket of a job a reply carried.
func (l *Ledger) saw(j *ledger.Job) {
	if j != nil && len(l.buckets) > 1 {
		l.ids.put(j.ID, l.bucketOf(identity(j.OwnerHash, j.KeyHash)))
	}
}

// idCache maps job ids to buckets, keeping up to about twice idCacheSize
// of the ids used last: when the current generation is full it becomes the
// old one, and the old one is dropped.
type idCache struct {
	mu       sync.Mutex
	cur, old map[string]int
}

const idCacheSize = 100000

func (c *idCache) get(id string) (int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if b, ok := c.cur[id]; ok {
		return b, true
	}
	b, ok := c.old[id]
	if ok {
		c.putLocked(id, b)
	}
	return b, ok
}

func (c *idCache) put(id string, b int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(id, b)
}

func (c *idCache) putLocked(id string, b int) {
	if c.cur == nil || len(c.cur) >= idCacheSize {
		c.old, c.cur = c.cur, make(map[string]int)
	}
	c.cur[id] = b
}

// The keys of a bucket, whose key prefix is bp (see doc.go).
func jobKey(bp, id string) string      { return bp + "j:" + id }
func attemptsKey(bp, id string) string { return bp + "a:" + id }
func identKey(bp, ident string) string { return bp + "k:" + ident }
func idxKey(bp string) string          { return bp + "idx" }
func leasesKey(bp string) string       { return bp + "leases" }
func expiryKey(bp string) string       { return bp + "expiry" }
func channelOf(bp string) string       { return bp + "jobs" }
func ackKey(bp string) string          { return bp + "ack" }

// identBucket returns the key prefix of the bucket of an identity.
func (l *Ledger) identBucket(ident string) string { return l.buckets[l.bucketOf(ident)] }
