// Package cache is a Ledger that puts Redis in front of a source-of-truth
// Ledger (PostgreSQL in production): completed answers are cached in Redis
// for replays, and job changes are published so that waiting duplicates on
// every gateway instance wake at once. The truth stays the truth: when
// Redis is down, slow or wrong, every call is answered from it, never from
// a guess, and no Redis error ever fails a call.
//
// # Keyspace
//
// Every key starts with Options.Prefix (default "onejob:cache:"):
//
//	<prefix>reply:<hex owner_hash>:<hex key_hash>   string: a completed job's stored answer
//	<prefix>done                                   pub/sub channel: ids of jobs that changed
//
// A reply is written only for a job that is completed with a stored
// response (of at most Options.MaxSize), with SET … PX: a time to live,
// counted by Redis's own clock, of the time the job has left by the
// truth's clock (its expires_at less the truth's time when it was read),
// less Options.Margin; nothing else is ever cached. No clock is compared
// with another's. Its value is
//
//	format byte (1) | SHA-256 of format byte and payload | payload
//
// (HMAC-SHA-256 under Options.Secret when one is set), where the payload
// holds the job's owner hash, key hash, fingerprint and fingerprint
// version, id, state, version, winning attempt, times and response.
//
// # What a hit must pass
//
// Reserve reads the reply and its time to live in one round trip, bounded
// by Options.Timeout. The value is used only when its format byte is
// known, its integrity check holds and it decodes to the end; its owner and
// key hashes equal the request's; it holds a completed job with a stored
// response; and Redis still holds it (its time to live, by Redis's clock,
// has not run out). A hit whose fingerprint or fingerprint version differs from the
// request's is a Mismatch that carries only the job's id and state. Any
// miss, error, timeout or value that fails a check goes to the truth's
// Reserve; a Done from the truth with a stored answer fills the cache.
//
// The margin covers the round trips between the truth's reading of its
// clock and Redis's start of the time to live. A job is only ever removed or replaced after its expires_at,
// and a completed job's answer never changes, so an entry that passes
// these checks says what the truth would say. Gateways that share a Redis
// but not a truth must use different prefixes.
//
// # Wake-ups
//
// Complete, SaveBody, Fail, MarkUnknown and Resolve publish the job's id
// after the truth has recorded the change. Wait subscribes (one
// subscription per Ledger, shared by its waiters) before it runs the
// truth's own Wait, and reads the truth's Job whenever the id is
// published: it returns only states read from the truth, and without Redis
// the truth's Wait alone still answers.
//
// # Writes
//
// Replies and publications go to Redis in the background, in the order
// they were made, as many as are waiting in one pipeline (writer.go): a
// call returns once the truth answered, without waiting for Redis, and
// under load one round trip carries the writes of many calls. A reply's
// time to live loses the time its write waited. Until it is sent, a
// replay in another process is answered by the truth, and a waiter there
// is woken by the truth's own notification; Forget (and so Purge) sends
// what is queued before it drops the owner's replies. Close ends the
// cache's subscription after it has sent the writes queued before it.
//
// # Ownership
//
// The caller owns the truth and the Redis client: Close ends only the
// cache's subscription, unless Options.CloseTruth and Options.CloseClient
// hand them over. Options.Timeout bounds Redis's network I/O only when
// the client honours context deadlines, as NewClient's does.
package cache

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/near"
)

// DefaultPrefix starts every key of the cache.
const DefaultPrefix = "onejob:cache:"

// Defaults of Options.
const (
	DefaultTimeout = 50 * time.Millisecond
	DefaultMargin  = 5 * time.Second
	DefaultMaxSize = 1 << 20
)

// memoSize bounds the identities remembered between a reservation and its
// completion.
const memoSize = 1 << 16

