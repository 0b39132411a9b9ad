package proxy

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"sync"

	"github.com/onejob/onejob/contract"
	"github.com/onejob/onejob/ledger"
)

// capture is the ResponseWriter an attempt's handler writes to. It buffers
// the answer, up to max bytes, until it has ended. An answer that must go
// out before it ends — a stream (text/event-stream, or a flush), or one
// larger than max — is offered to commit first: once committed, the rest
// goes to the writer commit chose (the client, or nowhere), and is still
// recorded up to max when commit asks for it.
type capture struct {
	header    http.Header
	status    int
	wrote     bool
	buf       bytes.Buffer
	size      int64
	max       int64
	hooks     captureHooks
	committed bool
	out       io.Writer   // once committed: where the answer goes; nil drops it
	recording bool        // once committed: still recording into buf
	truncated bool        // a part of the answer was not recorded
	live      *liveStream // joiners read buf: writes to it are made under its lock
}

// captureHooks connects a capture to its attempt.
type captureHooks interface {
	// headers is called once, at the answer's final status.
	headers(c *capture)
	// commit is offered an answer that must go out before it ends. It
	// returns where the answer goes and whether to keep recording it; ok
	// false (only allowed when !overflow) keeps buffering.
	commit(c *capture, overflow bool) (out io.Writer, record, ok bool)
}

func newCapture(max int64, hooks captureHooks) *capture {
	return &capture{header: make(http.Header), max: max, hooks: hooks}
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	if c.wrote || (code >= 100 && code < 200) {
		return // informational answers are not recorded
	}
	c.wrote, c.status = true, code
	c.hooks.headers(c)
	if contract.IsEventStream(c.header) {
		c.tryCommit(false)
	}
}

func (c *capture) tryCommit(overflow bool) {
	out, record, ok := c.hooks.commit(c, overflow)
	if !ok && !overflow {
		return
	}
	if c.live != nil {
		c.live.lock()
		defer c.live.unlock()
	}
	c.committed, c.out, c.recording = true, out, record && !overflow
	if out != nil && c.buf.Len() > 0 {
		out.Write(c.buf.Bytes())
	}
	if !c.recording {
		c.buf = bytes.Buffer{}
		c.truncated = true
	}
	if c.live != nil {
		c.live.grew()
	}
}

func (c *capture) Write(p []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	c.size += int64(len(p))
	if !c.committed && int64(c.buf.Len()+len(p)) > c.max {
		c.tryCommit(true)
	}
	if !c.committed {
		return c.buf.Write(p)
	}
	if c.out != nil {
		c.out.Write(p)
	}
	if c.recording {
		if c.live != nil {
			c.live.lock()
		}
		if int64(c.buf.Len()+len(p)) > c.max {
			c.recording, c.truncated = false, true
			c.buf = bytes.Buffer{}
		} else {
			c.buf.Write(p)
		}
		if c.live != nil {
			c.live.grew()
			c.live.unlock()
		}
	}
	return len(p), nil
}

// Flush marks a streamed answer: it is offered to commit, and once it goes
// to the client, the flush goes through. An answer with a Content-Length is
// not a stream, and a flush does not commit it: reverse_proxy flushes an
// answer cut short just before it aborts, and such an answer, which has not
// won, must stay unknown rather than take the result slot.
func (c *capture) Flush() {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	if !c.committed && c.header.Get("Content-Length") == "" {
		c.tryCommit(false)
	}
	if f, ok := c.out.(http.Flusher); ok {
		f.Flush()
	}
}

// client is the client's ResponseWriter as seen from an attempt's goroutine:
// usable only while attached. The request's own goroutine detaches it before
// it returns, and write errors (a departed client) are swallowed, so that
// the attempt always runs to its end.
type client struct {
	mu       sync.Mutex
	w        http.ResponseWriter
	detached bool
	failed   bool
}

// attach reports whether the writer can still be used, and if so marks it
// in use by the attempt until release.
func (c *client) tryLock() bool {
	c.mu.Lock()
	if c.detached {
		c.mu.Unlock()
		return false
	}
	return true
}

func (c *client) detach() {
	c.mu.Lock()
	c.detached = true
	c.mu.Unlock()
}

