package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// identity is one intent: a key under an owner.
type identity struct {
	Owner, Key string
}

func (id identity) String() string { return id.Owner + "/" + id.Key }

// requestBody is the same bytes on every try of an identity.
func (id identity) requestBody() []byte {
	h := sha256.Sum256([]byte(id.String()))
	return fmt.Appendf(nil, `{"owner":%q,"key":%q,"amount":%d}`, id.Owner, id.Key, int(h[0])<<8|int(h[1]))
}

// requestSeq numbers every request the driver sends; the number goes out
// as X-Chaos-Request, which the gateway passes upstream, so an arrival
// names the client request that started its attempt.
var requestSeq atomic.Uint64

const requestHeader = "X-Chaos-Request"

// exchange is one request a client sent, and what came of it.
type exchange struct {
	ID       identity
	Request  uint64 // X-Chaos-Request
	Instance int
	Try      int // 1 for a session's first request
	Start    time.Time
	End      time.Time
	// Err is set when no answer came: a transport error, or the client
	// gave up (Cut says how: "timeout", "disconnect" or "stopped").
	Err string
	Cut string
	// The answer.
	Status     int
	JobID      string // Idempotency-Job-Id
	Replayed   bool   // Idempotent-Replayed: true
	RetryAfter bool
	Problem    string // the problem type's name, for application/problem+json
	ProblemJob string // its job_id member
	Up         *answerBody
	Sum        [32]byte
	Len        int
}

// upstreamAnswer reports whether the body is one the upstream wrote.
func (e *exchange) upstreamAnswer() bool { return e.Up != nil }

// problem is the part of an RFC 9457 body the clients read.
type problem struct {
	Type  string `json:"type"`
	JobID string `json:"job_id"`
}

// clientConfig shapes the clients' behaviour.
type clientConfig struct {
	Clients   int
	Owners    []string
	Keys      int // per owner
	MaxTries  int // per session
	Gateways  func() []string
	Path      string        // where the requests go
	KeyPrefix string        // the keys' names start with it
	ThinkTime time.Duration // mean pause between sessions
	// The keys in use slide from the first to the last over Duration, so
	// that new jobs start throughout the run.
	Start    time.Time
	Duration time.Duration
}

// keyWindow is how many keys per owner are new at any moment.
const keyWindow = 25

// clients are the concurrent clients of a run.
type clients struct {
	cfg    clientConfig
	http   *http.Client
	recent struct {
		sync.Mutex
		ids []identity
	}

	mu       sync.Mutex
	log      []exchange
	sessions atomic.Int64
	gaveUp   atomic.Int64 // sessions that ended without a final answer
}

func newClients(cfg clientConfig) *clients {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
		MaxIdleConns:        cfg.Clients * 3,
		MaxIdleConnsPerHost: cfg.Clients,
		IdleConnTimeout:     30 * time.Second,
	}
	return &clients{cfg: cfg, http: &http.Client{Transport: tr, Timeout: 10 * time.Second}}
}

// identities returns every identity the clients may use.
func (c *clients) identities() []identity {
	var out []identity
	for _, o := range c.cfg.Owners {
		for k := range c.cfg.Keys {
			out = append(out, identity{Owner: o, Key: c.keyName(k)})
		}
	}
	return out
}

func (c *clients) keyName(k int) string { return fmt.Sprintf("%s%05d", c.cfg.KeyPrefix, k) }

// run starts the clients and returns when ctx ends and every client has
// stopped.
func (c *clients) run(ctx context.Context) {
	var wg sync.WaitGroup
	for range c.cfg.Clients {
		wg.Go(func() {
			for ctx.Err() == nil {
				c.session(ctx, c.pick())
				sleep(ctx, randDuration(c.cfg.ThinkTime/2, c.cfg.ThinkTime*3/2))
			}
		})
	}
	wg.Wait()
	c.http.CloseIdleConnections()
}

// pick chooses the next identity: mostly one of the newest keys (a window
// sliding over the keys as the run goes), sometimes an older one (a
// replay), sometimes one another client chose a moment ago, so that
// duplicates meet in flight.
func (c *clients) pick() identity {
	c.recent.Lock()
	defer c.recent.Unlock()
	if n := len(c.recent.ids); n > 0 && rand.IntN(5) == 0 {
		return c.recent.ids[rand.IntN(n)]
	}
	progress := min(1, float64(time.Since(c.cfg.Start))/float64(c.cfg.Duration))
	window := min(keyWindow, c.cfg.Keys)
	hi := window + int(progress*float64(c.cfg.Keys-window)) // keys [0, hi) are in use
	k := hi - window + rand.IntN(window)
	if rand.IntN(4) == 0 {
		k = rand.IntN(hi)
	}
	id := identity{Owner: c.cfg.Owners[rand.IntN(len(c.cfg.Owners))], Key: c.keyName(k)}
	c.recent.ids = append(c.recent.ids, id)
	if len(c.recent.ids) > 64 {
		c.recent.ids = c.recent.ids[1:]
	}
	return id
}