// Options configure a cache Ledger.
type Options struct {
	// Prefix starts every key and the channel; default "onejob:cache:".
	Prefix string
	// Logger receives Redis trouble (throttled); nil logs nothing.
	Logger *zap.Logger
	// Timeout bounds each Redis call; default 50ms. The client must have
	// ContextTimeoutEnabled set for it to bound the network I/O (NewClient
	// does); otherwise the client's own read and write timeouts do.
	Timeout time.Duration
	// Margin is how long before a job's expires_at its reply stops being
	// cached and trusted; default 5s. It covers the time between the
	// truth's reading of its clock and Redis's start of the reply's time to
	// live; the clocks themselves need not agree.
	Margin time.Duration
	// MaxSize is the largest reply cached, in bytes (about the size of its
	// body); default 1MiB. Larger answers are replayed from the truth:
	// reading them within Timeout is not to be counted on.
	MaxSize int
	// LocalEntries and LocalBytes bound the tier in this process in front
	// of Redis (replies read or written lately, answered without a round
	// trip); defaults 10000 and 64MiB. A negative LocalEntries disables it.
	LocalEntries int
	LocalBytes   int
	// Secret, if set, keys the integrity check of replies (HMAC-SHA-256),
	// so that a writer to Redis without it cannot forge an answer. Without
	// it a plain SHA-256 guards against corrupt and foreign values only.
	Secret []byte
	// CloseTruth and CloseClient make Close close the truth and the Redis
	// client too. By default the caller owns both.
	CloseTruth  bool
	CloseClient bool
}

// Ledger is a cache in front of a source-of-truth Ledger.
type Ledger struct {
	truth   ledger.Ledger
	rdb     *redis.Client
	prefix  string
	timeout time.Duration
	margin  time.Duration
	maxSize int
	mac     func() hash.Hash
	log     *logThrottle
	now     func() time.Time // the local clock: for durations only, never compared with a ledger's
	bus     *bus
	memo    *memo
	near    *near.Cache
	writer  *writer

	closeTruth, closeClient bool
	closeOnce               sync.Once
	closeErr                error
}

// New returns a Ledger that answers from truth and caches in rdb. It
// starts nothing until the first call: the first Reserve starts its
// subscription, which the in-process tier follows.
func New(truth ledger.Ledger, rdb *redis.Client, opts Options) *Ledger {
	if opts.Prefix == "" {
		opts.Prefix = DefaultPrefix
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Margin <= 0 {
		opts.Margin = DefaultMargin
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = DefaultMaxSize
	}
	if opts.LocalEntries == 0 {
		opts.LocalEntries = 10000
	}
	if opts.LocalBytes <= 0 {
		opts.LocalBytes = 64 << 20
	}
	logger := opts.Logger
	if logger == nil {
		logger = zap.NewNop()
	}
	log := &logThrottle{log: logger, interval: 10 * time.Second}
	if !rdb.Options().ContextTimeoutEnabled {
		logger.Warn("redis cache: the client ignores context deadlines, so a slow Redis delays calls by up to its read timeout; set ContextTimeoutEnabled",
			zap.Duration("read_timeout", rdb.Options().ReadTimeout))
	}
	l := &Ledger{
		truth:       truth,
		rdb:         rdb,
		prefix:      opts.Prefix,
		timeout:     opts.Timeout,
		margin:      opts.Margin,
		maxSize:     opts.MaxSize,
		mac:         newMAC(opts.Secret),
		log:         log,
		now:         time.Now,
		bus:         newBus(rdb, opts.Prefix+"done", opts.Timeout, log),
		memo:        newMemo(memoSize),
		near:        near.New(opts.LocalEntries, opts.LocalBytes),
		closeTruth:  opts.CloseTruth,
		closeClient: opts.CloseClient,
	}
	l.writer = newWriter(rdb, l.Channel(), opts.Timeout, func() time.Time { return l.now() }, l.near.Keeps, l.forgetReplies, log)
	// Every instance forgets a purged owner's replies: those in this
	// process (near), and those its writer may have put back in Redis
	// after the instance that purged deleted them (purgeHeard).
	l.near.Follow(l.bus.sub)
	l.bus.sub.Watch(purgeHeard{l.writer})
	return l
}

// NewClient returns a client for the Redis at url (redis://, rediss:// or
// unix://, as redis.ParseURL reads it) that honours context deadlines, so
// that Options.Timeout bounds every cache call.
func NewClient(url string) (*redis.Client, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis cache: %w", err)
	}
	opt.ContextTimeoutEnabled = true
	// Never re-send a command whose reply was lost: the gateway decides
	// what to repeat (the cache only ever falls back to the truth).
	opt.MaxRetries = -1
	if opt.DialerRetries == 0 {
		// Fail over to the truth at once while Redis refuses connections.
		opt.DialerRetries = 1
	}
	return redis.NewClient(opt), nil
}

