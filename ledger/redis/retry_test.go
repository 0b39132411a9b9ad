package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
)

// replyDropper is a TCP proxy in front of a Redis server. Once armed, it
// forwards the next script call (EVAL or EVALSHA) to the server, so that
// the script runs, then closes the client's connection before the reply
// comes back: the reply is lost, as when a network breaks at the wrong
// moment. It counts the script calls it forwards.
type replyDropper struct {
	ln      net.Listener
	backend string
	armed   atomic.Bool
	scripts atomic.Int64
	wg      sync.WaitGroup
}

func newReplyDropper(t *testing.T, backend string) *replyDropper {
	p := startReplyDropper(t, backend)
	t.Cleanup(p.close)
	return p
}

// startReplyDropper starts a proxy the caller must close, after the
// clients of its connections are closed.
func startReplyDropper(t *testing.T, backend string) *replyDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, backend: backend}
	p.wg.Add(1)
	go p.accept()
	return p
}

// close stops the proxy and waits for its connections to end.
func (p *replyDropper) close() {
	p.ln.Close()
	p.wg.Wait()
}

func (p *replyDropper) addr() string { return p.ln.Addr().String() }

func (p *replyDropper) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serve(c)
		}()
	}
}

func (p *replyDropper) serve(client net.Conn) {
	defer client.Close()
	server, err := net.Dial("tcp", p.backend)
	if err != nil {
		return
	}
	defer server.Close()
	var dropping atomic.Bool
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if err != nil || dropping.Load() {
				// The server closed, or this is the reply to lose: the
				// script has run; hang up on the client without it.
				client.Close()
				return
			}
			if _, err := client.Write(buf[:n]); err != nil {
				server.Close()
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if err != nil {
			return
		}
		chunk := buf[:n]
		// A command fits in one read here: they are small, and go-redis
		// writes each at once and waits for its reply.
		lower := bytes.ToLower(chunk)
		if bytes.Contains(lower, []byte("\r\nevalsha\r\n")) || bytes.Contains(lower, []byte("\r\neval\r\n")) {
			p.scripts.Add(1)
			if p.armed.CompareAndSwap(true, false) {
				dropping.Store(true)
			}
		}
		if _, err := server.Write(chunk); err != nil {
			return
		}
	}
}

// TestClientNeverResends: a script whose reply is lost is not sent again
// by the ledger's client (go-redis re-sends after a read error unless
// MaxRetries is -1): it runs once, and the caller gets the error.
func TestClientNeverResends(t *testing.T) {
	checkNeverResends(t, newMini(t).Addr(), 0, "retry:")
}

// TestCompleteReplyLost: a completion whose reply is lost took the result
// slot all the same; the gateway repeats the call, and the repeat reports
// that the attempt won.
func TestCompleteReplyLost(t *testing.T) {
	checkCompleteReplyLost(t, newMini(t).Addr(), 0, "lost:")
}

// openVia opens a ledger on the Redis server at backend (database db)
// through a proxy that loses replies, and a plain client of the server.
func openVia(t *testing.T, backend string, db int, prefix string) (*Ledger, *replyDropper, *redis.Client) {
	t.Helper()
	p := newReplyDropper(t, backend)
	l, err := Open(context.Background(), fmt.Sprintf("redis://%s/%d", p.addr(), db), Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	direct := redis.NewClient(&redis.Options{Addr: backend, DB: db})
	t.Cleanup(func() { direct.Close() })
	return l, p, direct
}

// checkNeverResends runs a script whose reply the proxy loses, with the
// ledger's client and with a client on go-redis's defaults: the first runs
// it once and reports the error; the second runs it twice (the proxy does
// lose replies, and the defaults would re-send a transition).
func checkNeverResends(t *testing.T, backend string, db int, prefix string) {
	ctx := context.Background()
	l, p, direct := openVia(t, backend, db, prefix)
	incr := redis.NewScript("return redis.call('INCR', KEYS[1])")
	if err := incr.Run(ctx, l.Client(), []string{prefix + "warm-up"}).Err(); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	if err := incr.Run(ctx, l.Client(), []string{prefix + "ledger"}).Err(); err == nil {
		t.Fatal("a lost reply was not reported")
	}
	if n, _ := direct.Get(ctx, prefix+"ledger").Result(); n != "1" {
		t.Errorf("the ledger's client ran the script %s times, want once", n)
	}

	def := redis.NewClient(&redis.Options{Addr: p.addr(), DB: db})
	defer def.Close()
	if err := incr.Run(ctx, def, []string{prefix + "warm-up"}).Err(); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	if err := incr.Run(ctx, def, []string{prefix + "default"}).Err(); err != nil {
		t.Fatalf("a default client did not recover the lost reply by re-sending: %v", err)
	}
	if n, _ := direct.Get(ctx, prefix+"default").Result(); n != "2" {
		t.Errorf("a default client ran the script %s times; the proxy should make it re-send", n)
	}
}

// checkCompleteReplyLost loses the reply of a winning completion, then
// repeats the call: the repeat reports that the attempt won, with the job
// as the first call left it; a repeat after SaveBody reports the saved body.
func checkCompleteReplyLost(t *testing.T, backend string, db int, prefix string) {
	ctx := context.Background()
	l, p, _ := openVia(t, backend, db, prefix)
	r, err := l.Reserve(ctx, params("o", "k"))
	if err != nil {
		t.Fatal(err)
	}
	resp := ledger.Response{Status: 201, Header: map[string][]string{"X": {"y"}}, Body: []byte("paid"), Size: 4, Stored: true}
	before := p.scripts.Load()
	p.armed.Store(true)
	if _, err := l.Complete(ctx, r.Attempt.Ref(), resp); err == nil || errors.Is(err, ledger.ErrNotFound) {
		t.Fatalf("Complete with its reply lost: err = %v, want a transport error", err)
	}
	if n := p.scripts.Load() - before; n != 1 {
		t.Fatalf("the completion was sent %d times, want once", n)
	}
	c, err := l.Complete(ctx, r.Attempt.Ref(), resp)
	if err != nil || !c.Won {
		t.Fatalf("repeated completion: won %v, %v; want won", c.Won, err)
	}
	if c.Job.CompletedBy != r.Attempt.ID || c.Job.Version != r.Job.Version+1 || string(c.Job.Response.Body) != "paid" {
		t.Errorf("repeated completion's job = %+v", c.Job)
	}
	j, err := l.Job(ctx, r.Job.ID)
	if err != nil || j.State != ledger.JobCompleted || j.Version != r.Job.Version+1 || j.Attempts[0].State != ledger.AttemptSucceeded {
		t.Fatalf("job after the repeat = %+v, %v", j, err)
	}
	// A repeat after the body was saved (an answer sent before it ended)
	// reports the saved body, not the one it carries.
	q, err := l.Reserve(ctx, params("o", "stream"))
	if err != nil {
		t.Fatal(err)
	}
	head := ledger.Response{Status: 200, Size: -1}
	if c, err := l.Complete(ctx, q.Attempt.Ref(), head); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	if err := l.SaveBody(ctx, q.Attempt.Ref(), []byte("streamed"), 8, true); err != nil {
		t.Fatal(err)
	}
	if c, err := l.Complete(ctx, q.Attempt.Ref(), head); err != nil || !c.Won || string(c.Job.Response.Body) != "streamed" || !c.Job.Response.Stored {
		t.Fatalf("repeated completion after SaveBody: won %v body %+v, %v", c.Won, c.Job.Response, err)
	}
}
