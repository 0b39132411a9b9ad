//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultProxy forwards TCP to a ledger's server and injects faults in
// between: cut drops every connection and refuses new ones, slow holds each
// chunk of bytes for a while before passing it on (both ways), stall holds
// every byte, dropReply lets one command through and drops its reply;
// restore ends them all.
type faultProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	down    bool
	delay   time.Duration
	stalled chan struct{} // while stalled: closed by restore
	armed   *drop         // the next command carrying its marker fires it
}

// drop is a dropReply: armed until a command toward the server carries its
// marker, then fired once.
type drop struct {
	marker   []byte
	thenDown bool
	once     sync.Once
	done     chan struct{} // closed once the reply was dropped
	command  []byte        // the bytes around the marker, for the log
}

// maxMarker bounds a marker's length: each connection keeps the last
// maxMarker-1 bytes it sent, so that a marker split across reads is found.
const maxMarker = 256

func newFaultProxy(t *testing.T, target string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(func() {
		ln.Close()
		p.restore()
		p.cut()
	})
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(in)
		}
	}()
	return p
}

func (p *faultProxy) serve(in net.Conn) {
	p.mu.Lock()
	down := p.down
	p.mu.Unlock()
	if down {
		in.Close()
		return
	}
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		in.Close()
		return
	}
	p.mu.Lock()
	if p.down {
		p.mu.Unlock()
		in.Close()
		out.Close()
		return
	}
	p.conns[in], p.conns[out] = struct{}{}, struct{}{}
	p.mu.Unlock()
	var fired atomic.Pointer[drop] // the drop of this connection's reply
	go p.pipe(out, in, true, &fired)
	p.pipe(in, out, false, &fired)
}

// pipe copies src to dst, holding each chunk as the current fault says.
// Toward the server (up), a chunk that carries the armed drop's marker is
// passed on and fires it; toward the client, once the connection's drop
// has fired, the reply is discarded and the connection closed, at the
// latest 200 ms after the command went through.
func (p *faultProxy) pipe(dst, src net.Conn, up bool, fired *atomic.Pointer[drop]) {
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	var tail []byte // toward the server: the end of the previous chunk
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			delay, stalled := p.delay, p.stalled
			var d *drop
			if up {
				d = p.take(tail, buf[:n])
			}
			p.mu.Unlock()
			if stalled != nil {
				<-stalled
			}
			time.Sleep(delay)
			if f := fired.Load(); f != nil && !up {
				p.fire(f, dst, src) // the reply, discarded
				return
			}
			if d != nil {
				fired.Store(d) // before the command goes: its reply may come at once
				time.AfterFunc(200*time.Millisecond, func() { p.fire(d, dst, src) })
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
			if up {
				tail = append(tail[:0], buf[max(0, n-maxMarker+1):n]...)
			}
		}
		if err != nil {
			return
		}
	}
}

// take disarms and returns the armed drop when chunk, read after tail on
// its connection, carries the drop's marker. p.mu is held.
func (p *faultProxy) take(tail, chunk []byte) *drop {
	d := p.armed
	if d == nil {
		return nil
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

// fire drops d's reply: the connection between a and b closes, and with
// thenDown every connection, as cut does.
func (p *faultProxy) fire(d *drop, a, b net.Conn) {
	d.once.Do(func() {
		if d.thenDown {
			p.cut() // down first, so that a client that reconnects at once is refused
		}
		a.Close()
		b.Close()
		close(d.done)
	})
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

// cut drops every connection and refuses new ones until restore.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		c.Close()
	}
}

// slow delays every chunk of bytes, both ways, by d.
func (p *faultProxy) slow(d time.Duration) {
	p.mu.Lock()
	p.delay = d
	p.mu.Unlock()
}

// stall holds every byte, both ways, until restore.
func (p *faultProxy) stall() {
	p.mu.Lock()
	if p.stalled == nil {
		p.stalled = make(chan struct{})
	}
	p.mu.Unlock()
}

// dropReply arms the proxy: the next command toward the server (on any
// connection) that carries marker goes through, but its reply is dropped
// and its connection closed, so that the client sees the connection break
// with its command done. With thenDown the proxy then goes down, as with
// cut, until restore. It fires once; wait tells when it has.
func (p *faultProxy) dropReply(marker string, thenDown bool) *drop {
	if marker == "" || len(marker) > maxMarker {
		panic("dropReply: marker of " + strconv.Itoa(len(marker)) + " bytes")
	}
	d := &drop{marker: []byte(marker), thenDown: thenDown, done: make(chan struct{})}
	p.mu.Lock()
	p.armed = d
	p.mu.Unlock()
	return d
}

// wait returns once d has dropped a reply, and fails the test if that does
// not happen within 10 s.
func (d *drop) wait(t *testing.T) {
	t.Helper()
	select {
	case <-d.done:
		t.Logf("dropped the reply to the command %q", d.command)
	case <-time.After(10 * time.Second):
		t.Fatalf("no command carrying %q reached the ledger: no reply was dropped", d.marker)
	}
}

// restore ends every fault.
func (p *faultProxy) restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down, p.delay, p.armed = false, 0, nil
	if p.stalled != nil {
		close(p.stalled)
		p.stalled = nil
	}
}

