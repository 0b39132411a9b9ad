// Package demopayments is a deterministic stand-in for a payments API
// that keeps its own idempotency store, for the demo in
// Caddyfile.example: the Caddy handler http.handlers.demo_payments makes
// a charge for each POST, once per Idempotency-Key, and answers lookups
// of the charges it made. It can lose the first answer for a path (its
// connection closed after the charge) or answer late, so the gateway
// sees outcomes it cannot know. It is built only into ./cmd/caddy, never
// into the plugin.
package demopayments

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Payments{})
	httpcaddyfile.RegisterHandlerDirective("demo_payments", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("demo_payments", httpcaddyfile.Before, "respond")
}

// LookupPrefix is where the charge made for an identity is looked up:
// GET /charges/by-job/<job id or key>.
const LookupPrefix = "/charges/by-job/"

// Payments is a demo payments API with a store of its own, in memory. A
// POST's identity is its Idempotency-Key (the job id, from a gateway
// that knows the provider deduplicates), else its Idempotency-Job-Id: the
// first POST for an identity makes a charge, one while that charge's
// answer is still on its way is refused with 409, and every later one
// gets the stored charge again. Charge ids count the charges made, so a
// second charge would show.
type Payments struct {
	// BreakFirst closes the connection of the first POST for each path
	// after its charge was made, without an answer: the caller cannot
	// know whether it was charged.
	BreakFirst bool `json:"break_first,omitempty"`
	// Slow delays each new charge's answer by this long; the charge is
	// made, and found by a lookup, at once.
	Slow caddy.Duration `json:"slow,omitempty"`

	store *store
}

// store is what a Payments has done since the config loaded.
type store struct {
	mu      sync.Mutex
	made    []*charge          // every charge, in order
	byKey   map[string]*charge // by identity
	byJob   map[string]*charge // by Idempotency-Job-Id
	running map[string]bool    // identities whose charge has not been answered yet
	effects map[string]int     // charges made per identity: 1, or a duplicate
	broken  map[string]bool    // paths whose first POST lost its answer
}

// charge is a charge as the API answers it.
type charge struct {
	ID             string `json:"id"`
	Object         string `json:"object"`
	Path           string `json:"path"`
	IdempotencyKey string `json:"idempotency_key"`
	JobID          string `json:"job_id,omitempty"`
	Attempt        int    `json:"attempt,omitempty"`
}

// Provision starts an empty store.
func (p *Payments) Provision(caddy.Context) error {
	p.store = newStore()
	return nil
}

func newStore() *store {
	return &store{
		byKey: map[string]*charge{}, byJob: map[string]*charge{},
		running: map[string]bool{}, effects: map[string]int{}, broken: map[string]bool{},
	}
}

// CaddyModule returns the Caddy module information.
func (Payments) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.demo_payments",
		New: func() caddy.Module { return new(Payments) },
	}
}

// UnmarshalCaddyfile sets up the API. Syntax:
//
//	demo_payments {
//		break_first
//		slow <duration>
//	}
func (p *Payments) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	seen := map[string]bool{}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		option := d.Val()
		if option != "break_first" && option != "slow" {
			return d.Errf("demo_payments: unknown option %q (want break_first or slow)", option)
		}
		if seen[option] {
			return d.Errf("demo_payments: duplicate %q", option)
		}
		seen[option] = true
		args := d.RemainingArgs()
		if option == "break_first" {
			if len(args) != 0 {
				return d.ArgErr()
			}
			p.BreakFirst = true
			continue
		}
		if len(args) != 1 {
			return d.ArgErr()
		}
		dur, err := caddy.ParseDuration(args[0])
		if err != nil {
			return d.Errf("demo_payments: slow %q: %v", args[0], err)
		}
		if dur <= 0 {
			return d.Errf("demo_payments: slow must be longer than 0, not %q: leave it out to answer at once", args[0])
		}
		p.Slow = caddy.Duration(dur)
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	p := new(Payments)
	err := p.UnmarshalCaddyfile(h.Dispenser)
	return p, err
}

