package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/near"
)

// run runs a script and returns its reply as an array with a string
// outcome first.
func (l *Ledger) run(ctx context.Context, what string, s script, keys []string, args ...any) (string, []any, error) {
	v, err := s.Run(ctx, l.client, keys, args...).Result()
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

func errUnexpected(what, outcome string) error {
	return fmt.Errorf("redis ledger: %s returned unexpected outcome %q", what, outcome)
}

// Reserve implements ledger.Ledger. A replay of a completed job this
// process read lately is answered from memory: the job cannot change before
// it expires (see near.Margin).
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	key, now := near.Key(p.OwnerHash, p.KeyHash), time.Now()
	if j := l.replays.Get(key, now); j != nil {
		return near.Answer(j, &p, now), nil
	}
	r, err := l.reserve(ctx, p)
	if err != nil {
		return r, err
	}
	return l.replays.Remember(key, r, &p, near.Margin), nil
}

// reserve runs the reservation in the ledger.
func (l *Ledger) reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	ident := identity(p.OwnerHash, p.KeyHash)
	jobID, attemptID := ledger.NewID(), ledger.NewID()
	keys := []string{l.identKey(ident), l.jobKey(jobID), l.attemptsKey(jobID), l.idxKey(), l.leasesKey(), l.expiryKey()}
	outcome, a, err := l.run(ctx, "reserve", scripts.reserve, keys,
		l.prefix, jobID, attemptID, p.OwnerHash, p.KeyHash, ident, p.Fingerprint,
		strconv.Itoa(p.FingerprintVersion), p.Attempt.Provider, micros(p.Attempt.Lease), micros(p.Retention))
	if err != nil {
		return ledger.Reservation{}, err
	}
	r := ledger.Reservation{Now: nowOf(a, 1)}
	var ok bool
	if r.Outcome, ok = ledger.ParseOutcome(outcome); !ok {
		return ledger.Reservation{}, errUnexpected("reserve", outcome)
	}
	if r.Outcome == ledger.Mismatch {
		// Only the id and state: never the other request's answer.
		vals, ok := array(a[2])
		if !ok || len(vals) < 3 {
			return ledger.Reservation{}, errReply("reserve", a[2])
		}
		m := zipFields([]string{"id", "state", "created"}, vals)
		r.Job = &ledger.Job{ID: m["id"], State: ledger.JobState(m["state"]), CreatedAt: timeOf(m["created"])}
		return r, nil
	}
	if len(a) < 5 {
		return ledger.Reservation{}, errReply("reserve", a)
	}
	if r.Job, err = scriptJob("reserve", a[2], a[3]); err != nil {
		return ledger.Reservation{}, err
	}
	switch r.Outcome {
	case ledger.Created, ledger.Reopened:
		n, _ := a[4].(int64)
		if r.Attempt = attemptNumbered(r.Job, int(n)); r.Attempt == nil {
			return ledger.Reservation{}, fmt.Errorf("redis ledger: reserve: attempt %d missing", n)
		}
	case ledger.InFlight, ledger.Unknown:
		r.Attempt = blocking(r.Job)
	}
	return r, nil
}

// Hedge implements ledger.Ledger.
func (l *Ledger) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	if !validID(ref.JobID) {
		return ledger.Attempt{}, ledger.ErrNotFound
	}
	id := ledger.NewID()
	outcome, a, err := l.run(ctx, "hedge", scripts.hedge,
		[]string{l.jobKey(ref.JobID), l.attemptsKey(ref.JobID), l.leasesKey()},
		l.prefix, strconv.FormatInt(ref.Version, 10), id, next.Provider, micros(next.Lease))
	if err != nil {
		return ledger.Attempt{}, err
	}
	switch outcome {
	case "ok":
		return newAttempt(ref.JobID, id, next.Provider, a), nil
	case "not_found":
		return ledger.Attempt{}, ledger.ErrNotFound
	case "stale":
		return ledger.Attempt{}, ledger.ErrStale
	}
	return ledger.Attempt{}, errUnexpected("hedge", outcome)
}