// viaProxy returns a ledger backend whose server is reached through a
// faultProxy: the connection URL's host is the proxy's.
func viaProxy(t *testing.T, b backend, rawURL string) (backend, *faultProxy) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p := newFaultProxy(t, u.Host)
	proxied := *u
	proxied.Host = p.addr()
	b.line = strings.Replace(b.line, rawURL, proxied.String(), 1)
	return b, p
}

// faultyLedgers are the server ledgers, each behind a faultProxy.
func faultyLedgers(t *testing.T, fn func(t *testing.T, b backend, p *faultProxy)) {
	t.Run("postgres", func(t *testing.T) {
		b, p := viaProxy(t, pgBackend(t), postgresDSN(t))
		fn(t, b, p)
	})
	t.Run("redis", func(t *testing.T) {
		b, p := viaProxy(t, redisBackend(t), redisURL(t))
		fn(t, b, p)
	})
}

// client is an HTTP client that keeps no connection open, so that the
// gateway's goroutine count reflects only work in progress.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Minute}

// send is a POST by owner auth with key through client; a transport error
// (no answer at all) is returned, never fatal, so that concurrent senders
// can report it.
func (g *gateway) send(path, key, body string) (response, error) {
	req, err := http.NewRequest(http.MethodPost, g.url+path, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	req.Header.Set("Authorization", auth)
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

var goroutineTotal = regexp.MustCompile(`^goroutine profile: total (\d+)`)

// goroutines returns the gateway's goroutine count, from the pprof index
// on Caddy's admin endpoint.
func (g *gateway) goroutines(t *testing.T) int {
	t.Helper()
	resp, err := client.Get("http://" + g.admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	m := goroutineTotal.FindStringSubmatch(line)
	if resp.StatusCode != http.StatusOK || m == nil {
		t.Fatalf("goroutine profile: %d %q %v", resp.StatusCode, line, err)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// goroutineMargin is how many goroutines above its baseline a gateway may
// keep after a fault has passed (timers, pool housekeeping); the bursts
// below start several times as many requests, so a leak per request
// shows.
const goroutineMargin = 20

// settles waits until the gateway's goroutine count is back within the
// margin of its baseline.
func (g *gateway) settles(t *testing.T, baseline int) {
	t.Helper()
	http.DefaultClient.CloseIdleConnections()
	var n int
	deadline := time.Now().Add(20 * time.Second)
	for n = g.goroutines(t); n > baseline+goroutineMargin; n = g.goroutines(t) {
		if time.Now().After(deadline) {
			resp, err := client.Get("http://" + g.admin + "/debug/pprof/goroutine?debug=1")
			if err == nil {
				dump, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				t.Logf("goroutines:\n%s", dump)
			}
			t.Fatalf("%d goroutines, baseline %d: more than %d stayed behind", n, baseline, goroutineMargin)
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Logf("goroutines: baseline %d, after %d", baseline, n)
}

// baseline is the gateway's goroutine count once it has served a few
// requests (so that its pools are open).
func (g *gateway) baseline(t *testing.T) int {
	t.Helper()
	for i := range 3 {
		if r, err := g.send("/warm", fmt.Sprintf("warm-%d", i), "{}"); err != nil || r.status != http.StatusOK {
			t.Fatalf("warm-up: %v %v", r, err)
		}
	}
	http.DefaultClient.CloseIdleConnections()
	n := 0
	// The count after the warm-up settles (connections closing).
	eventually(t, "the goroutine count is steady", func() bool {
		a := g.goroutines(t)
		time.Sleep(100 * time.Millisecond)
		n = g.goroutines(t)
		return a == n
	})
	return n
}

// quietUpstream is an upstream that closes every connection after its
// answer, so that the gateway keeps no idle connection (and goroutines) to
// it.
func quietUpstream(t *testing.T, serve func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	up := newUpstream(t, serve)
	up.Config.SetKeepAlivesEnabled(false)
	return up
}

func wantProblemType(t *testing.T, r response, status int, name string) {
	t.Helper()
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(r.body, `"urn:onejob:problem:`+name+`"`) {
		t.Fatalf("want a %d %s problem, got %v", status, name, r)
	}
	var p struct {
		Type, Title string
		Status      int
	}
	if err := json.Unmarshal([]byte(r.body), &p); err != nil || p.Title == "" || p.Status != status {
		t.Fatalf("problem body %q: %+v %v", r.body, p, err)
	}
}

// TestLedgerDownFailsClosedAndRecovers cuts the gateway off from its
// ledger: new keys get 503 ledger-unavailable and reach no provider; once
// the ledger is back, the same process serves them (and replays the keys it
// answered before) without a restart. TestFailClosed covers the cut alone.
func TestLedgerDownFailsClosedAndRecovers(t *testing.T) {
	faultyLedgers(t, func(t *testing.T, b backend, p *faultProxy) {
		up := quietUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s"))
		before, err := g.send("/charges", "down-0", "{}")
		if err != nil || before.status != http.StatusOK {
			t.Fatalf("before the cut: %v %v", before, err)
		}
		pid := g.cmd.Process.Pid

		p.cut()
		for i := 1; i <= 3; i++ {
			key := fmt.Sprintf("down-%d", i)
			r, err := g.send("/charges", key, "{}")
			if err != nil {
				t.Fatalf("%s: %v", key, err)
			}
			wantProblemType(t, r, http.StatusServiceUnavailable, "ledger-unavailable")
			if r.header.Get("Retry-After") == "" {
				t.Errorf("%s: no Retry-After: %v", key, r)
			}
			if c := up.count(key); c != 0 {
				t.Fatalf("%s reached the provider %d times while the ledger was down", key, c)
			}
		}
		// A retry of an answered key cannot be told from a new one
		// without the ledger: it is refused or replayed, never re-run.
		if r, err := g.send("/charges", "down-0", "{}"); err != nil ||
			(r.status != http.StatusServiceUnavailable && r.body != before.body) {
			t.Errorf("retry of an answered key while the ledger is down: %v %v", r, err)
		}

		p.restore()
		var r response
		eventually(t, "the gateway serves again once its ledger is back", func() bool {
			r, err = g.send("/charges", "down-1", "{}")
			return err == nil && r.status == http.StatusOK
		})
		if r.body != `{"key":"down-1","n":1}` || r.header.Get("Idempotent-Replayed") != "" {
			t.Errorf("first answer after the ledger came back: %v", r)
		}
		if again, err := g.send("/charges", "down-0", "{}"); err != nil || again.body != before.body ||
			again.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("replay after the ledger came back: %v %v", again, err)
		}
		for _, key := range []string{"down-0", "down-1", "down-2", "down-3"} {
			want := map[string]int{"down-0": 1, "down-1": 1}[key]
			if c := up.count(key); c != want {
				t.Errorf("%s reached the provider %d times, want %d", key, c, want)
			}
		}
		if g.cmd.Process.Pid != pid {
			t.Error("the gateway was restarted")
		}
	})
}

// TestCacheDownAnswersFromPostgres cuts the Redis replay cache off from a
// PostgreSQL ledger: fresh keys, replays and waiting duplicates are all
// still answered, from PostgreSQL; and the cache is used again once back.
func TestCacheDownAnswersFromPostgres(t *testing.T) {
	b := pgBackend(t)
	rawCache := redisURL(t)
	cacheLine := "cache redis " + rawCache + " " + b.schema + ":cache:"
	b.line += "\n\t\t" + cacheLine
	b, p := viaProxy(t, b, rawCache)
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.Header.Get("Idempotency-Key") == "cd-slow" {
			<-release
		}
		fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
	})
	g := startGatewayWith(t, b, "\tmetrics\n", site(up.addr(), "attempt_timeout 10s"))
	first := g.post(t, "/charges", "cd-1", auth, "{}")
	if first.status != http.StatusOK {
		t.Fatalf("before the cut: %v", first)
	}
	if r := g.post(t, "/charges", "cd-1", auth, "{}"); r.body != first.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay before the cut: %v", r)
	}
	cached := 0
	scanRedis(t, b.schema+":cache:", func(string, []byte) { cached++ })
	if cached == 0 {
		t.Fatal("the cache holds nothing before the cut: it is not in use")
	}

	p.cut()
	if r := g.post(t, "/charges", "cd-1", auth, "{}"); r.status != http.StatusOK || r.body != first.body ||
		r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay with the cache down: %v", r)
	}
	fresh := g.post(t, "/charges", "cd-2", auth, "{}")
	if fresh.status != http.StatusOK || fresh.body != `{"key":"cd-2","n":1}` {
		t.Errorf("fresh key with the cache down: %v", fresh)
	}
	if r := g.post(t, "/charges", "cd-2", auth, "{}"); r.body != fresh.body || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("replay of the fresh key with the cache down: %v", r)
	}
	// A duplicate waits for a job that completes while the cache is down:
	// it is woken through PostgreSQL.
	firstSlow := make(chan response, 1)
	go func() { firstSlow <- g.post(t, "/charges", "cd-slow", auth, "{}") }()
	eventually(t, "the slow attempt reaches the provider", func() bool { return up.count("cd-slow") == 1 })
	reserves := g.metricValue(t, `caddy_idempotency_ledger_seconds_count{operation="reserve"}`)
	waited := g.metricValue(t, `caddy_idempotency_requests_total{outcome="waited"}`)
	dup := make(chan response, 1)
	go func() { dup <- g.post(t, "/charges", "cd-slow", auth, "{}") }()
	eventually(t, "the duplicate finds the job in flight", func() bool {
		return g.metricValue(t, `caddy_idempotency_ledger_seconds_count{operation="reserve"}`) > reserves
	})
	close(release)
	s, d := <-firstSlow, <-dup
	if s.status != http.StatusOK || d.body != s.body || d.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("duplicate with the cache down: first %v, duplicate %v", s, d)
	}
	if w := g.metricValue(t, `caddy_idempotency_requests_total{outcome="waited"}`); w != waited+1 {
		t.Errorf("requests waited: %v, want %v", w, waited+1)
	}

	p.restore()
	eventually(t, "replays work with the cache back", func() bool {
		r := g.post(t, "/charges", "cd-2", auth, "{}")
		return r.body == fresh.body && r.header.Get("Idempotent-Replayed") == "true"
	})
	if r := g.post(t, "/charges", "cd-3", auth, "{}"); r.status != http.StatusOK || r.body != `{"key":"cd-3","n":1}` {
		t.Errorf("fresh key with the cache back: %v", r)
	}
	for key, want := range map[string]int{"cd-1": 1, "cd-2": 1, "cd-slow": 1, "cd-3": 1} {
		if c := up.count(key); c != want {
			t.Errorf("%s reached the provider %d times, want %d", key, c, want)
		}
	}
}

