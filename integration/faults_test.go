//go:build integration

package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/integration/faultproxy"
)

// waitDrop returns once d has dropped a reply, and fails the test if that
// does not happen within 10 s.
func waitDrop(t *testing.T, d *faultproxy.Drop) {
	t.Helper()
	select {
	case <-d.Done():
		t.Logf("dropped the reply to the command %q", d.Command())
	case <-time.After(10 * time.Second):
		t.Fatalf("no command carrying %q reached the ledger: no reply was dropped", d.Marker())
	}
}

// viaProxy returns a ledger backend whose server is reached through a
// fault proxy (integration/faultproxy): the connection URL's host is the
// proxy's.
func viaProxy(t *testing.T, b backend, rawURL string) (backend, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	proxied := *u
	proxied.Host = p.Addr()
	b.line = strings.Replace(b.line, rawURL, proxied.String(), 1)
	return b, p
}

// faultyLedgers are the server ledgers, each behind a fault proxy.
func faultyLedgers(t *testing.T, fn func(t *testing.T, b backend, p *faultproxy.Proxy)) {
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
	faultyLedgers(t, func(t *testing.T, b backend, p *faultproxy.Proxy) {
		up := quietUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 5s"))
		before, err := g.send("/charges", "down-0", "{}")
		if err != nil || before.status != http.StatusOK {
			t.Fatalf("before the cut: %v %v", before, err)
		}
		pid := g.cmd.Process.Pid

		p.Cut()
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

		p.Restore()
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
	// The cache is in use before the cut: it holds the answer.
	scanCache(t, b.schema+":cache:", 1, func(string, []byte) {})

	p.Cut()
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

	p.Restore()
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
	faultyLedgers(t, func(t *testing.T, b backend, p *faultproxy.Proxy) {
		up := quietUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			fmt.Fprintf(w, `{"key":%q,"n":%d}`, r.Header.Get("Idempotency-Key"), n)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 2s", "in_flight wait 1s"))
		base := g.baseline(t)

		p.Slow(50 * time.Millisecond)
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

		p.Restore()
		p.Stall()
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

		p.Restore()
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
