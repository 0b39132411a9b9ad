package redis

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// indexPage returns up to n job ids of the index <p>idx older than the id
// before (from the newest when before is ""), newest first: the one place
// that walks the whole index (Counts, Purge), so that a change of the
// index's layout changes only this function.
func (l *Ledger) indexPage(ctx context.Context, before string, n int) ([]string, error) {
	upper := "+"
	if before != "" {
		upper = "(" + before
	}
	return l.client.ZRevRangeByLex(ctx, l.idxKey(), &redis.ZRangeBy{Max: upper, Min: "-", Count: int64(n)}).Result()
}