// Truth returns the ledger the cache answers from.
func (l *Ledger) Truth() ledger.Ledger { return l.truth }

// replyKey is the key of the reply for (owner, key).
func (l *Ledger) replyKey(ownerHash, keyHash []byte) string {
	return l.prefix + "reply:" + hex.EncodeToString(ownerHash) + ":" + hex.EncodeToString(keyHash)
}

// Channel is the pub/sub channel on which job ids are published.
func (l *Ledger) Channel() string { return l.prefix + "done" }

// Reserve implements ledger.Ledger: from a verified reply when there is
// one, else from the truth. A reservation answered from a reply carries
// the local clock as Now, and no attempts.
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	gen := l.near.Gen()
	if r, ok := l.lookup(ctx, &p, gen); ok {
		return r, nil
	}
	r, err := l.truth.Reserve(ctx, p)
	if err != nil {
		return r, err
	}
	switch r.Outcome {
	case ledger.Done:
		if near.Replayable(r.Job) {
			// The request's identity is the job's: Done means the
			// fingerprint matched.
			j := *r.Job
			p.Identify(&j)
			l.write(update{set: &j, left: j.ExpiresAt.Sub(r.Now), gen: gen})
		}
	case ledger.Created, ledger.Reopened:
		if r.Attempt != nil {
			l.memo.remember(r.Job.ID, &p, r.Job, r.Attempt.Deadline.Sub(r.Now), l.now())
		}
	}
	return r, nil
}

// lookup answers p from the cache, if a reply passes every check; gen is
// the near tier's generation before the call.
func (l *Ledger) lookup(ctx context.Context, p *ledger.ReserveParams, gen uint64) (ledger.Reservation, bool) {
	key := l.replyKey(p.OwnerHash, p.KeyHash)
	if j := l.near.Get(key, l.now()); j != nil {
		return near.Answer(j, p, l.now())
	}
	rctx, cancel := context.WithTimeout(ctx, l.timeout)
	pipe := l.rdb.Pipeline()
	get, ttl := pipe.Get(rctx, key), pipe.PTTL(rctx, key)
	_, err := pipe.Exec(rctx)
	cancel()
	b, err := get.Bytes()
	if err != nil {
		if !errors.Is(err, redis.Nil) && ctx.Err() == nil {
			l.log.warn("redis cache: lookup failed; answering from the ledger", zap.Error(err))
		}
		return ledger.Reservation{}, false
	}
	j, err := decode(b, l.mac)
	if err != nil {
		l.log.warn("redis cache: ignoring a reply that does not verify", zap.String("key", key), zap.Error(err))
		return ledger.Reservation{}, false
	}
	if !l.trusted(j, p) {
		l.log.warn("redis cache: ignoring a reply for another job", zap.String("key", key), zap.String("job_id", j.ID))
		return ledger.Reservation{}, false
	}
	left, err := ttl.Result()
	if err != nil || left <= 0 {
		return ledger.Reservation{}, false // no time to live: not one the cache wrote
	}
	now := l.now()
	l.near.Put(key, j, now.Add(left), gen)
	r, ok := near.Answer(j, p, now)
	r.Tier = ledger.TierCache
	return r, ok
}

// trusted reports whether a decoded reply is one the cache may have
// written for p: same owner and key, completed with a stored answer.
func (l *Ledger) trusted(j *ledger.Job, p *ledger.ReserveParams) bool {
	return bytes.Equal(j.OwnerHash, p.OwnerHash) && bytes.Equal(j.KeyHash, p.KeyHash) &&
		j.ID != "" && j.CompletedBy != "" && near.Replayable(j)
}

// update is one best-effort write to Redis.
type update struct {
	set     *ledger.Job   // cache this job's reply (if near.Replayable)
	left    time.Duration // the time set has left by the truth's clock
	gen     uint64        // the near tier's generation before set was read: a purge heard since drops it
	del     *ledger.Job   // drop the reply of this job's owner and key
	publish string        // publish this job id
}

