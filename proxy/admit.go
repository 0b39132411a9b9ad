package proxy

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/onejob/onejob/fingerprint"
)

// incoming is a request the gateway ledgers, as admit read it.
type incoming struct {
	key      string // its idempotency key; "" when implicit
	implicit bool   // it has no key and is keyed by its fingerprint (implicit_key)
	owner    string
	body     []byte
	graphql  *fingerprint.GraphQLRequest // in graphql mode, the mutation it carries; nil if it does not parse
}

// admit reads what the flow needs from r: its key, owner and body. It
// returns the request to ledger, or nil and pass when r goes to next
// untouched (a method that is not ledgered, no key where none is required,
// a GraphQL query, a request nested behind another gateway's attempt),
// or nil after it answered r with a problem, or nil and the error of a
// client that went away mid-body.
func (m *Middleware) admit(w http.ResponseWriter, r *http.Request) (in *incoming, pass bool, err error) {
	if !slices.Contains(m.cfg.Methods, r.Method) {
		return nil, true, nil
	}
	if r.Context().Value(guardedKey{}) != nil {
		// An attempt of a gateway in front (a handler nested behind
		// another): that one holds the job, so this one passes it on.
		// Reserving it again would find the job in flight, and wait on
		// it while the job waits on this attempt.
		m.nested.Do(func() {
			m.cfg.Logger.Warn("idempotency handler nested behind another: it passes the requests the first one guards through")
		})
		return nil, true, nil
	}
	in = new(incoming)
	values := r.Header.Values(m.cfg.KeyHeader)
	in.implicit = len(values) == 0 && m.cfg.ImplicitKey > 0
	switch {
	case in.implicit:
	case len(values) == 0:
		if m.cfg.RequireKey {
			m.reject(w, problem(http.StatusBadRequest, ProblemKeyMissing, "Idempotency key missing").
				withDetail("This endpoint requires the "+m.cfg.KeyHeader+" header."))
			return nil, false, nil
		}
		return nil, true, nil
	case len(values) > 1:
		m.reject(w, problem(http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key").
			withDetail("The request has more than one "+m.cfg.KeyHeader+" header."))
		return nil, false, nil
	default:
		if in.key, err = ParseKey(values[0]); err != nil {
			m.reject(w, problem(http.StatusBadRequest, ProblemKeyInvalid, "Invalid idempotency key").withDetail(err.Error()+"."))
			return nil, false, nil
		}
	}
	if in.owner = m.cfg.Owner(r); in.owner == "" {
		m.reject(w, problem(http.StatusUnauthorized, ProblemOwnerMissing, "No owner for the idempotency key").
			withDetail("Idempotency keys belong to an authenticated owner; this request has none."))
		return nil, false, nil
	}
	in.body, err = readBody(r, m.cfg.MaxRequestBody)
	if errors.Is(err, errBodyTooLarge) {
		m.reject(w, problem(http.StatusRequestEntityTooLarge, ProblemBodyTooLarge, "Request body too large").
			withDetail("The body is over max_request_body ("+strconv.FormatInt(m.cfg.MaxRequestBody, 10)+" bytes)."))
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err // the client went away mid-body; there is no job
	}
	if m.cfg.Fingerprint == fingerprint.BodyGraphQL {
		// Only mutations are ledgered; a document that does not parse is
		// forwarded as it is (the upstream owns GraphQL errors) and
		// fingerprinted raw.
		if g, ok := fingerprint.ParseGraphQL(in.body); ok {
			if !g.Mutation {
				r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(in.body)), int64(len(in.body))
				return nil, true, nil
			}
			in.graphql = &g
		}
	}
	return in, false, nil
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
