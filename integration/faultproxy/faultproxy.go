// Package faultproxy is a TCP proxy on loopback that sits between a client
// and a server (a gateway and its PostgreSQL or Redis) and injects faults
// in between, on demand. The integration tests and the chaos soak share it.
//
// Faults:
//   - Cut drops every connection and refuses new ones until Restore.
//   - Slow holds each chunk of bytes for a while, both ways.
//   - Stall holds every byte, both ways, until Restore.
//   - DropReply lets one command through to the server and drops its reply.
//   - DelayReplies holds the server's bytes (only those) for a while: past
//     the client's timeout, a reply comes too late.
//   - Reset closes every open connection with a TCP RST, once.
//
// Restore ends the faults that last (cut, slow, stall, an armed drop, a
// delay). Every wait is bounded: by the delay asked for, by Restore, or by
// Close. Log tells what the proxy did, for a report.
package faultproxy

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// MaxMarker bounds a DropReply marker's length: each connection keeps the
// last MaxMarker-1 bytes it sent, so that a marker split across reads is
// found.
const MaxMarker = 256

// MaxDelay bounds Slow and DelayReplies.
const MaxDelay = time.Minute

// dialTimeout bounds the dial to the server.
const dialTimeout = 5 * time.Second

// Event kinds, as Event.Kind and Counts name them.
const (
	KindCut   = "cut"
	KindSlow  = "slow"
	KindStall = "stall"
	KindDrop  = "drop"  // a reply dropped (counted when it fired)
	KindDelay = "delay" // a window of delayed replies
	KindReset = "reset"
)

// Event is one fault the proxy injected.
type Event struct {
	Kind string
	At   time.Time // when it began; for a drop, when its command went through
	// End is when a lasting fault ended (Restore, or a delay's window
	// plus its delay: the last moment a delayed reply may come); zero
	// while it lasts, and for a drop or a reset.
	End time.Time
	// Conns is how many connections a reset closed (each proxied
	// connection counts once, both its ends).
	Conns int
	// Delay is a slow's or a delay's hold per chunk.
	Delay time.Duration
	// Command is a drop's command: the bytes around its marker (or the
	// start of the chunk, for a drop without marker).
	Command []byte
}

// String is the event as a line of the fault log: its time, its kind and
// what it did.
func (e Event) String() string {
	s := e.At.Format("15:04:05.000") + " " + e.Kind
	switch e.Kind {
	case KindCut, KindStall:
		if !e.End.IsZero() {
			s += " for " + e.End.Sub(e.At).Round(time.Millisecond).String()
		}
	case KindSlow:
		s += " by " + e.Delay.String()
	case KindDelay:
		s += fmt.Sprintf(" replies by %s until %s", e.Delay, e.End.Add(-e.Delay).Format("15:04:05.000"))
	case KindReset:
		s += fmt.Sprintf(" of %d connections", e.Conns)
	case KindDrop:
		s += fmt.Sprintf(" of the reply to %q", e.Command)
	}
	return s
}

// Proxy forwards TCP connections to one server.
type Proxy struct {
	ln     net.Listener
	target string
	closed chan struct{}
	once   sync.Once
	wg     sync.WaitGroup

	mu         sync.Mutex
	conns      map[*link]struct{}
	down       bool
	delay      time.Duration // Slow: every chunk, both ways
	stalled    chan struct{} // while stalled: closed by Restore
	armed      *Drop         // the next command carrying its marker fires it
	replyDelay time.Duration // DelayReplies: server chunks read before replyUntil
	replyUntil time.Time
	log        []Event
	open       map[string]int // index in log of the lasting fault of a kind
}

// link is one proxied connection: the client's end and the server's.
type link struct {
	in, out net.Conn
	fired   atomic.Pointer[Drop] // the drop of this connection's reply
}

// close closes both ends; with rst, as a TCP reset.
func (l *link) close(rst bool) {
	for _, c := range []net.Conn{l.in, l.out} {
		if tc, ok := c.(*net.TCPConn); ok && rst {
			tc.SetLinger(0)
		}
		c.Close()
	}
}

// Drop is a DropReply: armed until a command toward the server carries its
// marker, then fired once.
type Drop struct {
	p        *Proxy
	marker   []byte // empty: any command
	thenDown bool
	once     sync.Once
	done     chan struct{} // closed once the reply was dropped
	command  []byte
}