// session sends one identity's request until it has a final answer: a
// result (2xx), a replay, a job known to be unknown, or MaxTries.
func (c *clients) session(ctx context.Context, id identity) {
	c.sessions.Add(1)
	body := id.requestBody()
	for try := 1; try <= c.cfg.MaxTries; try++ {
		if ctx.Err() != nil {
			return
		}
		gws := c.cfg.Gateways()
		inst := rand.IntN(len(gws))
		e := c.send(ctx, gws[inst], id, body)
		e.Instance, e.Try = inst, try
		c.mu.Lock()
		c.log = append(c.log, e)
		c.mu.Unlock()
		if final(e) {
			return
		}
		// Back off: longer when told to.
		wait := randDuration(50*time.Millisecond, 400*time.Millisecond)
		if e.RetryAfter {
			wait += 500 * time.Millisecond
		}
		if !sleep(ctx, wait) {
			return
		}
	}
	c.gaveUp.Add(1)
}

// final reports whether an answer ends the session.
func final(e exchange) bool {
	switch {
	case e.Err != "":
		return false
	case e.Replayed:
		return true
	case e.Status >= 200 && e.Status < 300:
		return true
	case e.Status == http.StatusConflict && e.Problem == "outcome-unknown" && !e.RetryAfter:
		return true // unknown for good: only an operator can settle it
	case e.Status == http.StatusConflict && e.Problem == "response-not-stored":
		return true // completed, but there is nothing to replay
	case e.Status == http.StatusConflict, e.Status >= 500:
		return false
	}
	return true // any other answer would be the same on a retry
}

// send makes one request, with a random client-side timeout, and sometimes
// walks away from it (a disconnect).
func (c *clients) send(ctx context.Context, gw string, id identity, body []byte) exchange {
	e := exchange{ID: id, Request: requestSeq.Add(1), Start: time.Now()}
	var (
		limit time.Duration
		cut   string
	)
	switch n := rand.IntN(100); {
	case n < 15:
		limit, cut = randDuration(20*time.Millisecond, 600*time.Millisecond), "disconnect"
	case n < 30:
		limit, cut = randDuration(300*time.Millisecond, 1500*time.Millisecond), "timeout"
	default:
		limit, cut = 5*time.Second, "timeout"
	}
	rctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, gw+c.cfg.Path, bytes.NewReader(body))
	if err != nil {
		panic(err) // a fixed method and a valid URL
	}
	req.Header.Set("Idempotency-Key", id.Key)
	req.Header.Set("Authorization", "Bearer "+id.Owner)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(requestHeader, strconv.FormatUint(e.Request, 10))
	// Go's client re-sends a request carrying Idempotency-Key on its own
	// when a reused connection breaks, if it can rewind the body: one
	// exchange must be one request.
	req.GetBody = nil
	resp, err := c.http.Do(req)
	if err == nil {
		var b []byte
		b, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			e.read(resp, b)
		}
	}
	e.End = time.Now()
	if err != nil {
		e.Status = 0
		e.Err = err.Error()
		switch {
		case ctx.Err() != nil:
			e.Cut = "stopped"
		case errors.Is(rctx.Err(), context.DeadlineExceeded):
			e.Cut = cut
		}
	}
	return e
}

// read records an answer.
func (e *exchange) read(resp *http.Response, b []byte) {
	e.Status = resp.StatusCode
	e.JobID = resp.Header.Get("Idempotency-Job-Id")
	e.Replayed = resp.Header.Get("Idempotent-Replayed") == "true"
	e.RetryAfter = resp.Header.Get("Retry-After") != ""
	e.Sum, e.Len = sha256.Sum256(b), len(b)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p problem
		if json.Unmarshal(b, &p) == nil {
			e.Problem = strings.TrimPrefix(p.Type, "urn:onejob:problem:")
			e.ProblemJob = p.JobID
		}
		return
	}
	var a answerBody
	if json.Unmarshal(b, &a) == nil && a.Seq != 0 {
		e.Up = &a
	}
}

// exchanges returns the log so far.
func (c *clients) exchanges() []exchange {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]exchange(nil), c.log...)
}
