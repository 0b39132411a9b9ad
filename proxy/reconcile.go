package proxy

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/internal/tick"
	"github.com/onejob/onejob/ledger"
)

// Reconciliation by lookup (docs/contract.md, section 4): every
// ReconcileEvery, a reconciler walks its ledger's unknown jobs, takes the
// ledger's lease on one unknown attempt at a time whose attempt_deadline
// passed, asks the attempt's provider whether it acted, and settles the
// attempt by the answer. The lease, not this loop, makes sure two
// instances never look up the same attempt at once.

const (
	// maxLookupBackoff caps the wait between two lookups of one attempt.
	maxLookupBackoff = time.Hour
	// reconcilePage is how many unknown jobs one listing call reads.
	reconcilePage = 100
)

// Results of one lookup, as Reconciler.Reconciled reports them.
const (
	ReconcileCompleted = "completed" // it acted: the job completed with its answer
	ReconcileFailed    = "failed"    // it did not: the attempt failed
	ReconcilePending   = "pending"   // the answer did not say: looked up again later
	ReconcileError     = "error"     // no answer, or the ledger refused the result
)

// DefaultLookupAbsent is the status a lookup answers for an attempt the
// provider never saw.
var DefaultLookupAbsent = []int{http.StatusNotFound}

// A Lookup asks one provider of a scope whether it acted on an attempt.
type Lookup struct {
	// Provider is the provider's name, as the attempts record it.
	Provider string
	// Absent are the statuses that mean the provider never acted; default
	// DefaultLookupAbsent. A 2xx means it acted; any other status leaves
	// the attempt unknown until the next lookup.
	Absent []int
	// Send sends the lookup of attempt a and returns its answer, or an
	// error when it got none it can use.
	Send func(ctx context.Context, a *ledger.Attempt) (status int, header http.Header, body []byte, err error)
}

// Reconciler settles the unknown attempts of one handler scope by their
// providers' lookups. Middleware.Reconciler returns one configured as the
// middleware is.
type Reconciler struct {
	Ledger  ledger.Ledger
	Scope   string   // only the attempts sent under it are looked up
	Lookups []Lookup // the providers that have one
	Every   time.Duration
	Timeout time.Duration // one lookup's bound
	// Found returns the answer a lookup found as the ledger keeps it.
	Found func(status int, header http.Header, body []byte) *ledger.Response
	// Reconciled, when set, is told the result of every lookup.
	Reconciled func(provider, result string)
	Logger     *zap.Logger
}

// Reconciler returns the reconciler of m's scope for lookups, with m's
// ledger, timing and logger.
func (m *Middleware) Reconciler(lookups []Lookup) *Reconciler {
	return &Reconciler{
		Ledger:  m.cfg.Ledger,
		Scope:   m.cfg.Scope,
		Lookups: lookups,
		Every:   m.cfg.ReconcileEvery,
		Timeout: m.cfg.AttemptTimeout,
		Found:   m.Found,
		Logger:  m.cfg.Logger,
	}
}

// Run runs a round every rc.Every until ctx ends.
func (rc *Reconciler) Run(ctx context.Context) {
	tick.Every(ctx, rc.Every, func() { rc.Round(ctx) })
}

