package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/caddyserver/caddy/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/proxy"
)

// The reconciler itself is proxy.Reconciler; what a handler gives it is
// each provider's lookup, sent through the provider's routes in process.

// lookups returns the lookups of h's providers that have one; each
// answer is kept up to max bytes.
func lookups(providers []*Provider, max int64) []proxy.Lookup {
	var ls []proxy.Lookup
	for _, p := range providers {
		if p.Lookup != nil {
			ls = append(ls, proxy.Lookup{Provider: p.Name, Absent: p.Lookup.Absent,
				Send: func(ctx context.Context, a *ledger.Attempt) (int, http.Header, []byte, error) {
					return lookup(ctx, p, a, max)
				}})
		}
	}
	return ls
}

// lookup sends p's lookup for attempt a through p's routes, in process, and
// returns its answer; an error when it got none or a larger one than max.
func lookup(ctx context.Context, p *Provider, a *ledger.Attempt, max int64) (int, http.Header, []byte, error) {
	repl := caddy.NewReplacer()
	attempt := strconv.Itoa(a.Number)
	for _, prefix := range []string{"idempotency.", "http.idempotency."} {
		repl.Set(prefix+"job_id", a.JobID)
		repl.Set(prefix+"attempt", attempt)
	}
	uri := repl.ReplaceKnown(p.Lookup.URI, "")
	header := http.Header{proxy.HeaderJobID: {a.JobID}, proxy.HeaderAttempt: {attempt}}
	rec, err := sendInProcess(ctx, p, p.Lookup.Method, uri, header, nil, repl, max)
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
