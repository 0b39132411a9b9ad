package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// lineServer answers each line it reads with "ok <line>", and counts the
// lines: a command that reached the server.
type lineServer struct {
	ln    net.Listener
	lines atomic.Int64
}

func newLineServer(t *testing.T) *lineServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &lineServer{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					l, err := r.ReadString('\n')
					if err != nil {
						return
					}
					s.lines.Add(1)
					io.WriteString(c, "ok "+l)
				}
			}()
		}
	}()
	return s
}

func newProxy(t *testing.T, s *lineServer) *Proxy {
	t.Helper()
	p, err := New(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// call sends line on c and reads the reply, within timeout.
func call(c net.Conn, line string, timeout time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return "", err
	}
	r, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSuffix(r, "\n"), err
}

func dial(t *testing.T, p *Proxy) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestNotLoopback(t *testing.T) {
	if _, err := New("192.0.2.1:5432"); err == nil {
		t.Fatal("a proxy toward a non-loopback address was started")
	}
}

func TestDropReply(t *testing.T) {
	for _, marker := range []string{"two", ""} {
		t.Run("marker="+marker, func(t *testing.T) {
			s := newLineServer(t)
			p := newProxy(t, s)
			c := dial(t, p)
			if r, err := call(c, "one", time.Second); err != nil || r != "ok one" {
				t.Fatalf("before the drop: %q %v", r, err)
			}
			d := p.DropReply(marker, false)
			if _, err := call(c, "two", 2*time.Second); err == nil {
				t.Fatal("the reply came through")
			}
			select {
			case <-d.Done():
			case <-time.After(2 * time.Second):
				t.Fatal("the drop did not fire")
			}
			if s.lines.Load() != 2 {
				t.Errorf("the server got %d commands, want 2: the dropped one ran", s.lines.Load())
			}
			if !strings.Contains(string(d.Command()), "two") {
				t.Errorf("command %q", d.Command())
			}
			// Fired once: a new connection works.
			if r, err := call(dial(t, p), "three", time.Second); err != nil || r != "ok three" {
				t.Fatalf("after the drop: %q %v", r, err)
			}
			if n := p.Counts()[KindDrop]; n != 1 {
				t.Errorf("drops counted: %d", n)
			}
		})
	}
}

func TestDropCancel(t *testing.T) {
	p := newProxy(t, newLineServer(t))
	d := p.DropReply("never", false)
	if d.Cancel() {
		t.Fatal("a drop that never fired reports it fired")
	}
	if r, err := call(dial(t, p), "never", time.Second); err != nil || r != "ok never" {
		t.Fatalf("a cancelled drop fired: %q %v", r, err)
	}
	if n := p.Counts()[KindDrop]; n != 0 {
		t.Errorf("drops counted: %d", n)
	}
}

func TestCutRestore(t *testing.T) {
	p := newProxy(t, newLineServer(t))
	c := dial(t, p)
	p.Cut()
	if _, err := call(c, "x", time.Second); err == nil {
		t.Fatal("an open connection survived the cut")
	}
	if _, err := call(dial(t, p), "y", time.Second); err == nil {
		t.Fatal("a new connection was served while cut")
	}
	p.Restore()
	if r, err := call(dial(t, p), "z", time.Second); err != nil || r != "ok z" {
		t.Fatalf("after restore: %q %v", r, err)
	}
	l := p.Log()
	if len(l) != 1 || l[0].Kind != KindCut || l[0].End.IsZero() {
		t.Errorf("log: %+v", l)
	}
}

func TestDelayReplies(t *testing.T) {
	s := newLineServer(t)
	p := newProxy(t, s)
	c := dial(t, p)
	p.DelayReplies(300*time.Millisecond, 200*time.Millisecond)
	if _, err := call(c, "late", 100*time.Millisecond); err == nil {
		t.Fatal("a delayed reply came before the client's timeout")
	}
	if s.lines.Load() != 1 {
		t.Error("the command toward the server was held")
	}
	time.Sleep(400 * time.Millisecond)
	if r, err := call(dial(t, p), "fine", 100*time.Millisecond); err != nil || r != "ok fine" {
		t.Fatalf("after the window: %q %v", r, err)
	}
}

func TestReset(t *testing.T) {
	p := newProxy(t, newLineServer(t))
	c := dial(t, p)
	if _, err := call(c, "a", time.Second); err != nil {
		t.Fatal(err)
	}
	if n := p.Reset(); n != 1 {
		t.Errorf("reset %d connections, want 1", n)
	}
	_, err := call(c, "b", time.Second)
	if err == nil {
		t.Fatal("the connection survived the reset")
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EPIPE) {
		t.Logf("error after the reset: %v", err)
	}
	if r, err := call(dial(t, p), "c", time.Second); err != nil || r != "ok c" {
		t.Fatalf("a new connection after the reset: %q %v", r, err)
	}
}

// TestCloseEndsHolds: Close returns while a stall and a delay hold bytes.
func TestCloseEndsHolds(t *testing.T) {
	s := newLineServer(t)
	p, err := New(s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c1, c2 := dial(t, p), dial(t, p)
	p.DelayReplies(MaxDelay, MaxDelay)
	go call(c1, "held", 10*time.Second)
	time.Sleep(50 * time.Millisecond)
	p.Stall()
	go call(c2, "stalled", 10*time.Second)
	time.Sleep(50 * time.Millisecond)
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Second):
		t.Fatal("Close waited for held bytes")
	}
}
