package redis

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
)

// load reads one unexpired job with its attempts and the server's clock in
// one MULTI (one round trip, one snapshot), and applies leases by that
// clock.
func (l *Ledger) load(ctx context.Context, jobID string) (*ledger.Job, time.Time, error) {
	if !validID(jobID) {
		return nil, time.Time{}, ledger.ErrNotFound
	}
	var (
		jc, ac *redis.MapStringStringCmd
		tc     *redis.TimeCmd
	)
	_, err := l.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		jc = p.HGetAll(ctx, l.jobKey(jobID))
		ac = p.HGetAll(ctx, l.attemptsKey(jobID))
		tc = p.Time(ctx)
		return nil
	})
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("redis ledger: job: %w", err)
	}
	now := tc.Val()
	m := jc.Val()
	if len(m) == 0 {
		return nil, now, ledger.ErrNotFound
	}
	j, err := decodeJob(m)
	if err != nil {
		return nil, now, err
	}
	if j.Expired(now) {
		return nil, now, ledger.ErrNotFound
	}
	n, _ := strconv.Atoi(m["n"])
	decodeAttempts(j, ac.Val(), n)
	fsm.ApplyLeases(j, now)
	return j, now, nil
}

// Job implements ledger.Ledger.
func (l *Ledger) Job(ctx context.Context, jobID string) (*ledger.Job, error) {
	j, now, err := l.load(ctx, jobID)
	if j != nil {
		j.ReadAt = now
	}
	return j, err
}

// Find implements ledger.Ledger: one script (find.lua) follows the
// identity key of (owner, key) to the job it names and returns the job,
// its attempts and the server's clock from one snapshot; expiry and leases
// are judged in Go by that clock, as load does.
func (l *Ledger) Find(ctx context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	v, err := scripts.find.Run(ctx, l.client, []string{l.identKey(identity(ownerHash, keyHash))}, l.prefix).Result()
	if err != nil {
		return nil, fmt.Errorf("redis ledger: find: %w", err)
	}
	a, ok := array(v)
	if !ok || len(a) == 0 {
		return nil, errReply("find", v)
	}
	now := nowOf(a, 0)
	if len(a) < 3 {
		return nil, ledger.ErrNotFound
	}
	j, err := scriptJob("find", a[1], a[2])
	if err != nil {
		return nil, err
	}
	if j.Expired(now) {
		return nil, ledger.ErrNotFound
	}
	fsm.ApplyLeases(j, now)
	j.ReadAt = now
	return j, nil
}

// Jobs implements ledger.Ledger: it walks the index newest first, reading
// batches of jobs (their fields, not their bodies, and their attempts) with
// the server's clock in one MULTI each, and keeps the unexpired jobs that
// match the query once leases are applied. Listed jobs carry their
// response's status and size, not its body.
func (l *Ledger) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	limit := ledger.EffectiveLimit(q.Limit)
	upper := "+"
	if q.Before != "" {
		if !validID(q.Before) {
			return ledger.JobPage{}, fmt.Errorf("redis ledger: invalid cursor %q", q.Before)
		}
		upper = "(" + q.Before
	}
	batch := int64(limit + 1)
	if q.State != "" || q.Provider != "" {
		batch = max(batch, 200)
	}
	var jobs []*ledger.Job
	for len(jobs) <= limit {
		ids, err := l.client.ZRevRangeByLex(ctx, l.idxKey(), &redis.ZRangeBy{Max: upper, Min: "-", Count: batch}).Result()
		if err != nil {
			return ledger.JobPage{}, fmt.Errorf("redis ledger: jobs: %w", err)
		}
		if len(ids) == 0 {
			break
		}
		found, err := l.loadMany(ctx, ids)
		if err != nil {
			return ledger.JobPage{}, err
		}
		for _, j := range found {
			if fsm.Matches(j, q) {
				jobs = append(jobs, j)
			}
		}
		if int64(len(ids)) < batch {
			break
		}
		upper = "(" + ids[len(ids)-1]
	}
	var page ledger.JobPage
	if len(jobs) > limit {
		jobs = jobs[:limit]
		page.Next = jobs[limit-1].ID
	}
	page.Jobs = jobs
	return page, nil
}

// loadMany reads the listed jobs that still exist and have not expired, in
// the order given, with leases applied.
func (l *Ledger) loadMany(ctx context.Context, ids []string) ([]*ledger.Job, error) {
	jcs := make([]*redis.SliceCmd, len(ids))
	acs := make([]*redis.MapStringStringCmd, len(ids))
	var tc *redis.TimeCmd
	_, err := l.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tc = p.Time(ctx)
		for i, id := range ids {
			jcs[i] = p.HMGet(ctx, l.jobKey(id), jobFields...)
			acs[i] = p.HGetAll(ctx, l.attemptsKey(id))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redis ledger: jobs: %w", err)
	}
	now := tc.Val()
	jobs := make([]*ledger.Job, 0, len(ids))
	for i := range ids {
		m := zipFields(jobFields, jcs[i].Val())
		if m["id"] == "" {
			continue // expired by TTL, not yet swept from the index
		}
		j, err := decodeJob(m)
		if err != nil {
			return nil, err
		}
		if j.Expired(now) {
			continue
		}
		n, _ := strconv.Atoi(m["n"])
		decodeAttempts(j, acs[i].Val(), n)
		fsm.ApplyLeases(j, now)
		jobs = append(jobs, j)
	}
	return jobs, nil
}
