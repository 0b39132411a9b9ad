package proxy

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
)

// Headers the gateway reads or sets.
const (
	DefaultKeyHeader = "Idempotency-Key"
	HeaderJobID      = "Idempotency-Job-Id"
	HeaderAttempt    = "Idempotency-Attempt"
	// HeaderDeadline tells the provider the attempt's attempt_deadline by
	// the ledger's clock, an HTTP-date (RFC 9110, section 5.6.7) rounded
	// down to the second: a provider with a lookup drops a request it has
	// not started by then.
	HeaderDeadline = "Idempotency-Deadline"
	HeaderReplayed = "Idempotent-Replayed"
	// HeaderReconciled marks an answer a reconciler's lookup stored: its
	// value is "lookup", and replays carry it with the answer. A provider's
	// answer never carries it (storedHeader, Middleware.Found).
	HeaderReconciled = "Idempotency-Reconciled"
	// HeaderExpires tells when a settled job's key stops being one intent:
	// onejob's header, not the IETF draft's.
	HeaderExpires   = "Idempotency-Expires"
	DefaultProvider = "next"
)

// The defaults a zero Config takes (the directive table of docs/caddyfile.md). Callers that derive a
// value from one (a bound sized for the largest stored answer) name these.
const (
	DefaultRetention       = 24 * time.Hour
	DefaultAttemptTimeout  = 30 * time.Second
	DefaultAttemptDeadline = 5 * time.Minute
	DefaultReconcileEvery  = 30 * time.Second
	DefaultMaxRequestBody  = 1 << 20
	DefaultMaxResponseBody = 8 << 20
)