func (c *client) Write(p []byte) (int, error) {
	if !c.tryLock() {
		return len(p), nil
	}
	defer c.mu.Unlock()
	if !c.failed {
		if _, err := c.w.Write(p); err != nil {
			c.failed = true
		}
	}
	return len(p), nil
}

func (c *client) Flush() {
	if !c.tryLock() {
		return
	}
	defer c.mu.Unlock()
	if !c.failed {
		if err := http.NewResponseController(c.w).Flush(); err != nil {
			c.failed = true
		}
	}
}

// ownHeaders are the headers the gateway sets on an answer itself; a
// provider's value of one reaches no client and no record.
var ownHeaders = []string{HeaderJobID, HeaderReplayed, HeaderExpires}

// OwnHeader reports whether the header named name (in any case) is one the
// gateway sets on an answer itself.
func OwnHeader(name string) bool {
	return slices.Contains(ownHeaders, http.CanonicalHeaderKey(name))
}

// neverStoredHeaders are the headers no stored answer carries
// (docs/contract.md, section 5), each with whether the first client still
// gets it from the provider. The hop-by-hop headers and Date (which a
// replay sets anew) are not end-to-end, and the gateway's own are its to
// set: nobody gets them from a record. Set-Cookie is end-to-end but
// belongs to the first client alone: a session or a CSRF token handed to
// every retry would be handed to whoever holds the key. Config.NeverStore
// adds names of the second kind.
var neverStoredHeaders = func() map[string]bool {
	m := map[string]bool{
		"Connection": false, "Keep-Alive": false, "Proxy-Authenticate": false, "Proxy-Authorization": false,
		"Proxy-Connection": false, "Te": false, "Trailer": false, "Transfer-Encoding": false, "Upgrade": false,
		"Date":       false,
		"Set-Cookie": true,
	}
	for _, k := range ownHeaders {
		m[k] = false
	}
	return m
}()

// NeverStored reports whether the header named name (in any case) is one no
// stored answer carries (docs/contract.md, section 5): a hop-by-hop header,
// Date, which a replay sets anew, one of the gateway's own (OwnHeader), or
// Set-Cookie, which only the first client gets. A handler's never_store
// names more (Middleware.NeverStored). An answer given by other means (an
// operator's, through the admin API) is held to the same rule.
func NeverStored(name string) bool {
	_, ok := neverStoredHeaders[http.CanonicalHeaderKey(name)]
	return ok
}

// NeverStored reports whether the header named name is one that m never
// stores nor replays: NeverStored's, and the configured Config.NeverStore.
func (m *Middleware) NeverStored(name string) bool {
	return NeverStored(name) || slices.Contains(m.cfg.NeverStore, http.CanonicalHeaderKey(name))
}

// storable returns h without the headers m never stores: the header of an
// answer as the ledger receives it, and as a replay writes it. h itself is
// returned when nothing is dropped; otherwise a copy sharing the values.
func (m *Middleware) storable(h map[string][]string) map[string][]string {
	drop := 0
	for k := range h {
		if m.NeverStored(k) {
			drop++
		}
	}
	if drop == 0 {
		return h
	}
	out := make(map[string][]string, len(h)-drop)
	for k, v := range h {
		if !m.NeverStored(k) {
			out[k] = v
		}
	}
	return out
}

// storedHeader returns the end-to-end headers of h: the ones the first
// client gets from a recorded answer. The ledger gets them without the
// private ones (Middleware.storable).
func storedHeader(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	ledger.CopyHeader(out, h)
	for _, c := range h["Connection"] {
		for _, f := range bytes.Split([]byte(c), []byte{','}) {
			if name := string(bytes.TrimSpace(f)); name != "" {
				delete(out, http.CanonicalHeaderKey(name))
			}
		}
	}
	for k, firstClient := range neverStoredHeaders {
		if !firstClient {
			delete(out, k)
		}
	}
	delete(out, HeaderReconciled) // only a lookup's answer carries it (Middleware.Found)
	return out
}

// emptyBody is the body of an attempt whose request has none. It is not nil
// and not http.NoBody, so that the HTTP client below the gateway never
// counts the request as replayable and re-sends it on its own.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
