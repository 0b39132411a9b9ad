package proxy

import (
	"context"
	"encoding/hex"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"go.uber.org/zap"
)

// The spans a job's work makes under the request's span: the one Caddy's
// tracing handler starts (docs/operations.md lists them with their
// attributes).
const (
	tracerName = "github.com/onejob/onejob"

	spanReserve  = "onejob.reserve"
	spanAttempt  = "onejob.attempt"
	spanComplete = "onejob.complete"
	spanWait     = "onejob.wait"
	spanJoin     = "onejob.join"
	spanReplay   = "onejob.replay"
)

// Why an attempt started (the attempt span's onejob.attempt.cause).
const (
	causeFirst    = "first"
	causeFailover = "failover"
	causeHedge    = "hedge"
	causeResend   = "resend"
)

// Attribute keys. An owner and a key appear only as the hashes the ledger
// keeps, never in clear.
const (
	attrJobID     = attribute.Key("onejob.job.id")
	attrJobState  = attribute.Key("onejob.job.state")
	attrOwnerHash = attribute.Key("onejob.owner.hash")
	attrKeyHash   = attribute.Key("onejob.key.hash")
	attrOutcome   = attribute.Key("onejob.reservation.outcome")
	attrAttemptID = attribute.Key("onejob.attempt.id")
	attrAttempt   = attribute.Key("onejob.attempt.number")
	attrCause     = attribute.Key("onejob.attempt.cause")
	attrProvider  = attribute.Key("onejob.provider")
	attrVerdict   = attribute.Key("onejob.attempt.verdict")
	attrReason    = attribute.Key("onejob.attempt.reason")
	attrWon       = attribute.Key("onejob.complete.won")
	attrTier      = attribute.Key("onejob.replay.tier")
	attrStatus    = attribute.Key("http.response.status_code")
)

// startSpan starts the span name under ctx's span when that one records
// (Caddy's tracing is on and sampled it). Otherwise it returns ctx and a
// span that does nothing, at no cost: no context, no allocation. Callers
// set attributes only when the span records (span.IsRecording), so that
// an untraced request does not build them either.
func startSpan(ctx context.Context, name string) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, noop.Span{}
	}
	return parent.TracerProvider().Tracer(tracerName).Start(ctx, name)
}

// traceparent writes the W3C trace context of ctx's span into h, where
// an upstream reads it: a provider's own spans join the attempt's.
func traceparent(ctx context.Context, h map[string][]string) {
	propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
}

// hashAttr is a hash the ledger keeps, as a span attribute.
func hashAttr(k attribute.Key, hash []byte) attribute.KeyValue {
	return k.String(hex.EncodeToString(hash))
}

// failSpan marks span as failed with err.
func failSpan(span trace.Span, err error) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
}

// jobLog returns the logger for the work of the request whose context is
// ctx: the gateway's, with the trace id when the request is traced, so
// that its log lines join its trace.
func (m *Middleware) jobLog(ctx context.Context) *zap.Logger {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return m.cfg.Logger.With(zap.String("trace_id", sc.TraceID().String()))
	}
	return m.cfg.Logger
}