// Handler is a next handler that returns an error, as Caddy's do.
type Handler interface {
	ServeHTTP(http.ResponseWriter, *http.Request) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(http.ResponseWriter, *http.Request) error

// ServeHTTP calls f.
func (f HandlerFunc) ServeHTTP(w http.ResponseWriter, r *http.Request) error { return f(w, r) }

// Provider is one upstream a job's attempts can be sent to.
type Provider struct {
	Name    string
	Handler Handler // nil: the middleware's next handler (drop-in mode)
	// Deduplicates, when set, names the request header the provider
	// honours as its own idempotency key: each attempt sends the job id
	// there (one value per intent and per owner, the same for every
	// attempt of the job), never the client's key.
	Deduplicates string
	// Lookup: a reconciler asks the provider whether an unknown attempt
	// acted, once its deadline passed, every ReconcileEvery with backoff.
	Lookup bool
}

// Contract checks answers against a route's output contract
// (contract.Contract implements it). A breach is never a stored result.
type Contract interface {
	// Applies reports whether answers with this status are checked.
	Applies(status int) bool
	// ChecksBody reports whether the body is checked: answers are then
	// buffered until checked, never streamed.
	ChecksBody() bool
	// CheckHead checks what the headers alone can show.
	CheckHead(status int, h http.Header) error
	// Check checks the whole answer; request is the client's request body.
	Check(status int, h http.Header, body []byte, request []byte) error
}

// Observer receives counts for metrics. Every method must be cheap and safe
// for concurrent use.
type Observer interface {
	// Request counts a ledgered request by outcome: new, replayed, waited,
	// conflict, mismatch, unknown, rejected.
	Request(outcome string)
	// Attempt counts a finished attempt by provider and result: succeeded,
	// lost, failed, unknown.
	Attempt(provider, result string)
	// RaceLost counts a result discarded because another had won.
	RaceLost()
	// InFlight adds delta to the number of attempts running.
	InFlight(delta int)
	// LedgerOp records how long a ledger operation took, its repeats
	// included.
	LedgerOp(op string, d time.Duration)
	// LedgerRepeat records that a ledger operation was sent again because
	// its reply did not come.
	LedgerRepeat(op string)
}

type nopObserver struct{}

func (nopObserver) Request(string)                 {}
func (nopObserver) Attempt(string, string)         {}
func (nopObserver) RaceLost()                      {}
func (nopObserver) InFlight(int)                   {}
func (nopObserver) LedgerOp(string, time.Duration) {}
func (nopObserver) LedgerRepeat(string)            {}

// Config configures a Middleware. Zero values take the documented
// defaults (docs/caddyfile.md).
type Config struct {
	Ledger ledger.Ledger

	// KeyHeader is the request header holding the idempotency key.
	KeyHeader string
	// Methods are the methods that are ledgered; default POST and PATCH.
	Methods []string
	// RequireKey makes a ledgered method without a key a 400.
	RequireKey bool
	// ImplicitKey, when positive, keys a ledgered request that carries no
	// key by its fingerprint, within its owner ("implicit:" and the
	// fingerprint in hex), and its job expires ImplicitKey after it
	// completed or failed instead of Retention. Two intended, identical
	// requests within that window are one job. 0 is off; not together
	// with RequireKey.
	ImplicitKey time.Duration
	// Owner returns the owner of a request; "" means no owner (401).
	// Default: the Authorization header.
	Owner func(*http.Request) string
	// OwnerSecret keys the HMAC of stored owner and key hashes.
	OwnerSecret []byte
	// StatusPath, when set, is the path under which GET <StatusPath>/<key>
	// answers the state of the owner's job with that key (the key
	// percent-encoded as one path segment); empty is off.
	StatusPath string

	// Fingerprint says how bodies are hashed; FingerprintHeaders are
	// request headers that enter the fingerprint too.
	Fingerprint        fingerprint.BodyMode
	FingerprintHeaders []string
	// FingerprintInclude, or else FingerprintExclude, are JSON Pointers
	// (RFC 6901) to the members of a JSON body that count (only these) or
	// do not (all but these): json mode only, never both.
	FingerprintInclude []string
	FingerprintExclude []string
	// OriginalURI returns the request URI as the client sent it, before
	// any rewrite; default r.RequestURI.
	OriginalURI func(*http.Request) string

	MaxRequestBody  int64
	MaxResponseBody int64
	// NeverStore names response headers that, beyond the ones NeverStored
	// names (Set-Cookie among them), are never stored nor replayed: the
	// first client still gets them as the provider sent them.
	NeverStore []string
	Retention  time.Duration
	// AttemptTimeout bounds the wait for an answer's headers; beyond it the
	// client gets a 504 and the job is unknown.
	AttemptTimeout time.Duration
	// AttemptDeadline bounds an attempt until its answer's last byte; it
	// is the attempt's lease in the ledger.
	AttemptDeadline time.Duration
	// InFlightReject answers duplicates of a running job with 409 at once;
	// otherwise they wait up to InFlightWait (default AttemptTimeout).
	InFlightReject bool
	InFlightWait   time.Duration
	// MaxWait caps the wait a client asks for with Prefer: wait=N (which
	// applies whatever InFlightReject says); default AttemptDeadline.
	MaxWait time.Duration

	FailoverOn fallback.FailoverOn
	// Scope is the handler scope every attempt records (ledger.NextAttempt):
	// providers are named per handler, so a reconciler asks its providers
	// only about attempts of its own scope.
	Scope string
	// Providers are tried in order; empty means the next handler.
	Providers []Provider
	// HedgeAfter starts a concurrent attempt on the next provider when the
	// running one has sent no answer headers for that long; 0 is off. Only
	// for side-effect-free providers.
	HedgeAfter time.Duration
	// ReconcileEvery is how often a reconciler looks up unknown attempts
	// of providers with a Lookup (it runs outside the middleware; the
	// status answer tells when the next lookup may settle a job).
	ReconcileEvery time.Duration
	// Contract, when set, checks every answer whose status it names. With
	// contract in FailoverOn a breach is a definitive failure; without it
	// the job is unknown (the provider may have acted).
	Contract Contract
	// Eligible reports whether failover or a hedge may go to provider i
	// (for example, its latest probe passed); nil: every provider may.
	Eligible func(i int) bool

	// IsConnectError reports whether a handler error means the request was
	// never sent (dial or TLS handshake failure, no upstream available).
	IsConnectError func(error) bool
	// PrepareAttempt returns the request an attempt sends, derived from the
	// detached upstream request (for example with its own copy of
	// per-request state). Default: unchanged.
	PrepareAttempt func(*http.Request) *http.Request
	// Hold is called when an attempt starts and its result is called when
	// the attempt ends, so that the ledger outlives a config reload.
	Hold func() (release func())
	// SetVar publishes a per-request value (job_id, attempt, replayed).
	SetVar func(r *http.Request, name, value string)

	Observer Observer
	Logger   *zap.Logger
}

// selection returns the configured fingerprint selection, nil for the
// whole body.
func (c *Config) selection() (*fingerprint.Selection, error) {
	if len(c.FingerprintInclude) == 0 && len(c.FingerprintExclude) == 0 {
		return nil, nil
	}
	if len(c.FingerprintInclude) > 0 && len(c.FingerprintExclude) > 0 {
		return nil, errors.New("proxy: fingerprint json takes include or exclude, not both")
	}
	if c.Fingerprint != fingerprint.BodyJSON {
		return nil, fmt.Errorf("proxy: fingerprint %s cannot select members: include and exclude are for json", c.Fingerprint)
	}
	include := len(c.FingerprintInclude) > 0
	sel, err := fingerprint.NewSelection(include, append(slices.Clone(c.FingerprintInclude), c.FingerprintExclude...))
	if err != nil {
		return nil, fmt.Errorf("proxy: fingerprint json: %w", err)
	}
	return sel, nil
}

func (c *Config) setDefaults() error {
	if c.Ledger == nil {
		return errors.New("proxy: no ledger")
	}
	if c.KeyHeader == "" {
		c.KeyHeader = DefaultKeyHeader
	}
	c.KeyHeader = http.CanonicalHeaderKey(c.KeyHeader)
	if err := CheckImplicitKey(c.ImplicitKey, c.RequireKey); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	methods := []string{http.MethodPost, http.MethodPatch}
	if len(c.Methods) > 0 {
		methods = make([]string, len(c.Methods))
		for i, m := range c.Methods {
			methods[i] = strings.ToUpper(m)
		}
	}
	c.Methods = methods
	if c.Owner == nil {
		c.Owner = func(r *http.Request) string { return r.Header.Get("Authorization") }
	}
	if c.OriginalURI == nil {
		c.OriginalURI = func(r *http.Request) string { return r.RequestURI }
	}
	headers := make([]string, len(c.FingerprintHeaders))
	for i, h := range c.FingerprintHeaders {
		headers[i] = http.CanonicalHeaderKey(h)
	}
	c.FingerprintHeaders = headers
	never := make([]string, len(c.NeverStore))
	for i, h := range c.NeverStore {
		never[i] = http.CanonicalHeaderKey(h)
	}
	c.NeverStore = never
	if _, err := c.selection(); err != nil {
		return err
	}
	if c.MaxRequestBody <= 0 {
		c.MaxRequestBody = DefaultMaxRequestBody
	}
	if c.MaxResponseBody <= 0 {
		c.MaxResponseBody = DefaultMaxResponseBody
	}
	if c.Retention <= 0 {
		c.Retention = DefaultRetention
	}
	if c.AttemptTimeout <= 0 {
		c.AttemptTimeout = DefaultAttemptTimeout
	}
	if c.AttemptDeadline <= 0 {
		c.AttemptDeadline = DefaultAttemptDeadline
	}
	if c.ReconcileEvery <= 0 {
		c.ReconcileEvery = DefaultReconcileEvery
	}
	if c.AttemptDeadline < c.AttemptTimeout {
		return fmt.Errorf("proxy: attempt_deadline (%v) is shorter than attempt_timeout (%v)", c.AttemptDeadline, c.AttemptTimeout)
	}
	if c.InFlightWait <= 0 {
		c.InFlightWait = c.AttemptTimeout
	}
	if c.MaxWait <= 0 {
		c.MaxWait = c.AttemptDeadline
	}
	if c.FailoverOn.Statuses == nil && !c.FailoverOn.ConnectError && !c.FailoverOn.Contract {
		c.FailoverOn = fallback.DefaultFailoverOn()
	}
	if len(c.Providers) == 0 {
		c.Providers = []Provider{{Name: DefaultProvider}}
	}
	if c.IsConnectError == nil {
		c.IsConnectError = isDialError
	}
	if c.PrepareAttempt == nil {
		c.PrepareAttempt = func(r *http.Request) *http.Request { return r }
	}
	if c.Hold == nil {
		c.Hold = func() func() { return func() {} }
	}
	if c.SetVar == nil {
		c.SetVar = func(*http.Request, string, string) {}
	}
	if c.Observer == nil {
		c.Observer = nopObserver{}
	}
	if c.Logger == nil {
		c.Logger = zap.NewNop()
	}
	return nil
}

// CheckImplicitKey is the rule of implicit_key, in JSON and in a
// Caddyfile: a window that is not negative (0 is off), and never with
// require_key (a request without a key cannot be both refused and keyed).
func CheckImplicitKey(window time.Duration, requireKey bool) error {
	switch {
	case window < 0:
		return fmt.Errorf("implicit_key must be a positive window, not %v", window)
	case window > 0 && requireKey:
		return errors.New("implicit_key and require_key together: a request without a key is either refused or keyed by its fingerprint, not both")
	}
	return nil
}

// isDialError is the default connect-error test: a dial that failed.
func isDialError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial"
}
