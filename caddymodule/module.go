// Package caddymodule is the Caddy glue of onejob: the http.handlers.idempotency
// handler and its Caddyfile directive, the idempotency app that holds
// what the handlers of one config share, its guest modules (the ledgers,
// idempotency.ledgers.*, and the replay cache, idempotency.caches.redis;
// see ledgers.go for how a third party adds a ledger), the admin API, the
// jobs page and the `caddy idempotency` command. The request flow itself
// lives in package proxy. A Caddy build imports the repository's root
// package, github.com/onejob/onejob, which imports this one.
package caddymodule

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"go.uber.org/zap"

	"github.com/onejob/onejob/contract"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/sealed"
	"github.com/onejob/onejob/proxy"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is an idempotency gateway: requests that carry an idempotency
// key run at most once per (owner, key); retries and duplicates get the
// stored answer. In drop-in mode the rest of the route is the provider.
//
// It sets these placeholders, for the handlers after it and for the
// access logs:
//
//   - {http.idempotency.job_id}: the id of the job the request's key
//     names, once the ledger has reserved or found it; for a request to
//     status_path, the id of the job it asked about.
//   - {http.idempotency.attempt}: the number of the attempt this request
//     runs (1 for the first; a failover or a hedge moves it on), set only
//     when the request runs one, not when it waits or gets a replay.
//   - {http.idempotency.replayed}: "true" when the answer is a stored one,
//     replayed, or a running job's answer joined as it streams; unset
//     otherwise.
type Handler struct {
	// Names this handler's providers apart from those of other idempotency
	// handlers: probe results, failover eligibility, the admin API's
	// provider list, the jobs page and the scope label of the provider
	// metrics are kept per scope, so two sites that both have a provider
	// named fallback never gate each other's failover. Default: the name
	// of the HTTP server the handler is in (its key under
	// apps.http.servers; srv0, srv1... from the Caddyfile, or the name the
	// servers global option gives it), and for the server's second and
	// later idempotency handlers, in config order, that name followed by
	// #2, #3...: srv0, srv0#2. Set it (1 to 100 visible characters, no
	// spaces; unique among the config's handlers) to keep a handler's name
	// when sites are added or reordered, or to name it after the site
	// (api.example.com).
	Scope string `json:"scope,omitempty"`

	// The ledger that records jobs and attempts: a module of namespace
	// idempotency.ledgers, named by its backend (file, memory, postgres,
	// redis, or a third party's). Default: the file ledger in Caddy's data
	// directory.
	LedgerRaw json.RawMessage `json:"ledger,omitempty" caddy:"namespace=idempotency.ledgers inline_key=backend"`

	// The owner of a request's key (placeholders allowed). Default: the
	// authenticated user {http.auth.user.id}, else the Authorization
	// header. An owner that resolves to "" is no owner: 401.
	Owner string `json:"owner,omitempty"`

	// Keys the HMAC-SHA-256 of stored owner and key hashes; set the same
	// value on every instance. Default: plain SHA-256.
	OwnerSecret string `json:"owner_secret,omitempty"`

	// The request header holding the key. Default Idempotency-Key.
	KeyHeader string `json:"key_header,omitempty"`

	// The methods that are ledgered. Default POST and PATCH.
	Methods []string `json:"methods,omitempty"`

	// Answers 400 to a ledgered method without a key.
	RequireKey bool `json:"require_key,omitempty"`

	// When set, keys a ledgered request that carries no key by its owner
	// and fingerprint (the key implicit:<fingerprint>), so that the
	// retries of a client that sends no key are one job; its job expires
	// this long after it completed or failed, instead of retention. Two
	// intended, identical requests within the window are one job too. Off
	// unless set; not together with require_key.
	ImplicitKey caddy.Duration `json:"implicit_key,omitempty"`

	// How the body enters the request fingerprint: raw, json (canonical
	// JSON) or graphql (the operation printed canonically, variables as
	// canonical JSON, operationName; only mutations are ledgered). Default
	// json.
	Fingerprint string `json:"fingerprint,omitempty"`

	// In json mode, JSON Pointers (RFC 6901) to the only members of the
	// body that enter the fingerprint; an absent member counts as absent,
	// distinct from null.
	FingerprintInclude []string `json:"fingerprint_include,omitempty"`

	// In json mode, JSON Pointers to members that do not enter the
	// fingerprint (a timestamp, a nonce, a trace id), whether present,
	// absent or null. Not together with fingerprint_include. A job keeps
	// the selection it was made with.
	FingerprintExclude []string `json:"fingerprint_exclude,omitempty"`

	// Request headers that enter the fingerprint.
	FingerprintHeaders []string `json:"fingerprint_headers,omitempty"`

	// When set, GET <status_path>/<key> (the key percent-encoded as one
	// path segment) is answered with the state of the owner's job as JSON
	// (job_id, state, created_at, completed_at, expires_at, attempts,
	// retry_after), or 404 job-not-found; another owner's job is
	// indistinguishable from none. It starts with "/" and is not "/"
	// alone. Off unless set.
	StatusPath string `json:"status_path,omitempty"`

	// The largest request body, in bytes, that is ledgered; larger ones
	// get 413. Default 1 MiB.
	MaxRequestBody int64 `json:"max_request_body,omitempty"`

	// The largest answer, in bytes, that is stored; larger ones are passed
	// through and not stored. Default 8 MiB.
	MaxResponseBody int64 `json:"max_response_body,omitempty"`

	// Response headers that are never stored nor replayed, beyond
	// Set-Cookie and the hop-by-hop headers, which never are: a CSRF
	// token, a per-client signature. The first client still gets them as
	// the provider sent them; replays, and answers stored before a name
	// was added, go without them.
	NeverStore []string `json:"never_store,omitempty"`

	// Seals the headers and bodies of stored answers in the ledger and in
	// the replay cache (AES-256-GCM), with keys that rotate by id. Off
	// unless set.
	Encryption *EncryptionConfig `json:"encryption,omitempty"`

	// How long a key stays one intent after its job completed or failed.
	// Default 24h.
	Retention caddy.Duration `json:"retention,omitempty"`

	// Bounds the wait for an answer's headers: past it the client gets 504
	// and the job is unknown. Default 30s.
	AttemptTimeout caddy.Duration `json:"attempt_timeout,omitempty"`

	// Bounds an attempt until its answer's last byte: the attempt's lease,
	// within which a late result may still complete the job. Default 5m.
	AttemptDeadline caddy.Duration `json:"attempt_deadline,omitempty"`

	// What a duplicate of a running job gets: "wait" (for the result, up
	// to in_flight_wait) or "reject" (409 at once). Default wait.
	InFlight string `json:"in_flight,omitempty"`

	// Bounds a duplicate's wait. Default: attempt_timeout.
	InFlightWait caddy.Duration `json:"in_flight_wait,omitempty"`

	// Caps the wait a client asks for with Prefer: wait=N (RFC 7240),
	// which applies to a duplicate of a running job whatever in_flight
	// says. 0 means the default, attempt_deadline; negative is an error.
	MaxWait caddy.Duration `json:"max_wait,omitempty"`

	// The answers that show a provider did not act on a request: status
	// codes (not 1xx or 2xx), connect_error and contract (which needs a
	// contract). Default connect_error 429 503.
	FailoverOn []string `json:"failover_on,omitempty"`

	// Starts a concurrent attempt on the next provider when the running
	// one has sent no answer headers for this long. Off unless set; only
	// for side-effect-free providers. Needs two providers or more, and is
	// shorter than attempt_timeout.
	HedgeAfter caddy.Duration `json:"hedge_after,omitempty"`

	// How often the reconciler of each gateway instance looks for unknown
	// attempts to settle with their provider's lookup; each attempt's
	// lookups back off from there. Default 30s; only with a provider that
	// has a lookup.
	ReconcileEvery caddy.Duration `json:"reconcile_every,omitempty"`

	// The providers, tried in the order given, the first being the
	// primary. Each is a list of routes, usually ending in reverse_proxy.
	// With none, the rest of the route is the single provider.
	Providers []*Provider `json:"providers,omitempty"`

	// A replay cache in front of the ledger: a module of namespace
	// idempotency.caches, named by its backend (redis). Completed answers
	// are replayed from it, and completions are published so that waiters
	// on every instance wake at once. The ledger stays the source of
	// truth.
	CacheRaw json.RawMessage `json:"cache,omitempty" caddy:"namespace=idempotency.caches inline_key=backend"`

	// The operational contract of the route's output: every answer whose
	// status it names is checked, and a breach is never a stored result.
	Contract *ContractConfig `json:"contract,omitempty"`

	// Sends a real request through each provider at start and every so
	// often; failover and hedging reach a provider only while its latest
	// probe passed. Needs providers.
	Probe *ProbeConfig `json:"probe,omitempty"`

	scope      string
	mw         *proxy.Middleware
	logger     *zap.Logger
	unregister func()
	unstack    func()
	eligible   func(int) bool // nil: every provider may take a failover or hedge
	adapting   *adapting      // while the Caddyfile is read
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.idempotency",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision sets up the ledger and the request flow.
func (h *Handler) Provision(ctx caddy.Context) error {
	h.logger = ctx.Logger()
	// Every mistake that can be seen before anything is opened.
	checked, err := h.check()
	if err != nil {
		return err
	}
	if h.scope, err = claimScope(ctx, h.Scope); err != nil {
		return err
	}
	store, err := h.loadLedger(ctx)
	if err != nil {
		return err
	}
	handlerLedger, err := h.stack(store)
	if err != nil {
		return err
	}

	var providers []proxy.Provider
	for _, p := range h.Providers {
		if err := p.provision(ctx); err != nil {
			return err
		}
		providers = append(providers, proxy.Provider{Name: p.Name, Handler: p,
			Deduplicates: http.CanonicalHeaderKey(p.Deduplicates), Lookup: p.Lookup != nil})
	}

	obs, err := newMetrics(ctx.GetMetricsRegistry(), h.scope)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	var answers proxy.Contract // the route's output contract, if any
	if h.Contract != nil {
		c, err := contract.Compile(contract.Spec{
			Statuses:      h.Contract.Status,
			ContentType:   h.Contract.ContentType,
			JSONSchema:    h.Contract.JSONSchema,
			JSONSchemaAt:  h.Contract.JSONSchemaAt,
			GraphQLSchema: h.Contract.GraphQLSchema,
		})
		if err != nil {
			return fmt.Errorf("contract: %w", err)
		}
		answers = c
	}
	names := []string{proxy.DefaultProvider}
	if len(providers) > 0 {
		names = names[:0]
		for _, p := range providers {
			names = append(names, p.Name)
		}
	}
	h.unregister = registerProviders(h.scope, names)

	if h.Probe != nil {
		h.eligible = probedEligible(h.scope, names)
	}

	cfg := proxy.Config{
		Observer:           obs,
		Contract:           answers,
		Eligible:           h.eligible,
		Providers:          providers,
		Scope:              h.scope,
		HedgeAfter:         time.Duration(h.HedgeAfter),
		ReconcileEvery:     time.Duration(h.ReconcileEvery),
		Ledger:             handlerLedger,
		KeyHeader:          h.KeyHeader,
		Methods:            append([]string(nil), h.Methods...),
		RequireKey:         h.RequireKey,
		ImplicitKey:        time.Duration(h.ImplicitKey),
		OwnerSecret:        []byte(h.OwnerSecret),
		FingerprintHeaders: append([]string(nil), h.FingerprintHeaders...),
		FingerprintInclude: append([]string(nil), h.FingerprintInclude...),
		FingerprintExclude: append([]string(nil), h.FingerprintExclude...),
		MaxRequestBody:     h.MaxRequestBody,
		MaxResponseBody:    h.MaxResponseBody,
		NeverStore:         append([]string(nil), h.NeverStore...),
		Retention:          time.Duration(h.Retention),
		AttemptTimeout:     time.Duration(h.AttemptTimeout),
		AttemptDeadline:    time.Duration(h.AttemptDeadline),
		InFlightWait:       time.Duration(h.InFlightWait),
		MaxWait:            time.Duration(h.MaxWait),
		StatusPath:         h.StatusPath,
		Owner:              h.owner,
		OriginalURI:        originalURI,
		IsConnectError:     isConnectError,
		PrepareAttempt:     prepareAttempt,
		Hold:               store.Hold,
		SetVar:             setVar,
		Logger:             h.logger,
	}
	if cfg.Fingerprint, err = fingerprint.ParseBodyMode(h.Fingerprint); err != nil {
		return err
	}
	if cfg.InFlightReject, err = inFlightReject(h.InFlight); err != nil {
		return err
	}
	cfg.FailoverOn = checked.failoverOn
	if h.mw, err = proxy.New(cfg); err != nil {
		return err
	}
	if h.Probe != nil {
		// The probe's bounds are the attempts', defaults filled in.
		c := h.mw.Config()
		pr := &prober{
			cfg:      *h.Probe,
			timeout:  c.AttemptTimeout,
			max:      c.MaxResponseBody,
			contract: answers,
			scope:    h.scope,
			metrics:  obs,
			logger:   h.logger.With(zap.String("scope", h.scope)),
		}
		if h.Probe.BodyFile != "" {
			if pr.body, err = os.ReadFile(h.Probe.BodyFile); err != nil {
				return fmt.Errorf("probe: %w", err)
			}
		}
		pr.start(ctx, h.Providers)
	}
	h.startReconciler(ctx, handlerLedger, obs)
	return nil
}

// startReconciler runs the lookups of the providers that have one, until
// the config is unloaded.
func (h *Handler) startReconciler(ctx caddy.Context, l ledger.Ledger, obs *metrics) {
	ls := lookups(h.Providers, h.mw.Config().MaxResponseBody)
	if len(ls) == 0 {
		return
	}
	rc := h.mw.Reconciler(ls)
	rc.Ledger = l
	rc.Reconciled = obs.Reconciled
	rc.Logger = h.logger.With(zap.String("scope", h.scope))
	go rc.Run(ctx)
}

// inFlightReject is the rule of in_flight, in JSON and in a Caddyfile:
// whether duplicates of a running job get 409 at once instead of waiting.
func inFlightReject(mode string) (bool, error) {
	if mode != "" && mode != "wait" && mode != "reject" {
		return false, fmt.Errorf("in_flight must be wait or reject, not %q", mode)
	}
	return mode == "reject", nil
}

// checkStatusPath is the rule of status_path, in JSON and in a Caddyfile:
// a path that starts with "/" and is not "/" alone (which would take
// every GET of the site). In JSON, "" is off.
func checkStatusPath(p string) error {
	if p == "" || p[0] != '/' || strings.Trim(p, "/") == "" {
		return fmt.Errorf("status_path must be a path starting with / other than /, not %q", p)
	}
	return nil
}

// loadLedger loads the ledger module and, when one is configured, the
// cache module in front of it: what it returns is the handler's ledger.
func (h *Handler) loadLedger(ctx caddy.Context) (LedgerModule, error) {
	if h.LedgerRaw == nil {
		h.LedgerRaw = json.RawMessage(`{"backend":"file"}`)
	}
	mod, err := ctx.LoadModule(h, "LedgerRaw")
	if err != nil {
		return nil, fmt.Errorf("loading ledger: %w", err)
	}
	truth, ok := mod.(LedgerModule)
	if !ok {
		return nil, fmt.Errorf("ledger module %T is not a LedgerModule", mod)
	}
	if h.CacheRaw == nil {
		return truth, nil
	}
	if mod, err = ctx.LoadModule(h, "CacheRaw"); err != nil {
		return nil, fmt.Errorf("loading cache: %w", err)
	}
	c, ok := mod.(CacheModule)
	if !ok {
		return nil, fmt.Errorf("cache module %T is not a CacheModule", mod)
	}
	return c.Front(truth, []byte(h.OwnerSecret))
}

// stack returns the ledger the handler's requests use: store's, its
// answers sealed when Encryption is set; and registers it with the admin
// API, which purges owners and seals operators' answers.
func (h *Handler) stack(store LedgerModule) (ledger.Ledger, error) {
	s := &stack{ledger: store.Ledger(), secret: h.OwnerSecret, hasher: proxy.NewHasher([]byte(h.OwnerSecret)), hold: store.Hold}
	s.store, s.cache = poolKeys(store)
	if h.Encryption != nil {
		var err error
		if s.keys, err = h.Encryption.keyring(); err != nil {
			return nil, err
		}
	}
	h.unstack = registerStack(s)
	if s.keys == nil {
		return s.ledger, nil
	}
	return sealed.New(s.ledger, s.keys), nil
}

// Cleanup takes the handler's providers off the admin API's list. The
// ledger and cache modules release their own holds; in-flight attempts
// hold their own references.
func (h *Handler) Cleanup() error {
	if h.unregister != nil {
		h.unregister()
	}
	if h.unstack != nil {
		h.unstack()
	}
	return nil
}

// ServeHTTP runs the idempotent flow in front of next.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	return h.mw.ServeHTTP(w, r, next)
}

