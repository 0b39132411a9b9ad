package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/proxy"
)

// Reconciliation by lookup (docs/contract.md, section 4): every
// reconcile_every, each gateway instance walks its ledger's unknown jobs,
// takes the ledger's lease on one unknown attempt at a time whose
// attempt_deadline passed, asks the attempt's provider whether it acted,
// and settles the attempt by the answer. The lease, not this loop, makes
// sure two instances never look up the same attempt at once.

const (
	// maxLookupBackoff caps the wait between two lookups of one attempt.
	maxLookupBackoff = time.Hour
	// reconcilePage is how many unknown jobs one listing call reads.
	reconcilePage = 100
)

// Results of one lookup, the result label of reconciled_total.
const (
	reconcileCompleted = "completed" // it acted: the job completed with its answer
	reconcileFailed    = "failed"    // it did not: the attempt failed
	reconcilePending   = "pending"   // the answer did not say: looked up again later
	reconcileError     = "error"     // no answer, or the ledger refused the result
)

type reconciler struct {
	ledger    ledger.Ledger
	scope     string      // the handler's: only its attempts are looked up
	providers []*Provider // those with a lookup
	every     time.Duration
	timeout   time.Duration                                                 // one lookup's bound: attempt_timeout
	max       int64                                                         // the largest answer kept: max_response_body
	found     func(status int, h http.Header, body []byte) *ledger.Response // Middleware.Found
	metrics   *metrics
	logger    *zap.Logger
}

// start runs the reconciler until ctx ends.
func (rc *reconciler) start(ctx context.Context) {
	go everyTick(ctx, rc.every, func() { rc.round(ctx) })
}

// round looks up every unknown attempt that is due, provider by provider.
func (rc *reconciler) round(ctx context.Context) {
	for _, p := range rc.providers {
		q := ledger.JobQuery{State: ledger.JobUnknown, Provider: p.Name, Limit: reconcilePage}
		for {
			page, err := bounded(ctx, func(ctx context.Context) (ledger.JobPage, error) { return rc.ledger.Jobs(ctx, q) })
			if err != nil {
				if ctx.Err() == nil {
					rc.logger.Warn("reconciler: cannot list unknown jobs", zap.String("provider", p.Name), zap.Error(err))
				}
				return
			}
			for _, j := range page.Jobs {
				rc.job(ctx, p, j)
			}
			if page.Next == "" || ctx.Err() != nil {
				break
			}
			q.Before = page.Next
		}
	}
}

// job looks up j's attempts on p that are due: those sent to p by this
// handler, never another handler's on a provider of the same name.
func (rc *reconciler) job(ctx context.Context, p *Provider, j *ledger.Job) {
	if len(j.Attempts) == 0 { // a listing may leave them out
		var err error
		id := j.ID
		if j, err = bounded(ctx, func(ctx context.Context) (*ledger.Job, error) { return rc.ledger.Job(ctx, id) }); err != nil {
			return
		}
	}
	for i := range j.Attempts {
		if a := &j.Attempts[i]; a.SentTo(rc.scope, p.Name) && lookupDue(j, a) {
			rc.reconcile(ctx, p, a)
		}
	}
}

// lookupDue reports whether attempt a of j may be looked up now, as far as
// the copy read says; the ledger's claim decides.
func lookupDue(j *ledger.Job, a *ledger.Attempt) bool {
	if a.State != ledger.AttemptUnknown {
		return false
	}
	if now := j.ReadAt; !now.IsZero() {
		l := a.Lookups()
		return !now.Before(a.Deadline) && !now.Before(l.NextAt) && !now.Before(l.Until)
	}
	return true
}