// Round looks up every unknown attempt that is due, provider by provider.
func (rc *Reconciler) Round(ctx context.Context) {
	for i := range rc.Lookups {
		p := &rc.Lookups[i]
		q := ledger.JobQuery{State: ledger.JobUnknown, Provider: p.Provider, Limit: reconcilePage}
		for {
			page, err := bounded(ctx, func(ctx context.Context) (ledger.JobPage, error) { return rc.Ledger.Jobs(ctx, q) })
			if err != nil {
				if ctx.Err() == nil {
					rc.Logger.Warn("reconciler: cannot list unknown jobs", zap.String("provider", p.Provider), zap.Error(err))
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

// job looks up j's attempts on p that are due: those sent to p under this
// scope, never another scope's on a provider of the same name.
func (rc *Reconciler) job(ctx context.Context, p *Lookup, j *ledger.Job) {
	if len(j.Attempts) == 0 { // a listing may leave them out
		var err error
		id := j.ID
		if j, err = bounded(ctx, func(ctx context.Context) (*ledger.Job, error) { return rc.Ledger.Job(ctx, id) }); err != nil {
			return
		}
	}
	for i := range j.Attempts {
		if a := &j.Attempts[i]; a.SentTo(rc.Scope, p.Provider) && lookupDue(j, a) {
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
func (rc *Reconciler) reconcile(ctx context.Context, p *Lookup, a *ledger.Attempt) {
	holder := ledger.NewID()
	ref := a.Ref()
	claimed, err := bounded(ctx, func(ctx context.Context) (*ledger.Job, error) {
		return rc.Ledger.ClaimLookup(ctx, ref, holder, 2*rc.Timeout)
	})
	if err != nil {
		if !errors.Is(err, ledger.ErrStale) && !errors.Is(err, ledger.ErrNotFound) && ctx.Err() == nil {
			rc.Logger.Warn("reconciler: cannot lease an unknown attempt", zap.String("job_id", a.JobID),
				zap.String("attempt_id", a.ID), zap.Error(err))
		}
		return // another instance holds it, or it is not due
	}
	lctx, cancel := context.WithTimeout(ctx, rc.Timeout)
	status, header, body, lerr := p.Send(lctx, a)
	cancel()
	absent := p.Absent
	if len(absent) == 0 {
		absent = DefaultLookupAbsent
	}
	res := ledger.LookupResult{Status: status}
	result, held := ReconcilePending, false
	switch {
	case lerr != nil:
		result = ReconcileError
	case slices.Contains(absent, status):
		res.Absent, result = true, ReconcileFailed
	case status >= 200 && status <= 299 && anotherMayHaveAnswered(claimed, a):
		// Which answer its client got, this lookup cannot say: the job
		// waits until the other attempts are settled (or an operator).
		held = true
	case status >= 200 && status <= 299:
		res.Found, result = rc.Found(status, header, body), ReconcileCompleted
	}
	if !res.Absent && res.Found == nil {
		res.Retry = lookupBackoff(rc.Every, a.Lookups().Tries)
	}
	for range 3 { // the transition is idempotent: a reply lost is asked again
		if _, err = bounded(ctx, func(ctx context.Context) (*ledger.Job, error) {
			return rc.Ledger.SettleLookup(ctx, ref, holder, res)
		}); err == nil || errors.Is(err, ledger.ErrStale) || ctx.Err() != nil {
			break
		}
	}
	fields := []zap.Field{zap.String("provider", p.Provider), zap.String("job_id", a.JobID), zap.String("attempt_id", a.ID),
		zap.String("result", result), zap.Int("status", status)}
	if err != nil {
		result = ReconcileError
	}
	if rc.Reconciled != nil {
		rc.Reconciled(p.Provider, result)
	}
	switch {
	case err != nil:
		rc.Logger.Warn("reconciler: the lookup's result was not recorded", append(fields, zap.Error(err))...)
	case lerr != nil:
		rc.Logger.Warn("reconciler: lookup got no answer", append(fields, zap.Error(lerr), zap.Duration("next_in", res.Retry))...)
	case held:
		rc.Logger.Warn("reconciler: the provider acted, but another attempt of the job may have answered its client; looked up again later",
			append(fields, zap.Duration("next_in", res.Retry))...)
	default:
		rc.Logger.Info("reconciler: looked up an unknown attempt", fields...)
	}
}

// anotherMayHaveAnswered reports whether an attempt of j other than a may
// have given its client an answer the ledger does not hold: one that is
// unknown, still running, or lost (its answer came after the job was
// settled). A hedged job's attempts run at once; completing it with a's
// answer could contradict what its client already got. With no job to
// look at, it cannot tell, and says so.
func anotherMayHaveAnswered(j *ledger.Job, a *ledger.Attempt) bool {
	if j == nil {
		return true
	}
	return slices.ContainsFunc(j.Attempts, func(b ledger.Attempt) bool {
		return b.ID != a.ID && (b.State == ledger.AttemptUnknown || b.State == ledger.AttemptStarting || b.State == ledger.AttemptLost)
	})
}

// bounded runs one of the reconciler's ledger calls within
// LedgerTryTimeout: a link that swallows a call does not hold the round,
// which the next tick runs again.
func bounded[T any](ctx context.Context, call func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, LedgerTryTimeout)
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
