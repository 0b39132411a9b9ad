package proxy

import (
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
	"go.uber.org/zap"
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

// ServeHTTP runs the flow for one request: admit reads its key, owner and
// body; reserve records its intent in the ledger, whose answer says who is
// first; dispatch acts on that answer (run the job's attempts, replay its
// answer, wait for it, or say why not). Requests that are not ledgered go
// to next untouched.
func (m *Middleware) ServeHTTP(w http.ResponseWriter, r *http.Request, next Handler) error {
	if m.serveStatus(w, r) {
		return nil
	}
	in, pass, err := m.admit(w, r)
	if pass {
		return next.ServeHTTP(w, r)
	}
	if in == nil {
		return err
	}
	res, issued, err := m.reserve(r, in)
	if err != nil {
		if r.Context().Err() != nil {
			return nil
		}
		m.cfg.Logger.Error("ledger unavailable: request not forwarded", zap.Error(err))
		m.reject(w, problem(http.StatusServiceUnavailable, ProblemLedgerUnavailable, "Ledger unavailable").
			withDetail("The request was not forwarded: it could not be recorded.").retry(time.Second))
		return nil
	}
	return m.dispatch(w, r, next, res, issued, in.body)
}
