package redis

import (
	"context"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// idRef names a job of the index: its id and its bucket's key prefix.
type idRef struct{ id, bp string }

// walk returns up to n jobs of the index, newest first, whose ids sort
// before the id before ("" for the newest). Every walk of the index goes
// through here: the listing (Jobs) and Counts.
//
// Each bucket has its own index, a sorted set of job ids with score 0 (UUIDv7
// ids sort by creation, so ZREVRANGEBYLEX reads newest first); walk merges
// them. It reads about n/buckets ids of each bucket (all in one pipeline),
// and keeps what is certainly among the newest: the ids down to the
// highest last id of the buckets that may hold more. When that is fewer
// than n it reads again, twice as many of each.
func (l *Ledger) walk(ctx context.Context, before string, n int) ([]idRef, error) {
	upper := "+"
	if before != "" {
		upper = "(" + before
	}
	if n <= 0 {
		return nil, nil
	}
	if len(l.buckets) == 1 {
		bp := l.buckets[0]
		ids, err := l.client.ZRevRangeByLex(ctx, idxKey(bp), &redis.ZRangeBy{Max: upper, Min: "-", Count: int64(n)}).Result()
		if err != nil {
			return nil, err
		}
		refs := make([]idRef, len(ids))
		for i, id := range ids {
			refs[i] = idRef{id, bp}
		}
		return refs, nil
	}
	per := min(n/len(l.buckets)+2, n)
	for {
		cmds := make([]*redis.StringSliceCmd, len(l.buckets))
		_, err := l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, bp := range l.buckets {
				cmds[i] = p.ZRevRangeByLex(ctx, idxKey(bp), &redis.ZRangeBy{Max: upper, Min: "-", Count: int64(per)})
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		var refs []idRef
		cutoff := "" // the highest last id of a bucket that may hold more
		for i, c := range cmds {
			ids := c.Val()
			for _, id := range ids {
				refs = append(refs, idRef{id, l.buckets[i]})
			}
			if len(ids) == per && ids[len(ids)-1] > cutoff {
				cutoff = ids[len(ids)-1]
			}
		}
		slices.SortFunc(refs, func(a, b idRef) int { return strings.Compare(b.id, a.id) })
		certain := len(refs)
		if cutoff != "" {
			certain, _ = slices.BinarySearchFunc(refs, cutoff, func(r idRef, c string) int { return strings.Compare(c, r.id) })
			certain++ // the cutoff id itself is certain
		}
		if certain >= n || cutoff == "" {
			return refs[:min(n, certain)], nil
		}
		per = min(2*per, n)
	}
}
