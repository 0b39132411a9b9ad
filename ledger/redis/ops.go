package redis

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
)

// run runs a transition's script and returns its reply as an array with a
// string outcome first. With Options.Replicas it answers once that many
// replicas have what the master had after the script (ack.go).
func (l *Ledger) run(ctx context.Context, what string, s script, keys []string, args ...any) (string, []any, error) {
	v, err := l.evalAcked(ctx, s, keys, args...).Result()
	if err != nil {
		return "", nil, fmt.Errorf("redis ledger: %s: %w", what, err)
	}
	if o, ok := str(v); ok {
		return o, nil, nil
	}
	a, ok := array(v)
	if !ok || len(a) == 0 {
		return "", nil, errReply(what, v)
	}
	o, ok := str(a[0])
	if !ok {
		return "", nil, errReply(what, a[0])
	}
	return o, a, nil
}

// nowOf reads the server's clock a script returned (microseconds).
func nowOf(a []any, i int) time.Time {
	if i >= len(a) {
		return time.Time{}
	}
	s, _ := str(a[i])
	return timeOf(s)
}

// errNoIDs refuses a transition whose ids the caller did not choose: the
// ledger never makes them up, or a repeat could not be recognized.
func errNoIDs(what string) error {
	return fmt.Errorf("redis ledger: %s: the caller must choose the ids (a UUIDv7 job id, attempt ids)", what)
}

func errUnexpected(what, outcome string) error {
	return fsm.UnexpectedOutcome("redis ledger", what, outcome)
}

// Reserve implements ledger.Ledger. A replay of a completed job this
// process read lately is answered from memory: the job cannot change before
// it expires (see near.Margin). A repeat of the call that started one of
// its attempts goes to the ledger, which answers it as the first call.
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	key, now, gen := near.Key(p.OwnerHash, p.KeyHash), time.Now(), l.replays.Gen()
	if j := l.replays.Get(key, now); j != nil {
		if r, ok := near.Answer(j, &p, now); ok {
			return r, nil
		}
	}
	r, err := l.reserve(ctx, p)
	if err != nil {
		return r, err
	}
	return l.replays.Remember(key, r, &p, near.Margin, gen), nil
}

// reserve runs the reservation in the ledger.
func (l *Ledger) reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	if !validID(p.JobID) || p.Attempt.ID == "" {
		return ledger.Reservation{}, errNoIDs("reserve")
	}
	ident := identity(p.OwnerHash, p.KeyHash)
	bp := l.identBucket(ident)
	keys := []string{identKey(bp, ident), jobKey(bp, p.JobID), attemptsKey(bp, p.JobID), idxKey(bp), leasesKey(bp), expiryKey(bp)}
	outcome, a, err := l.run(ctx, "reserve", l.scripts.reserve, keys,
		bp, p.JobID, p.Attempt.ID, p.OwnerHash, p.KeyHash, ident, p.Fingerprint,
		strconv.Itoa(p.FingerprintVersion), p.Attempt.Provider, micros(p.Attempt.Lease), micros(p.Retention),
		p.FingerprintScheme, p.Attempt.Scope)
	if err != nil {
		return ledger.Reservation{}, err
	}
	r := ledger.Reservation{Now: nowOf(a, 1)}
	var ok bool
	if r.Outcome, ok = ledger.ParseOutcome(outcome); !ok {
		return ledger.Reservation{}, errUnexpected("reserve", outcome)
	}
	if r.Outcome == ledger.Mismatch {
		// The id, state and fingerprint's making: never the other
		// request's answer.
		vals, ok := array(a[2])
		if !ok || len(vals) < 5 {
			return ledger.Reservation{}, errReply("reserve", a[2])
		}
		m := zipFields([]string{"id", "state", "created", "fpv", "fps"}, vals)
		fpv, _ := strconv.Atoi(m["fpv"])
		l.ids.put(m["id"], l.bucketOf(ident))
		return ledger.Mismatched(&ledger.Job{ID: m["id"], State: ledger.JobState(m["state"]),
			CreatedAt: timeOf(m["created"]), FingerprintVersion: fpv, FingerprintScheme: m["fps"]}, r.Now), nil
	}
	if r.Outcome == ledger.Created && len(a) == 2 {
		// A new job: the script answers with its time alone.
		r.Job = createdJob(p, r.Now)
		r.Attempt = attemptNumbered(r.Job, 1)
		l.saw(r.Job)
		return r, nil
	}
	if len(a) < 5 {
		return ledger.Reservation{}, errReply("reserve", a)
	}
	if r.Job, err = scriptJob("reserve", a[2], a[3]); err != nil {
		return ledger.Reservation{}, err
	}
	l.saw(r.Job)
	switch r.Outcome {
	case ledger.Created, ledger.Reopened:
		n, _ := a[4].(int64)
		if r.Attempt = attemptNumbered(r.Job, int(n)); r.Attempt == nil {
			return ledger.Reservation{}, fmt.Errorf("redis ledger: reserve: attempt %d missing", n)
		}
	case ledger.InFlight, ledger.Unknown:
		r.Attempt = fsm.Blocking(r.Job)
	}
	return r, nil
}