// Done is closed once the drop has dropped a reply.
func (d *Drop) Done() <-chan struct{} { return d.done }

// Command returns the bytes around the marker of the command whose reply
// was dropped (set once Done is closed).
func (d *Drop) Command() []byte {
	select {
	case <-d.done:
		return d.command
	default:
		return nil
	}
}

// Marker returns the marker the drop waits for.
func (d *Drop) Marker() string { return string(d.marker) }

// Cancel disarms the drop if it has not fired yet; it reports whether it
// had fired.
func (d *Drop) Cancel() bool {
	d.p.mu.Lock()
	if d.p.armed == d {
		d.p.armed = nil
	}
	d.p.mu.Unlock()
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// New starts a proxy on a free loopback port toward target (host:port),
// which must be a loopback address.
func New(target string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	for _, ip := range ips {
		if !ip.IsLoopback() {
			return nil, fmt.Errorf("faultproxy: %s is not a loopback address", target)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, closed: make(chan struct{}),
		conns: map[*link]struct{}{}, open: map[string]int{}}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				if errors.Is(err, net.ErrClosed) {
					return
				}
				continue
			}
			p.wg.Add(1)
			go func() {
				defer p.wg.Done()
				p.serve(in)
			}()
		}
	}()
	return p, nil
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Close stops the proxy: no new connection, every fault ended, every
// connection closed. It returns once every goroutine of the proxy ended.
func (p *Proxy) Close() {
	p.once.Do(func() {
		close(p.closed)
		p.ln.Close()
		p.Restore()
		p.mu.Lock()
		p.down = true
		for l := range p.conns {
			l.close(false)
		}
		p.mu.Unlock()
	})
	p.wg.Wait()
}

func (p *Proxy) serve(in net.Conn) {
	p.mu.Lock()
	down := p.down
	p.mu.Unlock()
	if down {
		in.Close()
		return
	}
	out, err := net.DialTimeout("tcp", p.target, dialTimeout)
	if err != nil {
		in.Close()
		return
	}
	l := &link{in: in, out: out}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		l.close(false)
		return
	}
	p.conns[l] = struct{}{}
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.pipe(l, true)
	}()
	p.pipe(l, false)
}

// hold waits d, or until the proxy closes.
func (p *Proxy) hold(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.closed:
	}
}

// pipe copies one direction of l: toward the server (up) or back, holding
// each chunk as the current faults say. Toward the server, a chunk that
// carries the armed drop's marker is passed on and fires it; toward the
// client, once the connection's drop has fired, the reply is discarded and
// the connection closed, at the latest 200 ms after the command went
// through.
func (p *Proxy) pipe(l *link, up bool) {
	src, dst := l.out, l.in
	if up {
		src, dst = l.in, l.out
	}
	defer func() {
		l.close(false)
		p.mu.Lock()
		delete(p.conns, l)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	var tail []byte // toward the server: the end of the previous chunk
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, stalled := p.delay, p.stalled
			var d *Drop
			if up {
				d = p.take(tail, buf[:n])
			} else if time.Now().Before(p.replyUntil) {
				delay += p.replyDelay
			}
			p.mu.Unlock()
			if stalled != nil {
				select {
				case <-stalled:
				case <-p.closed:
				}
			}
			p.hold(delay)
			if f := l.fired.Load(); f != nil && !up {
				p.fire(f, l) // the reply, discarded
				return
			}
			if d != nil {
				l.fired.Store(d) // before the command goes: its reply may come at once
				time.AfterFunc(200*time.Millisecond, func() { p.fire(d, l) })
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
			if up {
				tail = append(tail[:0], buf[max(0, n-MaxMarker+1):n]...)
			}
		}
		if err != nil {
			return
		}
	}
}

// take disarms and returns the armed drop when chunk, read after tail on
// its connection, carries the drop's marker (any chunk, for a drop without
// one). p.mu is held.
func (p *Proxy) take(tail, chunk []byte) *Drop {
	d := p.armed
	if d == nil {
		return nil
	}
	if len(d.marker) == 0 {
		p.armed = nil
		d.command = slices.Clone(chunk[:min(len(chunk), 96)])
		return d
	}
	// Only the last len(marker)-1 bytes of tail: a match ends in chunk.
	seen := append(slices.Clip(tail[len(tail)-min(len(tail), len(d.marker)-1):]), chunk...)
	i := bytes.Index(seen, d.marker)
	if i < 0 {
		return nil
	}
	p.armed = nil
	d.command = slices.Clone(seen[max(0, i-64):min(len(seen), i+len(d.marker)+32)])
	return d
}

