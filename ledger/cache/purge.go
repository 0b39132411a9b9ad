package cache

import (
	"context"
	"encoding/hex"
	"fmt"
	"strings"

	"github.com/onejob/onejob/ledger"
)

// Purge implements ledger.Purger: the truth purges the owner's settled
// jobs, then Forget drops the owner's replies, so that none of them is
// replayed from the cache. Unlike the other calls, a Redis error fails it
// (the truth's purge stands; a repeat finishes the work): a purge that
// left answers in Redis would not be one.
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
	return st, nil
}

// Forget drops every reply of the owner ownerHash from Redis and from this
// process, and returns how many Redis held, once this process's queued
// writes are sent. It walks the owner's keys with
// SCAN, so its cost grows with the cache's size.
func (l *Ledger) Forget(ctx context.Context, ownerHash []byte) (int, error) {
	// The writes queued before this call reach Redis first: none of them
	// puts back a reply dropped below.
	l.writer.flush()
	l.near.ForgetOwner(ownerHash)
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
	l.near.ForgetOwner(ownerHash) // a reply read while Redis was walked
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
