package cache

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/notify"
)

// Purge implements ledger.Purger: the truth purges the owner's settled
// jobs, then Forget drops the owner's replies, so that none of them is
// replayed from the cache, and the purge's notice (notify.PurgeNotice)
// tells every instance to forget them too. Unlike the other calls, a
// Redis error fails it (the truth's purge stands; a repeat finishes the
// work): a purge that left answers in Redis would not be one.
func (l *Ledger) Purge(ctx context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	p, ok := l.truth.(ledger.Purger)
	if !ok {
		return ledger.PurgeStats{}, fmt.Errorf("cache: the ledger %T cannot purge", l.truth)
	}
	st, err := p.Purge(ctx, ownerHash)
	if err != nil {
		return st, err
	}
	if _, err := l.Forget(ctx, ownerHash); err != nil {
		return st, err
	}
	if err := l.rdb.Publish(ctx, l.Channel(), notify.PurgeNotice(ownerHash)).Err(); err != nil {
		return st, fmt.Errorf("cache: purge notice: %w", err)
	}
	return st, nil
}

// Forget drops every reply of the owner ownerHash from this process and
// from Redis, and returns how many Redis held, once this process's writes
// queued before it are sent (none of them puts back a reply dropped). It
// walks the owner's keys with SCAN, so its cost grows with the cache's
// size.
func (l *Ledger) Forget(ctx context.Context, ownerHash []byte) (int, error) {
	l.near.ForgetOwner(ownerHash)
	done := make(chan forgotten, 1)
	l.writer.queue(op{forget: ownerHash, ctx: ctx, forgot: done})
	select {
	case f := <-done:
		return f.n, f.err
	case <-l.writer.stopped:
		return 0, errors.New("cache: forget: the cache is closed")
	case <-ctx.Done():
		return 0, fmt.Errorf("cache: forget: %w", ctx.Err())
	}
}

// forgetReplies deletes the owner's replies in Redis, on the writer's
// loop (a forget op), and then from this process again: a reply read
// while Redis was walked.
func (l *Ledger) forgetReplies(ctx context.Context, ownerHash []byte) (int, error) {
	match := globEscape(l.prefix+"reply:"+hex.EncodeToString(ownerHash)+":") + "*"
	n := 0
	iter := l.rdb.Scan(ctx, 0, match, 1000).Iterator()
	var batch []string
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		d, err := l.rdb.Del(ctx, batch...).Result()
		n += int(d)
		batch = batch[:0]
		return err
	}
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 500 {
			if err := flush(); err != nil {
				return n, fmt.Errorf("cache: forget: %w", err)
			}
		}
	}
	if err := iter.Err(); err != nil {
		return n, fmt.Errorf("cache: forget: %w", err)
	}
	if err := flush(); err != nil {
		return n, fmt.Errorf("cache: forget: %w", err)
	}
	l.near.ForgetOwner(ownerHash)
	return n, nil
}

// globEscape escapes the characters SCAN's MATCH pattern gives a meaning.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

var _ ledger.Purger = (*Ledger)(nil)