// write applies u: at once to the tier in this process, in the background
// to Redis (writer), whose errors are logged, never returned.
func (l *Ledger) write(u update) {
	o := op{publish: u.publish, queued: l.now(), gen: u.gen}
	if j := u.set; j != nil && near.Replayable(j) && len(j.OwnerHash) > 0 && len(j.KeyHash) > 0 {
		if ttl := u.left - l.margin; ttl >= time.Millisecond && len(j.Response.Body) <= l.maxSize {
			if v := encode(j, l.mac); len(v) <= l.maxSize {
				o.key, o.value, o.ttl = l.replyKey(j.OwnerHash, j.KeyHash), v, ttl
				l.near.Put(o.key, j, o.queued.Add(ttl), u.gen)
			}
		}
	}
	if j := u.del; j != nil && len(j.OwnerHash) > 0 && len(j.KeyHash) > 0 {
		o.del = l.replyKey(j.OwnerHash, j.KeyHash)
	}
	if o.key == "" && o.del == "" && o.publish == "" {
		return
	}
	l.writer.queue(o)
}

// timeLeft is how long a job just read from the truth has until it
// expires, by the truth's clock: from its ReadAt, else from its completion
// (a job that completed in the call that returned it).
func timeLeft(j *ledger.Job) time.Duration {
	now := j.ReadAt
	if now.IsZero() {
		now = j.CompletedAt
	}
	return j.ExpiresAt.Sub(now)
}

// identified returns j (a completion's job, whose identity the backend may
// leave out) with its identity: remembered from the reservation, else read
// from the truth. ok is false when the truth cannot be read.
func (l *Ledger) identified(ctx context.Context, jobID string, j *ledger.Job) (*ledger.Job, bool) {
	if id, ok := l.memo.take(jobID); ok {
		c := *j
		c.ID = jobID
		id.request.Identify(&c)
		c.Retention, c.CreatedAt = id.retention, id.createdAt
		return &c, true
	}
	full, err := l.truth.Job(ctx, jobID)
	if err != nil {
		l.log.warn("redis cache: cannot read the completed job to cache it", zap.String("job_id", jobID), zap.Error(err))
		return nil, false
	}
	return full, true
}

// Complete implements ledger.Ledger. A winning answer that is stored is
// cached; the job's id is published either way.
func (l *Ledger) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	gen := l.near.Gen()
	c, err := l.truth.Complete(ctx, ref, resp)
	if err != nil {
		return c, err
	}
	u := update{publish: ref.JobID, gen: gen}
	if c.Won && near.Replayable(c.Job) {
		if j, ok := l.identified(ctx, ref.JobID, c.Job); ok {
			u.set, u.left = j, timeLeft(c.Job)
		}
	} else if c.Won {
		// Not stored yet (a stream): SaveBody caches it once it is.
		l.memo.forget(ref.JobID)
	}
	l.write(u)
	return c, nil
}

// SaveBody implements ledger.Ledger. It reads the job back from the truth
// and caches its reply if the body was stored, or drops any reply if not.
func (l *Ledger) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	gen := l.near.Gen()
	if err := l.truth.SaveBody(ctx, ref, body, size, stored); err != nil {
		return err
	}
	u := update{publish: ref.JobID, gen: gen}
	j, err := l.truth.Job(ctx, ref.JobID)
	switch {
	case err != nil:
		l.log.warn("redis cache: cannot read the job whose body was saved", zap.String("job_id", ref.JobID), zap.Error(err))
	case near.Replayable(j):
		u.set, u.left = j, timeLeft(j)
	default:
		u.del = j
	}
	l.write(u)
	return nil
}

// Fail implements ledger.Ledger and publishes the job's id.
func (l *Ledger) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	a, err := l.truth.Fail(ctx, ref, reason, next)
	if err == nil || errors.Is(err, ledger.ErrBlocked) {
		// ErrBlocked records the failure all the same.
		if a != nil {
			l.memo.extend(ref.JobID, a.Deadline.Sub(a.StartedAt), l.now())
		}
		l.write(update{publish: ref.JobID})
	}
	return a, err
}

// MarkUnknown implements ledger.Ledger and publishes the job's id.
func (l *Ledger) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	if err := l.truth.MarkUnknown(ctx, ref, reason); err != nil {
		return err
	}
	l.write(update{publish: ref.JobID})
	return nil
}

// Unsent implements ledger.Ledger and publishes the job's id.
func (l *Ledger) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	if err := l.truth.Unsent(ctx, ref); err != nil {
		return err
	}
	l.write(update{publish: ref.JobID})
	return nil
}