// owner resolves the owner of a request.
func (h *Handler) owner(r *http.Request) string {
	repl, _ := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if h.Owner != "" {
		if repl == nil {
			return ""
		}
		return repl.ReplaceAll(h.Owner, "")
	}
	if repl != nil {
		if id, ok := repl.GetString("http.auth.user.id"); ok && id != "" {
			return "user:" + id
		}
	}
	if a := r.Header.Get("Authorization"); a != "" {
		return "authorization:" + a
	}
	return ""
}

// originalURI is the request URI as the client sent it, before rewrites.
func originalURI(r *http.Request) string {
	if or, ok := r.Context().Value(caddyhttp.OriginalRequestCtxKey).(http.Request); ok && or.RequestURI != "" {
		return or.RequestURI
	}
	return r.RequestURI
}

// ContractConfig is the operational contract of a route's output.
type ContractConfig struct {
	// The answers the contract checks: codes and classes such as 2xx.
	// Default 2xx.
	Status []string `json:"status,omitempty"`
	// The media type answers must have.
	ContentType string `json:"content_type,omitempty"`
	// A JSON Schema file (draft 2020-12) answers must match.
	JSONSchema string `json:"json_schema,omitempty"`
	// A JSON Pointer (RFC 6901) to the member of the answer that
	// json_schema checks, instead of the whole body: a string there is
	// parsed as JSON first (a model's structured output:
	// /choices/0/message/content, /content/0/text), and a streamed
	// completion (text/event-stream, OpenAI- or Anthropic-style deltas) is
	// assembled into the non-streamed layout first. Needs json_schema.
	JSONSchemaAt string `json:"json_schema_at,omitempty"`
	// A GraphQL SDL file: an answer's data must match the selection set of
	// the request's operation, typed by this schema.
	GraphQLSchema string `json:"graphql_schema,omitempty"`
}