// createdJob is the job reserve.lua creates for p at now, as the ledger
// would read it back: the fsm's new job, with its durations cut to whole
// microseconds as the scripts keep them.
func createdJob(p ledger.ReserveParams, now time.Time) *ledger.Job {
	p.Retention = p.Retention.Truncate(time.Microsecond)
	p.Attempt.Lease = p.Attempt.Lease.Truncate(time.Microsecond)
	return fsm.NewJob(p, now)
}

// Hedge implements ledger.Ledger.
func (l *Ledger) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return l.start(ctx, "hedge", ref, next, "")
}

// Resend implements ledger.Ledger.
func (l *Ledger) Resend(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return l.start(ctx, "resend", ref, next, ref.AttemptID)
}

// start runs start.lua: a hedge, or a re-send reconciling the attempt
// reconciles.
func (l *Ledger) start(ctx context.Context, op string, ref ledger.AttemptRef, next ledger.NextAttempt, reconciles string) (ledger.Attempt, error) {
	if !validID(ref.JobID) {
		return ledger.Attempt{}, ledger.ErrNotFound
	}
	if next.ID == "" {
		return ledger.Attempt{}, errNoIDs(op)
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return ledger.Attempt{}, err
	}
	outcome, a, err := l.run(ctx, op, l.scripts.start,
		[]string{jobKey(bp, ref.JobID), attemptsKey(bp, ref.JobID), leasesKey(bp), expiryKey(bp)},
		bp, strconv.FormatInt(ref.Version, 10), next.ID, next.Provider, micros(next.Lease), reconciles, next.Scope)
	if err != nil {
		return ledger.Attempt{}, err
	}
	switch outcome {
	case "ok":
		at, err := replyAttempt(op, ref.JobID, a)
		if err != nil {
			return ledger.Attempt{}, err
		}
		return *at, nil
	case "not_found":
		return ledger.Attempt{}, ledger.ErrNotFound
	case "stale":
		return ledger.Attempt{}, ledger.ErrStale
	}
	return ledger.Attempt{}, errUnexpected(op, outcome)
}

// replyAttempt reads {outcome, now, attempt} (attempt_reply in lib.lua).
func replyAttempt(what, jobID string, a []any) (*ledger.Attempt, error) {
	if len(a) < 3 {
		return nil, errReply(what, a)
	}
	return scriptAttempt(what, jobID, a[2])
}

// Complete implements ledger.Ledger.
func (l *Ledger) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	if !validID(ref.JobID) {
		return ledger.Completion{}, ledger.ErrNotFound
	}
	header, err := encodeHeader(resp.Header)
	if err != nil {
		return ledger.Completion{}, err
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return ledger.Completion{}, err
	}
	body, stored := []byte(nil), "0"
	if resp.Stored {
		body, stored = resp.Body, "1"
	}
	outcome, a, err := l.run(ctx, "complete", l.scripts.complete,
		[]string{jobKey(bp, ref.JobID), attemptsKey(bp, ref.JobID), leasesKey(bp), expiryKey(bp)},
		bp, ref.AttemptID, strconv.FormatInt(ref.Version, 10), strconv.Itoa(resp.Status), header,
		body, strconv.FormatInt(resp.Size, 10), stored)
	if err != nil {
		return ledger.Completion{}, err
	}
	switch outcome {
	case "won", "lost":
	case "not_found":
		return ledger.Completion{}, ledger.ErrNotFound
	default:
		return ledger.Completion{}, errUnexpected("complete", outcome)
	}
	if len(a) < 4 {
		return ledger.Completion{}, errReply("complete", a)
	}
	j, err := scriptJob("complete", a[2], a[3])
	if err != nil {
		return ledger.Completion{}, err
	}
	j.ReadAt = nowOf(a, 1) // the job as this call left it, by the ledger's clock
	won := outcome == "won"
	if fields, _ := array(a[2]); won && len(fields) <= len(jobFields) && j.Response != nil && j.Response.Stored {
		// The script does not send the body back when it just took the
		// slot: it is the one just sent.
		j.Response.Body = resp.Body
	}
	return ledger.Completion{Won: won, Job: j}, nil
}

