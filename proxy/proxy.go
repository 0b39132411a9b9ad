package proxy

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
)

// Middleware is the idempotent request flow.
type Middleware struct {
	cfg    Config
	policy fallback.Policy
	fp     fingerprint.Fingerprinter
	hasher Hasher

	runners       pool // runs runs and tries
	unsentQ       unsentQueue
	lives         liveStreams
	statusBase    string    // the escaped "<StatusPath>/", derived once
	deduplicating bool      // a provider deduplicates: unknown jobs may be re-sent
	localLedger   bool      // the ledger runs in this process (ledger.Local)
	nested        sync.Once // logs the first attempt of a gateway in front
}

// guardedKey marks the context of an attempt's request: a gateway in
// front of this one holds its job (see ServeHTTP).
type guardedKey struct{}

// New returns a Middleware for cfg, with defaults filled in.
func New(cfg Config) (*Middleware, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	sel, err := cfg.selection()
	if err != nil {
		return nil, err
	}
	names := make([]string, len(cfg.Providers))
	for i, p := range cfg.Providers {
		names[i] = p.Name
	}
	return &Middleware{
		cfg: cfg,
		policy: fallback.Policy{
			Providers:  names,
			FailoverOn: cfg.FailoverOn,
			HedgeAfter: cfg.HedgeAfter,
			Eligible:   cfg.Eligible,
		},
		fp:            fingerprint.New(cfg.Fingerprint, cfg.FingerprintHeaders, sel),
		hasher:        NewHasher(cfg.OwnerSecret),
		statusBase:    statusBase(cfg.StatusPath),
		deduplicating: slices.ContainsFunc(cfg.Providers, func(p Provider) bool { return p.Deduplicates != "" }),
		localLedger:   ledger.IsLocal(cfg.Ledger),
		runners:       pool{tasks: make(chan func())},
	}, nil
}

// Config returns the middleware's configuration, defaults filled in.
func (m *Middleware) Config() Config { return m.cfg }

// Wrap returns next behind the middleware, as a plain http.Handler; errors
// from next become 502 answers.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	h := HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		next.ServeHTTP(w, r)
		return nil
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := m.ServeHTTP(w, r, h); err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
		}
	})
}

// newAttempt returns the next attempt to start on provider: a new id, the
// handler's scope, and the attempt_deadline as its lease.
func (m *Middleware) newAttempt(provider string) ledger.NextAttempt {
	next := ledger.NewAttempt(provider, m.cfg.AttemptDeadline)
	next.Scope = m.cfg.Scope
	return next
}