// metricValue returns the value of one series (name and labels as
// exposed) from Caddy's metrics endpoint; 0 when it is not there yet.
func (g *gateway) metricValue(t *testing.T, series string) float64 {
	t.Helper()
	resp, err := client.Get("http://" + g.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %q", series, l)
			}
			return f
		}
	}
	return 0
}

// slowBurst sends n requests at once: fresh keys, and duplicates of a few
// of them. It returns each request's key and answer, and the transport
// errors.
func slowBurst(g *gateway, prefix string, n int) (keys []string, resps []response, errs []error) {
	keys, resps, errs = make([]string, n), make([]response, n), make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		keys[i] = fmt.Sprintf("%s-%d", prefix, i%(n*3/4))
		wg.Add(1)
		go func() {
			defer wg.Done()
			resps[i], errs[i] = g.send("/charges", keys[i], "{}")
		}()
	}
	wg.Wait()
	return keys, resps, errs
}

// TestSlowLedgerBoundedWaits puts latency, then a stall, between the
// gateway and its ledger. Under latency every request is still answered
// (its own answer, a replay, or a 409 or 503 problem) and no key runs
// twice; under a stall, every request is answered 503 (the ledger calls are
// bounded) rather than held, and nothing is forwarded. Once the ledger is
// well again the gateway serves, and its goroutine count returns near its
// baseline: no goroutine stays behind per request.
func TestSlowLedgerBoundedWaits(t *testing.T) {
	faultyLedgers(t, func(t *testing.T, b backend, p *faultProxy) {
		up := quietUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 2s", "in_flight wait 1s"))
		base := g.baseline(t)

		p.slow(50 * time.Millisecond)
		keys, resps, errs := slowBurst(g, "slow", 60)
		for i, r := range resps {
			if errs[i] != nil {
				t.Errorf("%s: no answer: %v", keys[i], errs[i])
				continue
			}
			switch r.status {
			case http.StatusOK:
				if r.body != fmt.Sprintf(`{"key":%q,"n":1}`, keys[i]) {
					t.Errorf("%s: %v", keys[i], r)
				}
			case http.StatusConflict:
				if !strings.Contains(r.body, "in-flight") && !strings.Contains(r.body, "outcome-unknown") {
					t.Errorf("%s: %v", keys[i], r)
				}
			case http.StatusServiceUnavailable, http.StatusGatewayTimeout:
				if r.header.Get("Content-Type") != "application/problem+json" {
					t.Errorf("%s: %v", keys[i], r)
				}
			default:
				t.Errorf("%s: %v", keys[i], r)
			}
		}
		for _, k := range keys {
			if c := up.count(k); c > 1 {
				t.Errorf("%s ran %d times", k, c)
			}
		}

		p.restore()
		p.stall()
		_, resps, errs = slowBurst(g, "stalled", 40)
		for i, r := range resps {
			if errs[i] != nil {
				t.Errorf("request %d under a stalled ledger: no answer: %v", i, errs[i])
				continue
			}
			if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "ledger-unavailable") {
				t.Errorf("request %d under a stalled ledger: %v", i, r)
			}
		}
		for i := range 30 {
			if c := up.count(fmt.Sprintf("stalled-%d", i)); c != 0 {
				t.Errorf("stalled-%d was forwarded %d times though the ledger could not record it", i, c)
			}
		}

		p.restore()
		eventually(t, "the gateway serves once its ledger is well", func() bool {
			r, err := g.send("/charges", "after-stall", "{}")
			return err == nil && r.status == http.StatusOK
		})
		g.settles(t, base)
	})
}