// SaveBody implements ledger.Ledger.
func (l *Ledger) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	if !validID(ref.JobID) {
		return ledger.ErrNotFound
	}
	s := "0"
	if stored {
		s = "1"
	} else {
		body = nil
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return err
	}
	outcome, _, err := l.run(ctx, "save body", l.scripts.saveBody, []string{jobKey(bp, ref.JobID)},
		ref.AttemptID, body, strconv.FormatInt(size, 10), s, bp)
	if err != nil {
		return err
	}
	return outcomeError("save body", outcome)
}

// Fail implements ledger.Ledger.
func (l *Ledger) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	if !validID(ref.JobID) {
		return nil, ledger.ErrNotFound
	}
	hasNext, nextID, provider, lease, scope := "0", "", "", "0", ""
	if next != nil {
		if next.ID == "" {
			return nil, errNoIDs("fail")
		}
		hasNext, nextID, provider, lease, scope = "1", next.ID, next.Provider, micros(next.Lease), next.Scope
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return nil, err
	}
	outcome, a, err := l.run(ctx, "fail", l.scripts.fail,
		[]string{jobKey(bp, ref.JobID), attemptsKey(bp, ref.JobID), leasesKey(bp), expiryKey(bp)},
		bp, ref.AttemptID, reason, hasNext, nextID, provider, lease, scope)
	if err != nil {
		return nil, err
	}
	if outcome == "next" {
		return replyAttempt("fail", ref.JobID, a)
	}
	return nil, outcomeError("fail", outcome)
}

// Unsent implements ledger.Ledger.
func (l *Ledger) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	if !validID(ref.JobID) {
		return ledger.ErrNotFound
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return err
	}
	outcome, _, err := l.run(ctx, "unsent", l.scripts.unsent,
		[]string{jobKey(bp, ref.JobID), attemptsKey(bp, ref.JobID), leasesKey(bp), expiryKey(bp)},
		bp, ref.AttemptID, ledger.ReasonUnsent)
	if err != nil {
		return err
	}
	return outcomeError("unsent", outcome)
}

// MarkUnknown implements ledger.Ledger.
func (l *Ledger) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	if !validID(ref.JobID) {
		return ledger.ErrNotFound
	}
	bp, err := l.where(ctx, ref.JobID)
	if err != nil {
		return err
	}
	outcome, _, err := l.run(ctx, "mark unknown", l.scripts.markUnknown,
		[]string{jobKey(bp, ref.JobID), attemptsKey(bp, ref.JobID), leasesKey(bp)},
		bp, ref.AttemptID, reason)
	if err != nil {
		return err
	}
	return outcomeError("mark unknown", outcome)
}

// Resolve implements ledger.Ledger.
func (l *Ledger) Resolve(ctx context.Context, jobID string, r ledger.Resolution) (*ledger.Job, error) {
	if !validID(jobID) {
		return nil, ledger.ErrNotFound
	}
	cancel, status, header, body := "1", "0", "", []byte(nil)
	if !r.Cancel && r.Response != nil {
		var err error
		if header, err = encodeHeader(r.Response.Header); err != nil {
			return nil, err
		}
		cancel, status, body = "0", strconv.Itoa(r.Response.Status), r.Response.Body
		if r.AttemptID == "" {
			return nil, errNoIDs("resolve")
		}
	}
	bp, err := l.where(ctx, jobID)
	if err != nil {
		return nil, err
	}
	outcome, a, err := l.run(ctx, "resolve", l.scripts.resolve,
		[]string{jobKey(bp, jobID), attemptsKey(bp, jobID), leasesKey(bp), expiryKey(bp)},
		bp, cancel, r.AttemptID, status, header, body)
	if err != nil {
		return nil, err
	}
	if outcome != "ok" {
		return nil, outcomeError("resolve", outcome)
	}
	if len(a) < 4 {
		return nil, errReply("resolve", a)
	}
	return scriptJob("resolve", a[2], a[3])
}