// ServeHTTP runs the flow for one request; requests that are not ledgered
// go to next untouched.
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request, next Handler) error {
	if m.serveStatus(w, r) {
		return nil
	}
	if !slices.Contains(m.cfg.Methods, r.Method) {
		return next.ServeHTTP(w, r)
	}
	if r.Context().Value(guardedKey{}) != nil {
		// An attempt of a gateway in front (a handler nested behind
		// another): that one holds the job, so this one passes it on.
		// Reserving it again would find the job in flight, and wait on
		// it while the job waits on this attempt.
		m.nested.Do(func() {
			m.cfg.Logger.Warn("idempotency handler nested behind another: it passes the requests the first one guards through")
		})
		return next.ServeHTTP(w, r)
	}
	values := r.Header.Values(m.cfg.KeyHeader)
	// implicit: the request has no key and is keyed by its fingerprint
	// (implicit_key), once that is computed.
	implicit := len(values) == 0 && m.cfg.ImplicitKey > 0
	var key string
	switch {
	case implicit:
	case len(values) == 0:
		if m.cfg.RequireKey {
			m.reject(w, problem(http.StatusBadRequest, ProblemKeyMissing, "Idempotency key missing").
				withDetail("This endpoint requires the "+m.cfg.KeyHeader+" header."))
			return nil
		}
		return next.ServeHTTP(w, r)
	case len(values) > 1:
		m.reject(w, problem(http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key").
			withDetail("The request has more than one "+m.cfg.KeyHeader+" header."))
		return nil
	default:
		var err error
		if key, err = ParseKey(values[0]); err != nil {
			m.reject(w, problem(http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key").withDetail(err.Error()+"."))
			return nil
		}
	}
	owner := m.cfg.Owner(r)
	if owner == "" {
		m.reject(w, problem(http.StatusUnauthorized, ProblemOwnerMissing, "No owner for the idempotency key").
			withDetail("Idempotency keys belong to an authenticated owner; this request has none."))
		return nil
	}
	body, err := readBody(r, m.cfg.MaxRequestBody)
	if errors.Is(err, errBodyTooLarge) {
		m.reject(w, problem(http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large").
			withDetail("The body is over max_request_body ("+strconv.FormatInt(m.cfg.MaxRequestBody, 10)+" bytes)."))
		return nil
	}
	if err != nil {
		return err // the client went away mid-body; there is no job
	}
	var gq *fingerprint.GraphQLRequest
	if m.cfg.Fingerprint == fingerprint.BodyGraphQL {
		// Only mutations are ledgered; a document that does not parse is
		// forwarded as it is (the upstream owns GraphQL errors) and
		// fingerprinted raw.
		if g, ok := fingerprint.ParseGraphQL(body); ok {
			if !g.Mutation {
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
				return next.ServeHTTP(w, r)
			}
			gq = &g
		}
	}
	uri := m.cfg.OriginalURI(r)
	params := ledger.ReserveParams{
		JobID:              ledger.NewID(),
		OwnerHash:          m.hasher.Owner(owner),
		Fingerprint:        m.fp.SumGraphQL(r.Method, uri, r.Header, gq, body),
		FingerprintVersion: m.fp.Version(),
		FingerprintScheme:  m.fp.Scheme(),
		Retention:          m.cfg.Retention,
		Attempt:            m.newAttempt(m.cfg.Providers[0].Name),
	}
	if implicit {
		key, params.Retention = ImplicitKey(params.Fingerprint), m.cfg.ImplicitKey
	}
	params.KeyHash = m.hasher.Key(key)
	// A ledger that does not answer is a ledger that cannot reserve: the
	// wait is bounded, like every ledger call of an attempt, and ends in a
	// 503 rather than holding the client (and a goroutine) indefinitely.
	reserve := func(ctx context.Context) (ledger.Reservation, error) {
		r, err := m.cfg.Ledger.Reserve(ctx, params)
		params.Repeat = true // every later call with these ids may repeat this one
		return r, err
	}
	issued := time.Now()
	res, err := ledgerCall(m, r.Context(), "reserve", reserve)
	if err == nil && res.Outcome == ledger.Mismatch {
		// The job's fingerprint may have been made another way (by an
		// earlier configuration or release): fingerprint the request as
		// its job was, and ask again.
		if g, ok := m.fp.ForJob(res.Job.FingerprintVersion, res.Job.FingerprintScheme); ok &&
			(g.Version() != params.FingerprintVersion || g.Scheme() != params.FingerprintScheme) {
			if g.Mode() == m.fp.Mode() {
				params.Fingerprint = g.SumGraphQL(r.Method, uri, r.Header, gq, body)
			} else {
				params.Fingerprint = g.Sum(r.Method, uri, r.Header, body)
			}
			params.FingerprintVersion, params.FingerprintScheme = g.Version(), g.Scheme()
			issued = time.Now()
			res, err = ledgerCall(m, r.Context(), "reserve", reserve)
		}
	}
	if err == nil && (res.Outcome == ledger.Created || res.Outcome == ledger.Reopened) && !sendable(res) {
		// A repeat that came too late: the attempt's lease ran out before
		// the gateway could send it.
		err = errors.New("the reservation's lease ran out before its answer came")
	}
	if err != nil {
		// The reservation may have been made: record that its attempt
		// was never sent, as soon as the ledger answers.
		m.unsent(unsentWork{reserve: &params})
		if r.Context().Err() != nil {
			return nil
		}
		m.cfg.Logger.Error("ledger unavailable: request not forwarded", zap.Error(err))
		m.reject(w, problem(http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Ledger unavailable").
			withDetail("The request was not forwarded: it could not be recorded.").retry(time.Second))
		return nil
	}
	jobID := res.Job.ID
	m.cfg.SetVar(r, "job_id", jobID)
	switch res.Outcome {
	case ledger.Created, ledger.Reopened:
		m.cfg.Observer.Request("new")
		m.cfg.SetVar(r, "attempt", strconv.Itoa(res.Attempt.Number))
		return m.execute(w, r, next, res, leaseEnd(issued, *res.Attempt), body)
	case ledger.Mismatch:
		m.cfg.Observer.Request("mismatch")
		problem(http.StatusUnprocessableEntity, ProblemKeyReused, "Idempotency key reused").
			withDetail("This key was used for a different request.").withJob(jobID).Write(w)
	case ledger.Done:
		m.cfg.Observer.Request("replayed")
		m.replay(w, r, res.Job, res.Now, true)
	case ledger.InFlight:
		wait := m.waitFor(w, r)
		if wait <= 0 {
			m.cfg.Observer.Request("rejected")
			m.inFlight(w, jobID, res.Attempt, res.Now)
			return nil
		}
		m.wait(w, r, jobID, wait)
	case ledger.Unknown:
		if a, until, ok := m.resendOnRetry(r.Context(), res); ok {
			m.cfg.Observer.Request("new")
			m.cfg.SetVar(r, "attempt", strconv.Itoa(a.Number))
			res.Attempt = a
			return m.execute(w, r, next, res, until, body)
		}
		m.cfg.Observer.Request("unknown")
		m.unknown(w, jobID, res.Attempt, res.Now)
	}
	return nil
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

func (m *Middleware) reject(w http.ResponseWriter, p *Problem) {
	m.cfg.Observer.Request("rejected")
	p.Write(w)
}

var errBodyTooLarge = errors.New("request body too large")

// readBody buffers the request body, at most max bytes.
func readBody(r *http.Request, max int64) ([]byte, error) {
	if r.ContentLength > max {
		return nil, errBodyTooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	n := r.ContentLength
	if n < 0 || n > max {
		n = 512
	}
	buf := make([]byte, 0, n+1)
	for {
		if int64(len(buf)) > max {
			return nil, errBodyTooLarge
		}
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, int(min(int64(cap(buf)), max+1-int64(len(buf)))))
		}
		k, err := r.Body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+k]
		if err == io.EOF {
			if int64(len(buf)) > max {
				return nil, errBodyTooLarge
			}
			return buf, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// execute runs the job's attempts in a detached goroutine and answers the
// client with the outcome, a 504 when the first answer's headers do not
// come within attempt_timeout. The first attempt's lease ends at until
// (leaseEnd).
func (m *Middleware) execute(w http.ResponseWriter, r *http.Request, next Handler, res ledger.Reservation, until time.Time, body []byte) error {
	base := r.WithContext(context.WithValue(context.WithoutCancel(r.Context()), guardedKey{}, true))
	rn := newRunner(m, base, next, body, w, *res.Attempt)
	first, provider, release := *res.Attempt, m.policy.Index(res.Attempt.Provider), m.cfg.Hold()
	m.runners.run(func() { rn.run(first, provider, until, release) })

	timer := time.NewTimer(m.cfg.AttemptTimeout)
	defer timer.Stop()
	watched := ""
	for {
		att, headers := rn.watched()
		if att.ID != watched && att.ID != "" {
			watched = att.ID
			timer.Reset(m.cfg.AttemptTimeout)
			m.cfg.SetVar(r, "attempt", strconv.Itoa(att.Number))
		}
		if headers {
			timer.Stop()
		}
		select {
		case <-rn.done:
			if rn.started() {
				// An answer's headers went out: it is the client's answer,
				// whatever the run decided. Once it ends early, abort the
				// connection, so that the client sees it cut short; never
				// write a gateway answer into it.
				if rn.streamEnded() {
					panic(http.ErrAbortHandler)
				}
				return nil
			}
			m.answer(w, r, *rn.out, res.Job.ID)
			return nil
		case <-rn.wake:
		case <-timer.C:
			if rn.timeout(att) {
				rn.client.detach()
				m.cfg.Logger.Warn("attempt outcome unknown: timed out", zap.String("job_id", att.JobID),
					zap.String("attempt_id", att.ID), zap.Int("attempt", att.Number))
				problem(http.StatusGatewayTimeout, ProblemOutcomeUnknown, "Attempt timed out").
					withDetail("The provider did not answer within attempt_timeout. The job's outcome is unknown; it will not be re-run.").
					withJob(res.Job.ID).Write(w)
				return nil
			}
		case <-r.Context().Done():
			if rn.leave() {
				return nil
			}
			rn.streamEnded() // an answer is streaming: wait for its end
			return nil
		}
	}
}

// answer sends the outcome of a run to the client that started it.
// An answer that went out as it arrived is not this: see clientState.
func (m *Middleware) answer(w http.ResponseWriter, r *http.Request, out final, jobID string) {
	switch out.verdict {
	case fallback.Result:
		if out.won || out.storeErr != nil {
			setExpires(w.Header(), out.expires)
			m.writeAnswer(w, out.answer, jobID, false)
			return
		}
		// Lost: another answer won, or the job was settled meanwhile.
		if out.job != nil && out.job.Response != nil && out.job.State == ledger.JobCompleted {
			m.replay(w, r, out.job, time.Time{}, false) // read just now
			return
		}
		problem(http.StatusConflict, ProblemOutcomeUnknown, "Result discarded").
			withDetail("The job was settled otherwise while this attempt ran; its result was discarded.").
			withJob(jobID).Write(w)
	case fallback.Failed:
		setExpires(w.Header(), out.expires)
		if out.answer != nil {
			m.writeAnswer(w, out.answer, jobID, false)
			return
		}
		if out.contract {
			problem(http.StatusBadGateway, ProblemContract, "Every provider broke the contract").
				withDetail("No provider gave an answer that honours the route's contract (" + out.reason + "). A retry may start a new attempt.").
				withJob(jobID).Write(w)
			return
		}
		problem(http.StatusBadGateway, ProblemAllFailed, "Every provider failed").
			withDetail("No provider could be reached (" + out.reason + "). A retry may start a new attempt.").
			withJob(jobID).Write(w)
	default:
		if out.contract {
			problem(http.StatusBadGateway, ProblemContract, "Answer breaks the contract").
				withDetail("The provider's answer breaks the route's contract (" + out.reason + "). It was not stored; the provider may have acted, so the job's outcome is unknown.").
				withJob(jobID).Write(w)
			return
		}
		title := "Outcome unknown"
		if out.status == http.StatusGatewayTimeout {
			title = "Attempt timed out"
		}
		problem(out.status, ProblemOutcomeUnknown, title).
			withDetail("The provider may have acted (" + out.reason + "). The job's outcome is unknown; it will not be re-run.").
			withJob(jobID).Write(w)
	}
}

// setExpires tells when a settled job's key stops being one intent, when
// the ledger said so (an HTTP-date of the ledger's clock).
func setExpires(h http.Header, t time.Time) {
	if !t.IsZero() {
		setCanonical(h, HeaderExpires, string(appendHTTPDate(make([]byte, 0, len(http.TimeFormat)), t)))
	}
}

// appendHTTPDate appends t as HTTP dates are written (http.TimeFormat, in
// UTC) without parsing a layout, as net/http writes its Date header; a
// year past four digits, which no job expires in, takes time.Format.
func appendHTTPDate(b []byte, t time.Time) []byte {
	const days, months = "SunMonTueWedThuFriSat", "JanFebMarAprMayJunJulAugSepOctNovDec"
	t = t.UTC()
	yy, mm, dd := t.Date()
	if yy < 0 || yy > 9999 {
		return t.AppendFormat(b, http.TimeFormat)
	}
	hh, mn, ss := t.Clock()
	day, mon := days[3*t.Weekday():], months[3*(mm-1):]
	return append(b, day[0], day[1], day[2], ',', ' ',
		byte('0'+dd/10), byte('0'+dd%10), ' ',
		mon[0], mon[1], mon[2], ' ',
		byte('0'+yy/1000), byte('0'+yy/100%10), byte('0'+yy/10%10), byte('0'+yy%10), ' ',
		byte('0'+hh/10), byte('0'+hh%10), ':', byte('0'+mn/10), byte('0'+mn%10), ':',
		byte('0'+ss/10), byte('0'+ss%10), ' ', 'G', 'M', 'T')
}

// setCanonical sets field, a name already canonical (this package's
// Header constants are: TestHeaderNamesAreCanonical), to v: as
// http.Header.Set does, without canonicalizing the name on every answer.
func setCanonical(h http.Header, field, v string) {
	h[field] = []string{v}
}

// Found returns the answer a reconciler's lookup found (status, header and
// body) as the ledger keeps it: as an attempt's answer is kept (end-to-end
// headers without the private ones), and marked as the lookup's with
// HeaderReconciled, which storedHeader takes from every provider's answer.
func (m *Middleware) Found(status int, header http.Header, body []byte) *ledger.Response {
	h := m.storable(storedHeader(header))
	h[HeaderReconciled] = []string{"lookup"}
	return &ledger.Response{Status: status, Header: h, Body: body, Size: int64(len(body)), Stored: true}
}

// writeAnswer sends a recorded answer.
func (m *Middleware) writeAnswer(w http.ResponseWriter, a *ledger.Response, jobID string, replayed bool) {
	m.setAnswerHeader(w.Header(), a.Header, jobID, replayed)
	w.WriteHeader(a.Status)
	w.Write(a.Body)
}

// setAnswerHeader sets in h, a client's answer's header, the answer's
// fields from src and the job's id; a replay is marked, and goes without
// the headers m never stores (an answer stored before one was named
// still holds it), keeping the Preference-Applied a waiter was given
// beside the stored answer's. The values are copied: src's are the
// ledger's or the provider's, and h's may be rewritten in place by a
// handler in front.
func (m *Middleware) setAnswerHeader(h http.Header, src map[string][]string, jobID string, replayed bool) {
	var applied []string
	if replayed {
		src = m.storable(src)
		applied = h[HeaderPreferenceApplied] // the wait a duplicate got (waitFor)
	}
	ledger.CopyHeader(h, src) // h's values may be rewritten in place, as Caddy's deferred `header` operations do
	setCanonical(h, HeaderJobID, jobID)
	if replayed {
		setCanonical(h, HeaderReplayed, "true")
		if _, both := src[HeaderPreferenceApplied]; both && applied != nil {
			// What the provider applied to the first request, and the wait.
			h[HeaderPreferenceApplied] = append(h[HeaderPreferenceApplied], applied...)
		}
	}
}

// waitFor returns how long a duplicate r of an in-flight job waits for its
// result, 0 for a 409 at once: the client's Prefer: wait, capped by
// max_wait (and then said in Preference-Applied), else in_flight's.
func (m *Middleware) waitFor(w http.ResponseWriter, r *http.Request) time.Duration {
	if wait, ok := preferredWait(r.Header); ok {
		wait = min(wait, m.cfg.MaxWait)
		setCanonical(w.Header(), HeaderPreferenceApplied, appliedWait(wait))
		return wait
	}
	if m.cfg.InFlightReject {
		return 0
	}
	return m.cfg.InFlightWait
}

// replay sends a completed job's stored answer, or 409 when it was not
// stored. now is the ledger's clock when j was read; zero when j was read
// just now. With join, a duplicate that would wait for an answer still
// streaming joins it when it streams through this instance, and otherwise
// waits for its end and replays it.
func (m *Middleware) replay(w http.ResponseWriter, r *http.Request, j *ledger.Job, now time.Time, join bool) {
	setExpires(w.Header(), j.ExpiresAt)
	if j.Streaming() && (now.IsZero() || now.Sub(j.CompletedAt) < m.cfg.AttemptDeadline) {
		var wait time.Duration
		if join {
			wait = m.waitFor(w, r)
		}
		switch s := m.lives.get(j.ID); {
		case wait > 0 && s != nil && m.join(w, r, j, s):
			return
		case wait > 0 && s == nil:
			// It streams through another instance: Ledger.Wait ends when
			// its body is saved.
			m.wait(w, r, j.ID, wait)
			return
		}
		// The answer won while it was still streaming to its first
		// client; its body is not recorded yet.
		problem(http.StatusConflict, ProblemInFlight, "Answer still streaming").
			withDetail("The answer to this key is still being sent to the first request; retry shortly.").
			withJob(j.ID).retry(time.Second).Write(w)
		return
	}
	if j.Response == nil || !j.Response.Stored {
		problem(http.StatusConflict, ProblemNotStored, "Response not stored").
			withDetail("The job completed, but its answer was too large or cut short, so it cannot be replayed.").
			withJob(j.ID).Write(w)
		return
	}
	m.cfg.SetVar(r, "replayed", "true")
	m.writeAnswer(w, j.Response, j.ID, true)
}

// wait holds a duplicate until the job settles or the wait ends (in_flight's,
// or the one the client preferred).
func (m *Middleware) wait(w http.ResponseWriter, r *http.Request, jobID string, wait time.Duration) {
	ctx, cancel := context.WithTimeout(r.Context(), wait)
	defer cancel()
	j, err := m.cfg.Ledger.Wait(ctx, jobID)
	if r.Context().Err() != nil {
		return // the client left
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		m.cfg.Observer.Request("conflict")
		var a *ledger.Attempt
		now := time.Time{}
		if j != nil {
			a, now = latest(j), j.ReadAt
		}
		m.inFlight(w, jobID, a, now)
	case errors.Is(err, ledger.ErrNotFound):
		m.cfg.Observer.Request("conflict")
		problem(http.StatusConflict, ProblemInFlight, "Request in flight").
			withDetail("The job changed while waiting; retry.").withJob(jobID).retry(time.Second).Write(w)
	case err != nil:
		m.cfg.Logger.Error("ledger unavailable while waiting", zap.String("job_id", jobID), zap.Error(err))
		m.cfg.Observer.Request("rejected")
		problem(http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Ledger unavailable").
			withJob(jobID).retry(time.Second).Write(w)
	case j.State == ledger.JobCompleted:
		m.cfg.Observer.Request("waited")
		m.replay(w, r, j, j.ReadAt, true)
	case j.State == ledger.JobFailed:
		m.cfg.Observer.Request("waited")
		setExpires(w.Header(), j.ExpiresAt)
		problem(http.StatusServiceUnavailable, ProblemAttemptFailed, "Attempt failed").
			withDetail("The attempt this request waited for failed definitively; a retry may start a new attempt.").
			withJob(jobID).retry(time.Second).Write(w)
	default:
		m.cfg.Observer.Request("unknown")
		m.unknown(w, jobID, latest(j), j.ReadAt)
	}
}

// latest returns the job's attempt with the latest deadline.
func latest(j *ledger.Job) *ledger.Attempt {
	var a *ledger.Attempt
	for i := range j.Attempts {
		if a == nil || j.Attempts[i].Deadline.After(a.Deadline) {
			a = &j.Attempts[i]
		}
	}
	return a
}

// inFlight answers 409 for a job whose attempt is still running. now is
// the ledger's clock: Retry-After is computed from ledger times only.
func (m *Middleware) inFlight(w http.ResponseWriter, jobID string, a *ledger.Attempt, now time.Time) {
	retry := time.Second
	if a != nil && !now.IsZero() {
		retry = max(min(a.StartedAt.Add(m.cfg.AttemptTimeout).Sub(now), a.Deadline.Sub(now)), time.Second)
	}
	problem(http.StatusConflict, ProblemInFlight, "Request in flight").
		withDetail("A request with this key is still being processed.").withJob(jobID).retry(retry).Write(w)
}

// unknown answers 409 for a job whose outcome is unknown: Retry-After until
// the attempt's deadline by the ledger's clock (now), when a late result
// may still come; none after.
func (m *Middleware) unknown(w http.ResponseWriter, jobID string, a *ledger.Attempt, now time.Time) {
	p := problem(http.StatusConflict, ProblemOutcomeUnknown, "Outcome unknown").
		withDetail("An attempt's outcome is unknown; no new attempt starts until it is resolved.").withJob(jobID)
	switch {
	case a == nil:
	case now.IsZero():
		p.retry(time.Second) // the ledger did not say its time
	case a.Deadline.After(now):
		p.retry(a.Deadline.Sub(now))
	}
	p.Write(w)
}

// Ledger calls made for an attempt, detached from the client.

func (m *Middleware) complete(att ledger.Attempt, resp ledger.Response) (ledger.Completion, error) {
	stored := resp // the first client gets resp; the ledger never the private headers
	stored.Header = m.storable(resp.Header)
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	return ledgerCall(m, ctx, "complete", func(ctx context.Context) (ledger.Completion, error) {
		return m.cfg.Ledger.Complete(ctx, att.Ref(), stored)
	})
}

// fail records a definitive failure of att and starts next, if set. When
// the ledger does not answer, next may exist there but is never sent, and
// att failed all the same (never sent, when its request never left: a
// connect error): each is recorded so once the ledger answers, att first.
// A connect error that comes to the ledger after att's lease ran out finds
// att unknown (ErrStale): never sent is still proof, and it is recorded so.
func (m *Middleware) fail(att ledger.Attempt, reason string, next *ledger.NextAttempt) (*ledger.Attempt, error) {
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	a, err := ledgerCall(m, ctx, "fail", func(ctx context.Context) (*ledger.Attempt, error) {
		return m.cfg.Ledger.Fail(ctx, att.Ref(), reason, next)
	})
	if err != nil && !errors.Is(err, ledger.ErrBlocked) {
		m.cfg.Logger.Error("failure not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
		connect := reason == fallback.ReasonConnect
		switch {
		case !answered(err):
			if connect {
				m.unsent(unsentWork{ref: att.Ref()})
			} else {
				m.unsent(unsentWork{ref: att.Ref(), failed: reason})
			}
			if next != nil {
				m.unsent(unsentWork{ref: ledger.AttemptRef{JobID: att.JobID, AttemptID: next.ID}})
			}
		case connect && errors.Is(err, ledger.ErrStale):
			m.unsent(unsentWork{ref: att.Ref()})
		}
		return nil, err
	}
	return a, nil
}

// failedExpiry returns when a job whose every attempt failed expires, so
// that the client's answer can say it (Idempotency-Expires): one read,
// made only on this path, and bounded, since the header only informs.
// It is zero when the job is not failed by now or cannot be read.
func (m *Middleware) failedExpiry(jobID string) time.Time {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	j, err := m.cfg.Ledger.Job(ctx, jobID)
	if err != nil || j.State != ledger.JobFailed {
		return time.Time{}
	}
	return j.ExpiresAt
}

// hedge starts next beside the attempt ref; like fail, a next attempt
// whose start the ledger did not confirm is recorded never sent.
func (m *Middleware) hedge(ref ledger.AttemptRef, next ledger.NextAttempt) (ledger.Attempt, error) {
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	a, err := ledgerCall(m, ctx, "hedge", func(ctx context.Context) (ledger.Attempt, error) {
		return m.cfg.Ledger.Hedge(ctx, ref, next)
	})
	if !answered(err) {
		m.unsent(unsentWork{ref: ledger.AttemptRef{JobID: ref.JobID, AttemptID: next.ID}})
	}
	return a, err
}

func (m *Middleware) markUnknown(att ledger.Attempt, reason string) {
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	_, err := ledgerCall(m, ctx, "mark_unknown", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.cfg.Ledger.MarkUnknown(ctx, att.Ref(), reason)
	})
	switch {
	case err == nil:
		m.cfg.Logger.Warn("attempt outcome unknown", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Int("attempt", att.Number), zap.String("reason", reason))
	case errors.Is(err, ledger.ErrStale):
	default:
		m.cfg.Logger.Error("unknown outcome not recorded", zap.String("job_id", att.JobID),
			zap.String("attempt_id", att.ID), zap.Error(err))
	}
}

func (m *Middleware) saveBody(att ledger.Attempt, body []byte, size int64, stored bool) error {
	ctx := context.Background() // detached from the client: ledgerCall bounds it
	_, err := ledgerCall(m, ctx, "save_body", func(ctx context.Context) (struct{}, error) {
		return struct{}{}, m.cfg.Ledger.SaveBody(ctx, att.Ref(), body, size, stored)
	})
	return err
}