// TestReloadUnderLoad reloads the config (POST /load on the admin
// endpoint) again and again while clients send requests. Caddy hands its
// listener over at each load (a new SO_REUSEPORT socket), and a connection
// caught in the handover can be dropped before its request is read; the
// clients then do what the key is for, and retry with it. Every request
// ends with its own answer or a replay of it, and no key runs twice: a
// request the gateway took is never lost. The config has providers and
// probes, so each load starts probe loops and holds the ledger; after the
// reloads the goroutine count returns near its baseline: the old configs'
// loops and pools are gone. (A probe cancelled by its config's unload can
// leave the connection it was dialing idle in the old transport; the
// providers' short keepalive closes those, so that they do not pass for a
// leak.)
func TestReloadUnderLoad(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		answer := func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
		}
		primary, fallback := quietUpstream(t, answer), quietUpstream(t, answer)
		g := startGateway(t, b, fmt.Sprintf(`	idempotency {
		{ledger}
		attempt_timeout 5s
		attempt_deadline 20s
		probe POST /probe {
			every 50ms
		}
		provider primary {
			reverse_proxy %s {
				transport http {
					keepalive 1s
				}
			}
		}
		provider fallback {
			reverse_proxy %s {
				transport http {
					keepalive 1s
				}
			}
		}
	}
`, primary.addr(), fallback.addr()))
		base := g.baseline(t)
		cfg, err := readConfig(g)
		if err != nil {
			t.Fatal(err)
		}

		const clients, perClient, tries = 8, 25, 10
		type result struct {
			key     string
			r       response
			err     error
			dropped int // transport errors before the answer
		}
		// sendKey sends a request with key until it gets an answer.
		sendKey := func(key string) result {
			res := result{key: key}
			for range tries {
				if res.r, res.err = g.send("/charges", key, "{}"); res.err == nil {
					break
				}
				res.dropped++
			}
			return res
		}
		var wg sync.WaitGroup
		results := make(chan result, clients*perClient*2)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perClient {
					key := fmt.Sprintf("rl-%d-%d", c, i)
					results <- sendKey(key)
					if i%2 == 0 { // every other key is retried at once: a replay
						results <- sendKey(key)
					}
				}
			}()
		}
		stop := make(chan struct{})
		go func() {
			wg.Wait()
			close(stop)
		}()
		reloads, lostLoads := 0, 0
	loading:
		for {
			select {
			case <-stop:
				break loading
			default:
			}
			timeout := []string{"5s", "6s"}[reloads%2]
			next := strings.Replace(cfg, "attempt_timeout 5s", "attempt_timeout "+timeout, 1)
			req, _ := http.NewRequest(http.MethodPost, "http://"+g.admin+"/load", strings.NewReader(next))
			req.Header.Set("Content-Type", "text/caddyfile")
			resp, err := client.Do(req)
			if err != nil {
				// The admin endpoint is handed over at each load too; a
				// load whose answer was lost is simply sent again.
				lostLoads++
				continue
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("reload: %d %s", resp.StatusCode, body)
			}
			reloads++
		}
		close(results)
		if reloads < 3 {
			t.Errorf("only %d reloads happened during the load", reloads)
		}
		n, dropped := 0, 0
		for res := range results {
			n++
			dropped += res.dropped
			want := fmt.Sprintf(`{"key":%q,"n":1}`, res.key)
			if res.err != nil || res.r.status != http.StatusOK || res.r.body != want {
				t.Errorf("%s: %v %v (after %d dropped connections)", res.key, res.r, res.err, res.dropped)
			}
		}
		if n != clients*(perClient+(perClient+1)/2) {
			t.Errorf("%d answers", n)
		}
		for c := range clients {
			for i := range perClient {
				key := fmt.Sprintf("rl-%d-%d", c, i)
				if runs := primary.count(key) + fallback.count(key); runs != 1 {
					t.Errorf("%s ran %d times", key, runs)
				}
			}
		}
		t.Logf("%d requests across %d reloads (%d more loads lost their answer); %d connections dropped in listener handovers and retried",
			n, reloads, lostLoads, dropped)
		g.settles(t, base)
	})
}

// TestUpstreamDiesMidAnswer: an upstream that sends the headers and part
// of a body, then drops the connection. An answer that had not won yet
// (buffered: it has a Content-Length) is a 502 and leaves the job unknown,
// its partial body never stored or replayed. A stream, which won its slot
// at its headers and went out as it came, is cut short for its client, and
// the job is completed with the answer not stored: retries get 409
// response-not-stored, never a re-run. Both are checked in the ledger
// through the admin API.
func TestUpstreamDiesMidAnswer(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				return
			}
			defer conn.Close()
			if r.Header.Get("Idempotency-Key") == "die-stream" {
				buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
				buf.WriteString("b\r\ndata: one\n\n\r\n")
			} else {
				buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
				buf.WriteString(`{"partial":`)
			}
			buf.Flush()
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s"))

		r := g.post(t, "/charges", "die-buffered", auth, "{}")
		wantProblemType(t, r, http.StatusBadGateway, "outcome-unknown")
		id := r.header.Get("Idempotency-Job-Id")
		if id == "" || !strings.Contains(r.body, id) || strings.Contains(r.body, "partial") {
			t.Errorf("cut answer: %v", r)
		}
		if j := g.job(t, id); j.State != "unknown" || len(j.Attempts) != 1 || j.Attempts[0].State != "unknown" ||
			(j.Response != nil && j.Response.Stored) {
			t.Errorf("job after a cut answer: %+v", j)
		}
		retry := g.post(t, "/charges", "die-buffered", auth, "{}")
		wantProblemType(t, retry, http.StatusConflict, "outcome-unknown")
		if strings.Contains(retry.body, "partial") || up.count("die-buffered") != 1 {
			t.Errorf("retry: %v, upstream calls %d", retry, up.count("die-buffered"))
		}

		req, _ := http.NewRequest(http.MethodPost, g.url+"/events", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "die-stream")
		req.Header.Set("Authorization", auth)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		id = resp.Header.Get("Idempotency-Job-Id")
		if resp.StatusCode != http.StatusOK || string(got) != "data: one\n\n" || err == nil {
			t.Errorf("cut stream: %d %q, read error %v (want the first event, then an error)", resp.StatusCode, got, err)
		}
		var j adminJob
		eventually(t, "the cut stream is recorded", func() bool {
			j = g.job(t, id)
			return j.Response != nil && j.Response.Size >= 0
		})
		if j.State != "completed" || j.Response.Stored || j.Attempts[0].State != "succeeded" {
			t.Errorf("job after a cut stream: %+v, response %+v", j, j.Response)
		}
		retry = g.post(t, "/events", "die-stream", auth, "{}")
		wantProblemType(t, retry, http.StatusConflict, "response-not-stored")
		if up.count("die-stream") != 1 {
			t.Errorf("the cut stream ran %d times", up.count("die-stream"))
		}
	})
}
