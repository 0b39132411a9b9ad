//go:build integration

package integration

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// upstream is a provider on loopback that records every request it gets.
type upstream struct {
	*httptest.Server
	mu    sync.Mutex
	calls []call
	serve func(w http.ResponseWriter, r *http.Request, n int) // n: calls so far with this key
}

type call struct {
	key, jobID, attempt, body string
	traceparent               string // the W3C trace context it carried
}

func newUpstream(t testing.TB, serve func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	u := &upstream{serve: serve}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		c := call{key: r.Header.Get("Idempotency-Key"), jobID: r.Header.Get("Idempotency-Job-Id"),
			attempt: r.Header.Get("Idempotency-Attempt"), body: string(body), traceparent: r.Header.Get("Traceparent")}
		u.calls = append(u.calls, c)
		n := 0
		for _, x := range u.calls {
			if x.key == c.key {
				n++
			}
		}
		u.mu.Unlock()
		u.serve(w, r, n)
	}))
	t.Cleanup(u.Close)
	return u
}

// count returns how many requests carried key.
func (u *upstream) count(key string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, c := range u.calls {
		if c.key == key {
			n++
		}
	}
	return n
}

func (u *upstream) callsFor(key string) []call {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []call
	for _, c := range u.calls {
		if c.key == key {
			out = append(out, c)
		}
	}
	return out
}

// addr is the upstream's host:port for reverse_proxy.
func (u *upstream) addr() string { return strings.TrimPrefix(u.URL, "http://") }

// dropper is a raw HTTP/1.1 provider that answers a keep-alive connection's
// first request, then reads the second request on that same connection and
// closes it without answering. It counts the requests it read, by key.
type dropper struct {
	ln    net.Listener
	mu    sync.Mutex
	reads map[string]int
}

func newDropper(t *testing.T) *dropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dropper{ln: ln, reads: map[string]int{}}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go d.serve(conn)
		}
	}()
	return d
}

func (d *dropper) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for n := 0; ; n++ {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		d.mu.Lock()
		d.reads[req.Header.Get("Idempotency-Key")]++
		d.mu.Unlock()
		if n > 0 {
			return // read it, then drop the connection unanswered
		}
		io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
	}
}

func (d *dropper) count(key string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reads[key]
}