// Resolve implements ledger.Ledger: it publishes the job's id, and caches
// the operator's answer when it completed the job.
func (l *Ledger) Resolve(ctx context.Context, jobID string, r ledger.Resolution) (*ledger.Job, error) {
	gen := l.near.Gen()
	j, err := l.truth.Resolve(ctx, jobID, r)
	if err != nil {
		return j, err
	}
	l.settled(ctx, jobID, j, gen)
	return j, nil
}

// settled publishes the id of job j, settled out of the request path (by
// an operator or a lookup), and caches its answer when it completed; gen
// is the near tier's generation before j was read.
func (l *Ledger) settled(ctx context.Context, jobID string, j *ledger.Job, gen uint64) {
	u := update{publish: jobID, gen: gen}
	if near.Replayable(j) {
		if full, ok := l.identified(ctx, jobID, j); ok {
			u.set, u.left = full, timeLeft(j)
		}
	}
	l.write(u)
}

// ClaimLookup implements ledger.Ledger: a lease changes no answer.
func (l *Ledger) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	return l.truth.ClaimLookup(ctx, ref, holder, lease)
}

// SettleLookup implements ledger.Ledger: it publishes the job's id, and
// caches the answer the lookup found when it completed the job.
func (l *Ledger) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	gen := l.near.Gen()
	j, err := l.truth.SettleLookup(ctx, ref, holder, r)
	if err != nil {
		return j, err
	}
	l.settled(ctx, ref.JobID, j, gen)
	return j, nil
}

// Hedge implements ledger.Ledger.
func (l *Ledger) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	a, err := l.truth.Hedge(ctx, ref, next)
	if err == nil {
		l.memo.extend(ref.JobID, a.Deadline.Sub(a.StartedAt), l.now())
	}
	return a, err
}

// Resend implements ledger.Ledger: the truth starts it, like a hedge.
func (l *Ledger) Resend(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	a, err := l.truth.Resend(ctx, ref, next)
	if err == nil {
		l.memo.extend(ref.JobID, a.Deadline.Sub(a.StartedAt), l.now())
	}
	return a, err
}

// Job implements ledger.Ledger from the truth.
func (l *Ledger) Job(ctx context.Context, jobID string) (*ledger.Job, error) {
	return l.truth.Job(ctx, jobID)
}

// Find implements ledger.Ledger from the truth: the cache holds replies
// for replays, never a job's state.
func (l *Ledger) Find(ctx context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	return l.truth.Find(ctx, ownerHash, keyHash)
}

// Jobs implements ledger.Ledger from the truth.
func (l *Ledger) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	return l.truth.Jobs(ctx, q)
}

// Sweep implements ledger.Ledger on the truth. Replies need no sweep: they
// expire in Redis before their jobs do.
func (l *Ledger) Sweep(ctx context.Context, limit int) (ledger.SweepStats, error) {
	return l.truth.Sweep(ctx, limit)
}

type waitResult struct {
	job *ledger.Job
	err error
}

// Wait implements ledger.Ledger. It subscribes to the channel, then runs
// the truth's Wait; when the job's id is published first, it reads the job
// from the truth and returns it if it is no longer pending. Only states
// read from the truth are returned.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	woken, unsubscribe := l.bus.subscribe(ctx, jobID)
	defer unsubscribe()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	res := make(chan waitResult, 1)
	go func() {
		j, err := l.truth.Wait(wctx, jobID)
		res <- waitResult{j, err}
	}()
	for {
		select {
		case r := <-res:
			return r.job, r.err
		case <-woken:
			j, err := l.truth.Job(ctx, jobID)
			if (err == nil && j.State != ledger.JobPending) || errors.Is(err, ledger.ErrNotFound) {
				cancel()
				<-res
				return j, err
			}
			// Still pending, or the read failed: the truth's Wait goes on.
		}
	}
}

// Close ends the Redis subscription. It closes the truth and the Redis
// client only when Options.CloseTruth and Options.CloseClient say so.
func (l *Ledger) Close() error {
	l.closeOnce.Do(func() {
		l.writer.close()
		l.bus.close()
		var errs []error
		if l.closeTruth {
			errs = append(errs, l.truth.Close())
		}
		if l.closeClient {
			errs = append(errs, l.rdb.Close())
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

var _ ledger.Ledger = (*Ledger)(nil)
