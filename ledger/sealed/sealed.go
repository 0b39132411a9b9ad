// Package sealed keeps the stored answers of any ledger encrypted at rest:
// a Ledger that wraps another and seals each answer's header and body
// (AES-256-GCM) on its way in (Complete, SaveBody, Resolve) and opens them
// on every read that returns a job (Reserve, Complete, Resolve, Job, Find,
// Jobs, Wait).
//
// It is a decorator rather than a feature of each backend so that one
// piece of code, with one set of tests, covers every ledger (the four of
// this repository, a third party's, and the replay cache, which then holds
// only what the ledger holds): a backend stores a sealed answer as it
// stores any other, as opaque bytes and a header map, and needs no change.
// Only what could hold a secret is sealed; the status, size and whether the
// body was stored stay in clear, as do the job's identity (already hashes)
// and its attempts, which the admin API and the sweeper read without keys.
//
// Each sealed value carries a format marker and the id of the key that
// sealed it (see format.go): answers stored in clear before encryption was
// turned on still replay, and a Keyring of several keys seals with the
// first and opens with whichever one a value names, so keys rotate without
// a migration. A value that names a key the keyring lacks, or that does
// not open (altered, or moved from another job), is an error: the gateway
// fails closed rather than replay it.
//
// Replays are byte-identical: the opened header map and body are those
// that were sealed.
package sealed

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/onejob/onejob/ledger"
)

// Ledger seals the answers stored in the ledger it wraps.
type Ledger struct {
	inner ledger.Ledger
	keys  *Keyring
}

// New returns inner with its answers sealed by keys. Closing it closes
// inner.
func New(inner ledger.Ledger, keys *Keyring) *Ledger {
	return &Ledger{inner: inner, keys: keys}
}

// Inner returns the wrapped ledger.
func (l *Ledger) Inner() ledger.Ledger { return l.inner }

// open returns j with its answer opened: a copy when it was sealed (jobs
// read from a ledger are shared and read-only).
func (l *Ledger) open(j *ledger.Job) (*ledger.Job, error) {
	if j == nil || j.Response == nil || !Sealed(j.Response) {
		return j, nil
	}
	r, err := l.keys.OpenResponse(j.ID, j.Response)
	if err != nil {
		return nil, err
	}
	c := j.Clone()
	c.Response = r
	return c, nil
}

// Reserve reserves through the wrapped ledger and opens the answer of the
// job it found.
func (l *Ledger) Reserve(ctx context.Context, p ledger.ReserveParams) (ledger.Reservation, error) {
	r, err := l.inner.Reserve(ctx, p)
	if err != nil {
		return r, err
	}
	if r.Job, err = l.open(r.Job); err != nil {
		return ledger.Reservation{}, err
	}
	return r, nil
}

// Hedge starts a concurrent attempt; no answer is involved.
func (l *Ledger) Hedge(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return l.inner.Hedge(ctx, ref, next)
}

// Resend implements ledger.Ledger: an attempt holds no answer.
func (l *Ledger) Resend(ctx context.Context, ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	return l.inner.Resend(ctx, ref, next)
}

// Complete offers the sealed answer and opens the one the job holds after.
// The compare-and-swap's outcome stands even when the winner's answer does
// not open here (sealed with a key this keyring lacks): the job is then
// returned without its answer, so a loser learns that another answer won,
// never an error that would let it pass its own answer off as the job's.
func (l *Ledger) Complete(ctx context.Context, ref ledger.AttemptRef, resp ledger.Response) (ledger.Completion, error) {
	s, err := l.keys.SealResponse(ref.JobID, &resp)
	if err != nil {
		return ledger.Completion{}, err
	}
	c, err := l.inner.Complete(ctx, ref, *s)
	if err != nil {
		return c, err
	}
	opened, err := l.open(c.Job)
	if err != nil {
		opened = c.Job.Clone()
		opened.Response = nil
	}
	c.Job = opened
	return c, nil
}

// SaveBody stores the sealed body.
func (l *Ledger) SaveBody(ctx context.Context, ref ledger.AttemptRef, body []byte, size int64, stored bool) error {
	if stored {
		body = l.keys.sealBody(ref.JobID, body)
	}
	return l.inner.SaveBody(ctx, ref, body, size, stored)
}

// Fail records a definitive failure; no answer is stored.
func (l *Ledger) Fail(ctx context.Context, ref ledger.AttemptRef, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	return l.inner.Fail(ctx, ref, reason, next)
}