// ServeHTTP answers a POST with a charge, GET /charges with every charge
// made and GET /charges/by-job/<identity> with one; next is never called.
func (p *Payments) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	switch {
	case r.Method == http.MethodPost:
		return p.charge(w, r)
	case r.Method == http.MethodGet && r.URL.Path == "/charges":
		s := p.store
		s.mu.Lock()
		list := append([]*charge{}, s.made...)
		s.mu.Unlock()
		return answer(w, http.StatusOK, map[string]any{"charges": list})
	case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, LookupPrefix):
		id := strings.TrimPrefix(r.URL.Path, LookupPrefix)
		if c := p.store.find(id); c != nil {
			return answer(w, http.StatusOK, c)
		}
		return answer(w, http.StatusNotFound, map[string]string{"error": "no charge", "id": id})
	case r.Method == http.MethodGet:
		return answer(w, http.StatusNotFound, map[string]string{"error": "not found"})
	}
	w.Header().Set("Allow", "GET, POST")
	return answer(w, http.StatusMethodNotAllowed, map[string]string{"error": "GET or POST"})
}

// charge makes the charge a POST asks for, once per identity.
func (p *Payments) charge(w http.ResponseWriter, r *http.Request) error {
	job := r.Header.Get("Idempotency-Job-Id")
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		key = job
	}
	if key == "" {
		return answer(w, http.StatusBadRequest, map[string]string{"error": "an Idempotency-Key is required"})
	}
	attempt, _ := strconv.Atoi(r.Header.Get("Idempotency-Attempt"))
	// The body is read to its end, so that a caller who leaves is noticed.
	if _, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, 1<<20)); err != nil {
		return answer(w, http.StatusBadRequest, map[string]string{"error": "the body: " + err.Error()})
	}

	s := p.store
	s.mu.Lock()
	if s.running[key] {
		s.mu.Unlock()
		return answer(w, http.StatusConflict, map[string]string{"error": "in progress", "idempotency_key": key})
	}
	if c := s.byKey[key]; c != nil {
		s.mu.Unlock()
		return answer(w, http.StatusCreated, c)
	}
	c := &charge{
		ID: fmt.Sprintf("ch_%d", len(s.made)+1), Object: "charge", Path: r.URL.Path,
		IdempotencyKey: key, JobID: job, Attempt: attempt,
	}
	s.made = append(s.made, c)
	s.byKey[key] = c
	if job != "" && s.byJob[job] == nil {
		s.byJob[job] = c
	}
	s.effects[key]++
	breaks := p.BreakFirst && !s.broken[c.Path]
	if breaks {
		s.broken[c.Path] = true
	}
	s.running[key] = true
	s.mu.Unlock()

	if p.Slow > 0 {
		t := time.NewTimer(time.Duration(p.Slow))
		select {
		case <-t.C:
		case <-r.Context().Done(): // the caller left; the charge stands
			t.Stop()
		}
	}
	s.mu.Lock()
	delete(s.running, key)
	s.mu.Unlock()
	if r.Context().Err() != nil {
		return nil
	}
	if breaks {
		// The charge is made; its answer is lost with the connection.
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			return conn.Close()
		}
		panic(http.ErrAbortHandler) // no connection of its own (HTTP/2): reset the stream
	}
	return answer(w, http.StatusCreated, c)
}

// find is the charge made for an identity, or for a job id.
func (s *store) find(id string) *charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.byKey[id]; c != nil {
		return c
	}
	return s.byJob[id]
}

// sideEffects is how many charges were made for an identity.
func (s *store) sideEffects(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.effects[key]
}

// answer writes v as JSON with status.
func answer(w http.ResponseWriter, status int, v any) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(v)
}

// Interface guards
var (
	_ caddy.Provisioner           = (*Payments)(nil)
	_ caddyhttp.MiddlewareHandler = (*Payments)(nil)
	_ caddyfile.Unmarshaler       = (*Payments)(nil)
)