// Sweep implements ledger.Ledger: in every bucket one script finds up to
// limit expired leases and expired jobs by the server's clock (the scans
// of all buckets in one pipeline), and a second one (naming every key it
// touches) records the leases and removes the jobs, up to limit jobs in
// all.
func (l *Ledger) Sweep(ctx context.Context, limit int) (ledger.SweepStats, error) {
	var st ledger.SweepStats
	if limit <= 0 {
		return st, nil
	}
	scans := make([]*redis.Cmd, len(l.buckets))
	if len(l.buckets) == 1 {
		scans[0] = l.eval(ctx, l.scripts.sweepScan, []string{leasesKey(l.buckets[0]), expiryKey(l.buckets[0])}, strconv.Itoa(limit))
	} else {
		// Reads only: a pipeline, split by node.
		_, _ = l.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, bp := range l.buckets {
				scans[i] = p.EvalSha(ctx, l.scripts.sweepScan.Hash(), []string{leasesKey(bp), expiryKey(bp)}, strconv.Itoa(limit))
			}
			return nil
		})
	}
	// A bucket that fails (its master is away) does not keep the others
	// from being swept: the first error is returned after them.
	budget := limit
	var first error
	for i, bp := range l.buckets {
		v, err := scans[i].Result()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = l.eval(ctx, l.scripts.sweepScan, []string{leasesKey(bp), expiryKey(bp)}, strconv.Itoa(limit)).Result()
		}
		if err != nil {
			first = cmp.Or(first, fmt.Errorf("redis ledger: sweep: %w", err))
			continue
		}
		scan, ok := array(v)
		if !ok || len(scan) != 2 {
			first = cmp.Or(first, errReply("sweep", v))
			continue
		}
		leased, _ := array(scan[0])
		expired, _ := array(scan[1])
		expired = expired[:min(len(expired), budget)]
		if len(leased) == 0 && len(expired) == 0 {
			continue
		}
		b, err := l.sweepBucket(ctx, bp, leased, expired)
		if err != nil {
			first = cmp.Or(first, err)
			continue
		}
		st.Unknown += b.Unknown
		st.Removed += b.Removed
		budget -= len(expired)
	}
	return st, first
}

// sweepBucket records the expired leases and removes the expired jobs a
// scan of bucket bp found.
func (l *Ledger) sweepBucket(ctx context.Context, bp string, leased, expired []any) (ledger.SweepStats, error) {
	var st ledger.SweepStats
	keys := []string{idxKey(bp), leasesKey(bp), expiryKey(bp)}
	args := []any{bp, strconv.Itoa(len(leased)), strconv.Itoa(len(expired))}
	for _, x := range leased {
		id, _ := str(x)
		keys = append(keys, jobKey(bp, id), attemptsKey(bp, id))
		args = append(args, id)
	}
	for _, x := range expired {
		m, _ := str(x)
		id, ident, _ := strings.Cut(m, "|")
		keys = append(keys, jobKey(bp, id), attemptsKey(bp, id), identKey(bp, ident))
		args = append(args, m)
	}
	v, err := l.eval(ctx, l.scripts.sweep, keys, args...).Result()
	if err != nil {
		return st, fmt.Errorf("redis ledger: sweep: %w", err)
	}
	res, ok := array(v)
	if !ok || len(res) != 2 {
		return st, errReply("sweep", v)
	}
	u, _ := res[0].(int64)
	r, _ := res[1].(int64)
	st.Unknown, st.Removed = int(u), int(r)
	return st, nil
}

// outcomeError maps a transition's outcome name to the ledger's error.
func outcomeError(transition, outcome string) error {
	return fsm.OutcomeError("redis ledger", transition, outcome)
}