// newAttempt reads {outcome, now, number, job version, deadline}.
func newAttempt(jobID, id, provider string, a []any) ledger.Attempt {
	at := ledger.Attempt{ID: id, JobID: jobID, Provider: provider, State: ledger.AttemptStarting, StartedAt: nowOf(a, 1)}
	if len(a) >= 5 {
		n, _ := str(a[2])
		v, _ := str(a[3])
		dl, _ := str(a[4])
		at.Number, _ = strconv.Atoi(n)
		at.JobVersion = int64Of(v)
		at.Deadline = timeOf(dl)
	}
	return at
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
	body, stored := []byte(nil), "0"
	if resp.Stored {
		body, stored = resp.Body, "1"
	}
	outcome, a, err := l.run(ctx, "complete", scripts.complete,
		[]string{l.jobKey(ref.JobID), l.attemptsKey(ref.JobID), l.leasesKey(), l.expiryKey()},
		l.prefix, ref.AttemptID, strconv.FormatInt(ref.Version, 10), strconv.Itoa(resp.Status), header,
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
	won := outcome == "won"
	if won && j.Response != nil && j.Response.Stored {
		// The script does not send the body back: it is the one just sent.
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
	outcome, _, err := l.run(ctx, "save body", scripts.saveBody, []string{l.jobKey(ref.JobID)},
		ref.AttemptID, body, strconv.FormatInt(size, 10), s)
	if err != nil {
		return err
	}
	return simpleOutcome("save body", outcome)
}

func simpleOutcome(what, outcome string) error {
	switch outcome {
	case "ok":
		return nil
	case "not_found":
		return ledger.ErrNotFound
	case "stale":
		return ledger.ErrStale
	case "blocked":
		return ledger.ErrBlocked
	case "completed":
		return ledger.ErrCompleted
	}
	return errUnexpected(what, outcome)
}

// Fail implements ledger.Ledger.
func (l *Ledger) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	if !validID(ref.JobID) {
		return nil, ledger.ErrNotFound
	}
	hasNext, nextID, provider, lease := "0", "", "", "0"
	if next != nil {
		hasNext, nextID, provider, lease = "1", ledger.NewID(), next.Provider, micros(next.Lease)
	}
	outcome, a, err := l.run(ctx, "fail", scripts.fail,
		[]string{l.jobKey(ref.JobID), l.attemptsKey(ref.JobID), l.leasesKey(), l.expiryKey()},
		l.prefix, ref.AttemptID, reason, hasNext, nextID, provider, lease)
	if err != nil {
		return nil, err
	}
	if outcome == "next" {
		at := newAttempt(ref.JobID, nextID, provider, a)
		return &at, nil
	}
	return nil, simpleOutcome("fail", outcome)
}

// MarkUnknown implements ledger.Ledger.
func (l *Ledger) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	if !validID(ref.JobID) {
		return ledger.ErrNotFound
	}
	outcome, _, err := l.run(ctx, "mark unknown", scripts.markUnknown,
		[]string{l.jobKey(ref.JobID), l.attemptsKey(ref.JobID), l.leasesKey()},
		l.prefix, ref.AttemptID, reason)
	if err != nil {
		return err
	}
	return simpleOutcome("mark unknown", outcome)
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
	}
	outcome, a, err := l.run(ctx, "resolve", scripts.resolve,
		[]string{l.jobKey(jobID), l.attemptsKey(jobID), l.leasesKey(), l.expiryKey()},
		l.prefix, cancel, ledger.NewID(), status, header, body)
	if err != nil {
		return nil, err
	}
	if outcome != "ok" {
		return nil, simpleOutcome("resolve", outcome)
	}
	if len(a) < 4 {
		return nil, errReply("resolve", a)
	}
	return scriptJob("resolve", a[2], a[3])
}

// Sweep implements ledger.Ledger: one script finds up to limit expired
// leases and expired jobs by the server's clock, a second one (naming every
// key it touches) records and removes them.
func (l *Ledger) Sweep(ctx context.Context, limit int) (ledger.SweepStats, error) {
	var st ledger.SweepStats
	if limit <= 0 {
		return st, nil
	}
	v, err := scripts.sweepScan.Run(ctx, l.client, []string{l.leasesKey(), l.expiryKey()}, strconv.Itoa(limit)).Result()
	if err != nil {
		return st, fmt.Errorf("redis ledger: sweep: %w", err)
	}
	scan, ok := array(v)
	if !ok || len(scan) != 2 {
		return st, errReply("sweep", v)
	}
	leased, _ := array(scan[0])
	expired, _ := array(scan[1])
	if len(leased) == 0 && len(expired) == 0 {
		return st, nil
	}
	keys := []string{l.idxKey(), l.leasesKey(), l.expiryKey()}
	args := []any{l.prefix, strconv.Itoa(len(leased)), strconv.Itoa(len(expired))}
	for _, x := range leased {
		id, _ := str(x)
		keys = append(keys, l.jobKey(id), l.attemptsKey(id))
		args = append(args, id)
	}
	for _, x := range expired {
		m, _ := str(x)
		id, ident, _ := strings.Cut(m, "|")
		keys = append(keys, l.jobKey(id), l.attemptsKey(id), l.identKey(ident))
		args = append(args, m)
	}
	v, err = scripts.sweep.Run(ctx, l.client, keys, args...).Result()
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