// fire drops d's reply: l closes, and with thenDown every connection, as
// Cut does.
func (p *Proxy) fire(d *Drop, l *link) {
	d.once.Do(func() {
		if d.thenDown {
			p.Cut() // down first, so that a client that reconnects at once is refused
		}
		l.close(false)
		p.mu.Lock()
		p.log = append(p.log, Event{Kind: KindDrop, At: time.Now(), Command: d.command})
		p.mu.Unlock()
		close(d.done)
	})
}

// begin logs a lasting fault of kind, unless one is on already. p.mu is
// held.
func (p *Proxy) begin(kind string, delay time.Duration) {
	if _, on := p.open[kind]; on {
		return
	}
	p.open[kind] = len(p.log)
	p.log = append(p.log, Event{Kind: kind, At: time.Now(), Delay: delay})
}

// Cut drops every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for l := range p.conns {
		l.close(false)
	}
	p.begin(KindCut, 0)
}

// Slow delays every chunk of bytes, both ways, by d (at most MaxDelay),
// until Restore.
func (p *Proxy) Slow(d time.Duration) {
	d = min(d, MaxDelay)
	p.mu.Lock()
	p.delay = d
	p.begin(KindSlow, d)
	p.mu.Unlock()
}

// Stall holds every byte, both ways, until Restore.
func (p *Proxy) Stall() {
	p.mu.Lock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
	p.begin(KindStall, 0)
	p.mu.Unlock()
}

// DropReply arms the proxy: the next command toward the server (on any
// connection) that carries marker goes through, but its reply is dropped
// and its connection closed, so that the client sees the connection break
// with its command done. An empty marker matches the next chunk of bytes
// toward the server, whatever it holds. With thenDown the proxy then goes
// down, as with Cut, until Restore. It fires once; Done tells when it has.
// A drop armed earlier and not fired yet is replaced.
func (p *Proxy) DropReply(marker string, thenDown bool) *Drop {
	if len(marker) > MaxMarker {
		panic("faultproxy: DropReply marker of " + strconv.Itoa(len(marker)) + " bytes")
	}
	d := &Drop{p: p, marker: []byte(marker), thenDown: thenDown, done: make(chan struct{})}
	p.mu.Lock()
	p.armed = d
	p.mu.Unlock()
	return d
}

// DelayReplies holds every chunk of bytes the server sends, read within
// the next window, by d (at most MaxDelay) before passing it on: a client
// whose timeout is shorter than d gets its reply too late. Bytes toward the
// server pass at once. Restore ends the window.
func (p *Proxy) DelayReplies(d, window time.Duration) {
	d = min(d, MaxDelay)
	window = min(window, MaxDelay)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	p.replyDelay, p.replyUntil = d, now.Add(window)
	p.log = append(p.log, Event{Kind: KindDelay, At: now, End: now.Add(window + d), Delay: d})
}

// Reset closes every open connection with a TCP RST (SO_LINGER 0), both
// its ends, once; it returns how many connections it closed. New
// connections are served as usual.
func (p *Proxy) Reset() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.conns {
		l.close(true)
		delete(p.conns, l)
		n++
	}
	p.log = append(p.log, Event{Kind: KindReset, At: time.Now(), Conns: n})
	return n
}

// Restore ends every fault that lasts: a cut, a slow, a stall, an armed
// drop and a window of delayed replies (a reply already held is still held
// for its delay).
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.delay, p.armed = false, 0, nil
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
	now := time.Now()
	if now.Before(p.replyUntil) {
		p.replyUntil = now
	}
	for kind, i := range p.open {
		p.log[i].End = now
		delete(p.open, kind)
	}
}

// Log returns what the proxy did so far, in order.
func (p *Proxy) Log() []Event {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// Counts returns how many faults of each kind the proxy injected (fired
// drops only).
func (p *Proxy) Counts() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := map[string]int{}
	for _, e := range p.log {
		c[e.Kind]++
	}
	return c
}
