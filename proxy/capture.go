package proxy

import (
	"bytes"
	"io"
	"net/http"
	"sync"
)

// capture is the ResponseWriter an attempt's handler writes to. It buffers
// the answer up to max bytes; past that it calls overflow once, which
// decides where the rest goes (the client, or nowhere), so that an answer
// is never held whole in memory beyond max.
type capture struct {
	header     http.Header
	status     int
	wrote      bool
	onHeader   func() // called once, at the first final status
	buf        bytes.Buffer
	size       int64
	max        int64
	overflow   func(c *capture) io.Writer
	out        io.Writer // set once overflowed; nil discards
	overflowed bool
}

func newCapture(max int64, onHeader func(), overflow func(*capture) io.Writer) *capture {
	return &capture{header: make(http.Header), max: max, onHeader: onHeader, overflow: overflow}
}

func (c *capture) Header() http.Header { return c.header }

func (c *capture) WriteHeader(code int) {
	if c.wrote || (code >= 100 && code < 200) {
		return // informational answers are not recorded
	}
	c.wrote, c.status = true, code
	c.onHeader()
}

func (c *capture) Write(p []byte) (int, error) {
	if !c.wrote {
		c.WriteHeader(http.StatusOK)
	}
	c.size += int64(len(p))
	if !c.overflowed && int64(c.buf.Len()+len(p)) > c.max {
		c.overflowed = true
		c.out = c.overflow(c)
		if c.out != nil {
			c.out.Write(c.buf.Bytes())
		}
		c.buf = bytes.Buffer{}
	}
	if c.overflowed {
		if c.out != nil {
			c.out.Write(p)
		}
		return len(p), nil
	}
	return c.buf.Write(p)
}

// Flush passes a flush through when the answer goes to the client.
func (c *capture) Flush() {
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

// hopHeaders are not end-to-end: never stored or replayed.
var hopHeaders = []string{
	"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Date",
}

// storedHeader returns the end-to-end headers of h: the ones a replay sends.
func storedHeader(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, v := range h {
		out[k] = append([]string(nil), v...)
	}
	for _, c := range h["Connection"] {
		for _, f := range bytes.Split([]byte(c), []byte{','}) {
			if name := string(bytes.TrimSpace(f)); name != "" {
				delete(out, http.CanonicalHeaderKey(name))
			}
		}
	}
	for _, k := range hopHeaders {
		delete(out, k)
	}
	delete(out, HeaderJobID)
	delete(out, HeaderReplayed)
	return out
}

// emptyBody is the body of an attempt whose request has none. It is not nil
// and not http.NoBody, so that the HTTP client below the gateway never
// counts the request as replayable and re-sends it on its own.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }
