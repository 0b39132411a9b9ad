package proxy

import (
	"context"
	"encoding/hex"
	"errors"
	"net/http"
	"time"

	"github.com/onejob/onejob/ledger"
	"go.opentelemetry.io/otel/trace"
)

// reserve records in's intent in the ledger: it fingerprints the request,
// asks the ledger to reserve its owner and key, and, when the job there was
// fingerprinted another way (an earlier configuration or release), asks
// again with the request fingerprinted as its job was. issued is when the
// reservation that counts was sent: its attempt's lease is timed from it
// (leaseEnd). When the ledger does not answer, or answers too late to send
// the attempt, the reservation may have been made anyway: its attempt is
// recorded as never sent as soon as the ledger answers.
func (m *Middleware) reserve(r *http.Request, in *incoming) (res ledger.Reservation, issued time.Time, err error) {
	uri := m.cfg.OriginalURI(r)
	params := ledger.ReserveParams{
		JobID:              ledger.NewID(),
		OwnerHash:          m.hasher.Owner(in.owner),
		Fingerprint:        m.fp.SumGraphQL(r.Method, uri, r.Header, in.graphql, in.body),
		FingerprintVersion: m.fp.Version(),
		FingerprintScheme:  m.fp.Scheme(),
		Retention:          m.cfg.Retention,
		Attempt:            m.newAttempt(m.cfg.Providers[0].Name),
	}
	key := in.key
	if in.implicit {
		key, params.Retention = ImplicitKey(params.Fingerprint), m.cfg.ImplicitKey
	}
	params.KeyHash = m.hasher.Key(key)
	// A ledger that does not answer is a ledger that cannot reserve: the
	// wait is bounded, like every ledger call of an attempt, and ends in a
	// 503 rather than holding the client (and a goroutine) indefinitely.
	call := func(ctx context.Context) (ledger.Reservation, error) {
		r, err := m.cfg.Ledger.Reserve(ctx, params)
		params.Repeat = true // every later call with these ids may repeat this one
		return r, err
	}
	ctx, span := startSpan(r.Context(), spanReserve)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(hashAttr(attrOwnerHash, params.OwnerHash), hashAttr(attrKeyHash, params.KeyHash))
		defer func() { endReserve(span, res, err) }()
	}
	issued = time.Now()
	res, err = ledgerCall(m, ctx, "reserve", call)
	if err == nil && res.Outcome == ledger.Mismatch {
		if g, ok := m.fp.ForJob(res.Job.FingerprintVersion, res.Job.FingerprintScheme); ok &&
			(g.Version() != params.FingerprintVersion || g.Scheme() != params.FingerprintScheme) {
			if g.Mode() == m.fp.Mode() {
				params.Fingerprint = g.SumGraphQL(r.Method, uri, r.Header, in.graphql, in.body)
			} else {
				params.Fingerprint = g.Sum(r.Method, uri, r.Header, in.body)
			}
			params.FingerprintVersion, params.FingerprintScheme = g.Version(), g.Scheme()
			issued = time.Now()
			res, err = ledgerCall(m, ctx, "reserve", call)
		}
	}
	if err == nil && (res.Outcome == ledger.Created || res.Outcome == ledger.Reopened) && !sendable(res) {
		// A repeat that came too late: the attempt's lease ran out before
		// the gateway could send it.
		err = errors.New("the reservation's lease ran out before its answer came")
	}
	if err != nil {
		m.unsent(unsentWork{reserve: &params})
		return ledger.Reservation{}, issued, err
	}
	return res, issued, nil
}

// endReserve records on the reservation's span what the ledger said.
func endReserve(span trace.Span, res ledger.Reservation, err error) {
	if err != nil {
		failSpan(span, err)
		return
	}
	span.SetAttributes(attrOutcome.String(res.Outcome.String()))
	if res.Job != nil {
		span.SetAttributes(attrJobID.String(res.Job.ID), attrJobState.String(string(res.Job.State)))
	}
	if res.Attempt != nil {
		span.SetAttributes(attrAttemptID.String(res.Attempt.ID))
	}
}

// newAttempt returns the next attempt to start on provider: a new id, the
// handler's scope, and the attempt_deadline as its lease.
func (m *Middleware) newAttempt(provider string) ledger.NextAttempt {
	next := ledger.NewAttempt(provider, m.cfg.AttemptDeadline)
	next.Scope = m.cfg.Scope
	return next
}

// ImplicitKey is the key of a request that carries none, under
// implicit_key: "implicit:" and its fingerprint in hex. It is a key of
// its owner like any other (GET <status_path>/<key> finds its job).
func ImplicitKey(fingerprint []byte) string {
	return "implicit:" + hex.EncodeToString(fingerprint)
}

// leaseEnd returns when the lease of attempt a ends by this instance's
// clock, for a ledger call that started a and was first sent at issued:
// a's lease counted from then. The ledger started a after that, so this
// is never later than a's attempt_deadline by the ledger's clock, however
// long the call's repeats took.
func leaseEnd(issued time.Time, a ledger.Attempt) time.Time {
	return issued.Add(a.Deadline.Sub(a.StartedAt))
}

// sendable reports whether a reservation's attempt may still be sent: it
// is starting and its lease, by the ledger's clock, has not run out.
func sendable(res ledger.Reservation) bool {
	a := res.Attempt
	return a != nil && a.State == ledger.AttemptStarting && res.Now.Before(a.Deadline)
}