// reconcile leases attempt a, looks it up and records what it found.
func (rc *reconciler) reconcile(ctx context.Context, p *Provider, a *ledger.Attempt) {
	holder := ledger.NewID()
	ref := a.Ref()
	if _, err := bounded(ctx, func(ctx context.Context) (*ledger.Job, error) {
		return rc.ledger.ClaimLookup(ctx, ref, holder, 2*rc.timeout)
	}); err != nil {
		if !errors.Is(err, ledger.ErrStale) && !errors.Is(err, ledger.ErrNotFound) && ctx.Err() == nil {
			rc.logger.Warn("reconciler: cannot lease an unknown attempt", zap.String("job_id", a.JobID),
				zap.String("attempt_id", a.ID), zap.Error(err))
		}
		return // another instance holds it, or it is not due
	}
	status, header, body, lerr := rc.lookup(ctx, p, a)
	res := ledger.LookupResult{Status: status}
	result := reconcilePending
	switch {
	case lerr != nil:
		result = reconcileError
	case slices.Contains(p.lookupAbsent(), status):
		res.Absent, result = true, reconcileFailed
	case status >= 200 && status <= 299:
		res.Found, result = rc.found(status, header, body), reconcileCompleted
	}
	if !res.Absent && res.Found == nil {
		res.Retry = lookupBackoff(rc.every, a.Lookups().Tries)
	}
	var err error
	for range 3 { // the transition is idempotent: a reply lost is asked again
		if _, err = bounded(ctx, func(ctx context.Context) (*ledger.Job, error) {
			return rc.ledger.SettleLookup(ctx, ref, holder, res)
		}); err == nil || errors.Is(err, ledger.ErrStale) || ctx.Err() != nil {
			break
		}
	}
	fields := []zap.Field{zap.String("provider", p.Name), zap.String("job_id", a.JobID), zap.String("attempt_id", a.ID),
		zap.String("result", result), zap.Int("status", status)}
	switch {
	case err != nil:
		rc.metrics.Reconciled(p.Name, reconcileError)
		rc.logger.Warn("reconciler: the lookup's result was not recorded", append(fields, zap.Error(err))...)
	case lerr != nil:
		rc.metrics.Reconciled(p.Name, result)
		rc.logger.Warn("reconciler: lookup got no answer", append(fields, zap.Error(lerr), zap.Duration("next_in", res.Retry))...)
	default:
		rc.metrics.Reconciled(p.Name, result)
		rc.logger.Info("reconciler: looked up an unknown attempt", fields...)
	}
}

// bounded runs one of the reconciler's ledger calls within
// proxy.LedgerTryTimeout: a link that swallows a call does not hold the
// round, which the next tick runs again.
func bounded[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, proxy.LedgerTryTimeout)
	defer cancel()
	return call(ctx)
}

// lookupBackoff is the wait before the next lookup of an attempt looked up
// tries times already: every, doubled each time, capped.
func lookupBackoff(every time.Duration, tries int) time.Duration {
	d := every
	for range min(tries, 16) {
		if d *= 2; d >= maxLookupBackoff {
			return maxLookupBackoff
		}
	}
	return d
}

// lookupAbsent returns the statuses that mean the provider never acted.
func (p *Provider) lookupAbsent() []int {
	if len(p.Lookup.Absent) == 0 {
		return defaultAbsent
	}
	return p.Lookup.Absent
}

// lookup sends p's lookup for attempt a through p's routes, in process, and
// returns its answer; an error when it got none or a larger one than kept.
func (rc *reconciler) lookup(ctx context.Context, p *Provider, a *ledger.Attempt) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, rc.timeout)
	defer cancel()
	repl := caddy.NewReplacer()
	attempt := strconv.Itoa(a.Number)
	for _, prefix := range []string{"idempotency.", "http.idempotency."} {
		repl.Set(prefix+"job_id", a.JobID)
		repl.Set(prefix+"attempt", attempt)
	}
	uri := repl.ReplaceKnown(p.Lookup.URI, "")
	header := http.Header{proxy.HeaderJobID: {a.JobID}, proxy.HeaderAttempt: {attempt}}
	rec, err := sendInProcess(ctx, p, p.Lookup.Method, uri, header, nil, repl, rc.max)
	if rec == nil {
		return 0, nil, nil, fmt.Errorf("lookup URI %q: %w", uri, err)
	}
	switch {
	case err != nil && (rec.status == 0 || errors.Is(err, errAborted)):
		return 0, nil, nil, err
	case rec.status == 0:
		return 0, nil, nil, errors.New("no answer")
	case rec.overflow:
		return rec.status, nil, nil, errors.New("answer larger than max_response_body")
	}
	return rec.status, rec.header, rec.body.Bytes(), nil
}