// Unsent records an attempt never sent.
func (l *Ledger) Unsent(ctx context.Context, ref ledger.AttemptRef) error {
	return l.inner.Unsent(ctx, ref)
}

// MarkUnknown records an unknown outcome.
func (l *Ledger) MarkUnknown(ctx context.Context, ref ledger.AttemptRef, reason string) error {
	return l.inner.MarkUnknown(ctx, ref, reason)
}

// Resolve settles a job, sealing an operator's answer, and opens the job's
// answer after.
func (l *Ledger) Resolve(ctx context.Context, jobID string, r ledger.Resolution) (*ledger.Job, error) {
	if r.Response != nil {
		s, err := l.keys.SealResponse(jobID, r.Response)
		if err != nil {
			return nil, err
		}
		r.Response = s
	}
	j, err := l.inner.Resolve(ctx, jobID, r)
	if err != nil && !errors.Is(err, ledger.ErrCompleted) {
		return j, err
	}
	o, oerr := l.open(j)
	if oerr != nil {
		return nil, oerr
	}
	return o, err
}

// ClaimLookup leases an unknown attempt and opens the job's answer.
func (l *Ledger) ClaimLookup(ctx context.Context, ref ledger.AttemptRef, holder string, lease time.Duration) (*ledger.Job, error) {
	j, err := l.inner.ClaimLookup(ctx, ref, holder, lease)
	if err != nil {
		return j, err
	}
	return l.open(j)
}

// SettleLookup seals the answer a lookup found and opens the job's.
func (l *Ledger) SettleLookup(ctx context.Context, ref ledger.AttemptRef, holder string, r ledger.LookupResult) (*ledger.Job, error) {
	if r.Found != nil {
		s, err := l.keys.SealResponse(ref.JobID, r.Found)
		if err != nil {
			return nil, err
		}
		r.Found = s
	}
	j, err := l.inner.SettleLookup(ctx, ref, holder, r)
	if err != nil {
		return j, err
	}
	return l.open(j)
}

// Job reads a job and opens its answer.
func (l *Ledger) Job(ctx context.Context, jobID string) (*ledger.Job, error) {
	j, err := l.inner.Job(ctx, jobID)
	if err != nil {
		return j, err
	}
	return l.open(j)
}

// Find reads a job by owner and key and opens its answer.
func (l *Ledger) Find(ctx context.Context, ownerHash, keyHash []byte) (*ledger.Job, error) {
	j, err := l.inner.Find(ctx, ownerHash, keyHash)
	if err != nil {
		return j, err
	}
	return l.open(j)
}

// Jobs lists jobs and opens their answers.
func (l *Ledger) Jobs(ctx context.Context, q ledger.JobQuery) (ledger.JobPage, error) {
	p, err := l.inner.Jobs(ctx, q)
	if err != nil {
		return p, err
	}
	jobs := make([]*ledger.Job, len(p.Jobs))
	for i, j := range p.Jobs {
		if jobs[i], err = l.open(j); err != nil {
			return ledger.JobPage{}, err
		}
	}
	p.Jobs = jobs
	return p, nil
}

// Wait waits through the wrapped ledger and opens the answer.
func (l *Ledger) Wait(ctx context.Context, jobID string) (*ledger.Job, error) {
	j, err := l.inner.Wait(ctx, jobID)
	if j == nil {
		return j, err
	}
	o, oerr := l.open(j)
	if oerr != nil {
		return nil, oerr
	}
	return o, err
}

// Sweep sweeps the wrapped ledger.
func (l *Ledger) Sweep(ctx context.Context, limit int) (ledger.SweepStats, error) {
	return l.inner.Sweep(ctx, limit)
}

// Purge purges the wrapped ledger, when it can.
func (l *Ledger) Purge(ctx context.Context, ownerHash []byte) (ledger.PurgeStats, error) {
	p, ok := l.inner.(ledger.Purger)
	if !ok {
		return ledger.PurgeStats{}, fmt.Errorf("sealed: the ledger %T cannot purge", l.inner)
	}
	return p.Purge(ctx, ownerHash)
}

// Close closes the wrapped ledger.
func (l *Ledger) Close() error { return l.inner.Close() }

// Local reports whether the ledger it seals is local (ledger.Local).
func (l *Ledger) Local() bool { return ledger.IsLocal(l.inner) }

// Interface guards
var (
	_ ledger.Ledger = (*Ledger)(nil)
	_ ledger.Purger = (*Ledger)(nil)
)
