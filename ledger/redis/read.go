package redis

import (
	"context"
	"fmt"
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
	bp, err := l.where(ctx, jobID)
	if err != nil {
		return nil, time.Time{}, err
	}
	var (
		jc, ac *redis.MapStringStringCmd
		tc     *redis.TimeCmd
	)
	_, err = l.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		jc = p.HGetAll(ctx, jobKey(bp, jobID))
		ac = p.HGetAll(ctx, attemptsKey(bp, jobID))
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
	v := hashValues(m)
	j, err := decodeJob(v)
	if err != nil {
		return nil, now, err
	}
	if j.Expired(now) {
		return nil, now, ledger.ErrNotFound
	}
	decodeAttempts(j, v, ac.Val())
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
	ident := identity(ownerHash, keyHash)
	bp := l.identBucket(ident)
	v, err := l.eval(ctx, l.scripts.find, []string{identKey(bp, ident)}, bp).Result()
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
	l.saw(j)
	fsm.ApplyLeases(j, now)
	j.ReadAt = now
	return j, nil
}

// Jobs implements ledger.Ledger: it walks the index newest first (walk),
// reading batches of jobs (their fields, not their bodies, and their
// attempts) with the server's clock in one MULTI per bucket, and keeps the
// unexpired jobs that match the query once leases are applied. Listed jobs
// carry their response's status and size, not its body.
func (l *Ledger) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	limit := ledger.EffectiveLimit(q.Limit)
	if q.Before != "" && !validID(q.Before) {
		return ledger.JobPage{}, fmt.Errorf("redis ledger: invalid cursor %q", q.Before)
	}
	cursor := q.Before
	batch := limit + 1
	if q.State != "" || q.Provider != "" {
		batch = max(batch, 200)
	}
	var jobs []*ledger.Job
	for len(jobs) <= limit {
		refs, err := l.walk(ctx, cursor, batch)
		if err != nil {
			return ledger.JobPage{}, fmt.Errorf("redis ledger: jobs: %w", err)
		}
		if len(refs) == 0 {
			break
		}
		found, err := l.loadMany(ctx, refs)
		if err != nil {
			return ledger.JobPage{}, err
		}
		for _, j := range found {
			if fsm.Matches(j, q) {
				jobs = append(jobs, j)
			}
		}
		if len(refs) < batch {
			break
		}
		cursor = refs[len(refs)-1].id
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
// the order given, with leases applied: one MULTI per bucket (a MULTI
// cannot span slots), the buckets' reads run side by side.
func (l *Ledger) loadMany(ctx context.Context, refs []idRef) ([]*ledger.Job, error) {
	groups := map[string][]int{} // bucket prefix -> indexes into refs
	for i, r := range refs {
		groups[r.bp] = append(groups[r.bp], i)
	}
	read := make([]*ledger.Job, len(refs))
	errs := make(chan error, len(groups))
	for bp, idx := range groups {
		go func() { errs <- l.loadBucket(ctx, bp, refs, idx, read) }()
	}
	var first error
	for range groups {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		return nil, first
	}
	jobs := make([]*ledger.Job, 0, len(refs))
	for _, j := range read {
		if j != nil {
			jobs = append(jobs, j)
		}
	}
	return jobs, nil
}

// loadBucket reads refs[i] for each i in idx, all in bucket bp, into
// read[i], leaving nil those gone or expired.
func (l *Ledger) loadBucket(ctx context.Context, bp string, refs []idRef, idx []int, read []*ledger.Job) error {
	jcs := make([]*redis.SliceCmd, len(idx))
	acs := make([]*redis.MapStringStringCmd, len(idx))
	var tc *redis.TimeCmd
	_, err := l.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		tc = p.Time(ctx)
		for k, i := range idx {
			jcs[k] = p.HMGet(ctx, jobKey(bp, refs[i].id), jobFields...)
			acs[k] = p.HGetAll(ctx, attemptsKey(bp, refs[i].id))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("redis ledger: jobs: %w", err)
	}
	now := tc.Val()
	for k, i := range idx {
		v := replyValues(jcs[k].Val())
		if id, _ := v(jfID); id == "" {
			continue // expired by TTL, not yet swept from the index
		}
		j, err := decodeJob(v)
		if err != nil {
			return err
		}
		if j.Expired(now) {
			continue
		}
		decodeAttempts(j, v, acs[k].Val())
		fsm.ApplyLeases(j, now)
		read[i] = j
	}
	return nil
}