// errNoUpstream is reverse_proxy's message when no upstream can be chosen.
const errNoUpstream = "no upstreams available"

// isConnectError reports whether a handler error means the request never
// left: a dial or TLS handshake failure, or no upstream available.
func isConnectError(err error) bool {
	var de reverseproxy.DialError
	if errors.As(err, &de) || errors.Is(err, errNoAnswer) {
		return true
	}
	var he caddyhttp.HandlerError
	if errors.As(err, &he) && he.StatusCode == http.StatusServiceUnavailable && he.Err != nil && he.Err.Error() == errNoUpstream {
		return true
	}
	var (
		rh  tls.RecordHeaderError
		ae  tls.AlertError
		cve *tls.CertificateVerificationError
		ua  x509.UnknownAuthorityError
		hn  x509.HostnameError
		ci  x509.CertificateInvalidError
	)
	return errors.As(err, &rh) || errors.As(err, &ae) || errors.As(err, &cve) ||
		errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) ||
		strings.Contains(err.Error(), "tls: handshake")
}

// prepareAttempt gives an attempt its own copy of the request's vars:
// reverse_proxy writes them without a lock, and the attempt may outlive the
// request.
func prepareAttempt(r *http.Request) *http.Request {
	vars, ok := r.Context().Value(caddyhttp.VarsCtxKey).(map[string]any)
	if !ok {
		return r
	}
	c := make(map[string]any, len(vars)+4)
	for k, v := range vars {
		c[k] = v
	}
	return r.WithContext(context.WithValue(r.Context(), caddyhttp.VarsCtxKey, c))
}

// setVar publishes {http.idempotency.<name>}.
func setVar(r *http.Request, name, value string) {
	if repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); ok {
		key, known := varNames[name]
		if !known {
			key = "http.idempotency." + name
		}
		repl.Set(key, value)
	}
}

// varNames are the placeholders' full names, built once.
var varNames = map[string]string{
	"job_id":   "http.idempotency.job_id",
	"attempt":  "http.idempotency.attempt",
	"replayed": "http.idempotency.replayed",
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
)
