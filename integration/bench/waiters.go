package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// benchWaiters holds cfg.waiters clients on one in-flight key, then lets
// the attempt finish, on the memory ledger and (with -postgres) on
// PostgreSQL, and reports the gateway's memory, the time from the
// upstream's answer to each waiter's, and the ledger reads the waiters
// made; beside them, the time plain Caddy takes to answer as many requests
// fired at once, the baseline of the release.
func benchWaiters(cfg config, w io.Writer) error {
	base, err := burstPlain(cfg)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "\nplain Caddy respond, %d requests fired at once on open connections: median answered after %.1f ms, the last after %.1f ms\n",
		cfg.waiters, ms(percentile(base, 0.5)), ms(base[len(base)-1]))
	// Half as many: the bench holds both ends of the upstream's
	// connections too, within its limit of open files.
	held, err := heldPlain(cfg, w, max(cfg.waiters/2, 1))
	if err != nil {
		return err
	}
	ledgers := []struct{ name, line string }{{"memory", "ledger memory"}}
	if cfg.postgres != "" {
		ledgers = append(ledgers, struct{ name, line string }{"postgres",
			"ledger postgres " + withParam(cfg.postgres, "pool_max_conns", strconv.Itoa(cfg.connections)) + " bench"})
	}
	for _, l := range ledgers {
		if err := waitersOn(cfg, w, l.name, l.line, base[len(base)-1], held); err != nil {
			return fmt.Errorf("waiters on %s: %v", l.name, err)
		}
	}
	return nil
}

// burstPlain has plain Caddy answer respond to cfg.waiters requests sent at
// once, each on a connection of its own opened beforehand (as the
// waiters' are when their answer comes), and returns the time from the
// first send to each answer, sorted.
func burstPlain(cfg config) ([]time.Duration, error) {
	srv, err := startServer(cfg, cfg.plain, "burst", "", "\theader Content-Type application/json\n\trespond `"+answer+"` 200\n")
	if err != nil {
		return nil, err
	}
	defer srv.stop()
	clients := make([]*http.Client, cfg.waiters)
	send := func(c *http.Client) error { return charge(c, srv.url) }
	// The connections open in batches, so the listen queue never
	// overflows; each then waits idle in its client's pool.
	for i := range clients {
		clients[i] = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 3 * time.Minute}
		defer clients[i].CloseIdleConnections()
	}
	for lo := 0; lo < len(clients); lo += 500 {
		var wg sync.WaitGroup
		errs := make(chan error, 500)
		for _, c := range clients[lo:min(lo+500, len(clients))] {
			wg.Add(1)
			go func() { defer wg.Done(); errs <- send(c) }()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				return nil, fmt.Errorf("plain burst: opening connections: %v", err)
			}
		}
	}
	start := make(chan struct{})
	var ready, done sync.WaitGroup
	lags := make([]time.Duration, len(clients))
	errs := make([]error, len(clients))
	var first time.Time
	for i, c := range clients {
		ready.Add(1)
		done.Add(1)
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			errs[i] = send(c)
			lags[i] = time.Since(first)
		}()
	}
	ready.Wait()
	first = time.Now()
	close(start)
	done.Wait()
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("plain burst: client %d: %v", i, err)
		}
	}
	sort.Slice(lags, func(i, j int) bool { return lags[i] < lags[j] })
	return lags, nil
}

// waitersOn holds cfg.waiters clients on one in-flight key with the ledger
// of the line, then lets the attempt finish, and reports the gateway's RSS,
// the time from the upstream's answer to each client's, compared with
// plain Caddy's last answer of the burst (base), with the memory per
// waiter beside what plain Caddy holds per proxied request in flight
// (held, bytes), and the reads of the job the ledger made for the waiters.
func waitersOn(cfg config, w io.Writer, name, line string, base time.Duration, held float64) error {
	up, err := newHolder()
	if err != nil {
		return err
	}
	defer up.close()
	site := "\tidempotency {\n\t\t" + line + "\n\t\tattempt_timeout 2m\n\t\tin_flight wait 2m\n\t}\n\treverse_proxy " + up.addr() + "\n"
	srv, err := startServer(cfg, cfg.gateway, "waiters-"+name, "\tmetrics\n", site)
	if err != nil {
		return err
	}
	defer srv.stop()
	rssBefore := srv.rss()
	// A key of its own: the PostgreSQL schema outlives the run.
	key := fmt.Sprintf("waiters-%s-%x", name, time.Now().UnixNano())

	tr := &http.Transport{MaxIdleConnsPerHost: cfg.waiters, ResponseHeaderTimeout: 3 * time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 3 * time.Minute}
	type outcome struct {
		at     time.Time
		status int
		body   string
		err    error
	}
	outcomes := make([]outcome, cfg.waiters)
	send := func(i int) {
		req, _ := http.NewRequest(http.MethodPost, srv.url+"/charges", strings.NewReader(`{"amount":4200,"currency":"eur"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer bench")
		req.Header.Set("Idempotency-Key", key)
		resp, err := client.Do(req)
		if err != nil {
			outcomes[i] = outcome{err: err}
			return
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		outcomes[i] = outcome{at: time.Now(), status: resp.StatusCode, body: string(body), err: err}
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); send(0) }()
	if err := until(30*time.Second, func() bool { return up.reached.Load() == 1 }); err != nil {
		close(up.release)
		return fmt.Errorf("waiters: the first request never reached the upstream")
	}
	// The others connect in batches, so the listen queue never overflows.
	for i := 1; i < cfg.waiters; i++ {
		wg.Add(1)
		go func(i int) { defer wg.Done(); send(i) }(i)
		if i%500 == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	err = until(2*time.Minute, func() bool { return metric(srv.admin, "caddy_http_requests_in_flight") >= float64(cfg.waiters) })
	holding, stacks, heap := srv.rss(), metric(srv.admin, "go_memstats_stack_inuse_bytes"), metric(srv.admin, "go_memstats_heap_inuse_bytes")
	// The last to arrive may still be making their first reads: the count
	// before the answer is taken once it stopped moving.
	readsGathering, hasReads := metricSeen(srv.admin, waitReads)
	for hasReads {
		time.Sleep(200 * time.Millisecond)
		now, _ := metricSeen(srv.admin, waitReads)
		if now == readsGathering {
			break
		}
		readsGathering = now
	}
	if os.Getenv("ONEJOB_BENCH_PPROF") != "" {
		for _, p := range []string{"heap", "goroutine"} {
			if resp, err := http.Get("http://" + srv.admin + "/debug/pprof/" + p); err == nil {
				f, _ := os.Create(filepath.Join(os.Getenv("ONEJOB_BENCH_PPROF"), "waiters-"+name+"-"+p+".pprof"))
				io.Copy(f, resp.Body)
				f.Close()
				resp.Body.Close()
			}
		}
	}
	close(up.release)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("waiters: only %.0f of %d requests reached the gateway", metric(srv.admin, "caddy_http_requests_in_flight"), cfg.waiters)
	}
	if n := up.reached.Load(); n != 1 {
		return fmt.Errorf("waiters: %d requests reached the upstream, want 1", n)
	}
	readsAfter, _ := metricSeen(srv.admin, waitReads)
	done := time.Unix(0, up.answered.Load())
	var last time.Duration
	var lags []time.Duration
	for i, o := range outcomes {
		if o.err != nil || o.status != http.StatusOK || o.body != answer {
			return fmt.Errorf("waiters: client %d: %v %d %q", i, o.err, o.status, o.body)
		}
		lag := max(o.at.Sub(done), 0)
		lags = append(lags, lag)
		last = max(last, lag)
	}
	fmt.Fprintf(w, "\n%d clients waiting on one in-flight key (%s ledger): one upstream call, every client got the answer\n", cfg.waiters, name)
	// The target: what holding a waiter costs the gateway, over
	// what it held idle.
	const perWaiterTarget = 20 << 10
	perWaiter := float64(holding-rssBefore) / float64(cfg.waiters)
	memVerdict := "met"
	if perWaiter > perWaiterTarget {
		memVerdict = "MISSED"
	}
	fmt.Fprintf(w, "  RSS: %.1f MiB idle, %.1f MiB holding them, %.1f MiB peak: %.1f KiB per waiter (target <= %d KiB: %s), %.2fx what plain Caddy holds per proxied request\n",
		float64(rssBefore)/(1<<20), float64(holding)/(1<<20), float64(srv.peakRSS())/(1<<20),
		perWaiter/(1<<10), perWaiterTarget>>10, memVerdict, perWaiter/held)
	fmt.Fprintf(w, "  holding them: %.1f MiB of goroutine stacks, %.1f MiB of heap\n", stacks/(1<<20), heap/(1<<20))
	verdict := "met"
	if float64(last) > 1.5*float64(base) {
		verdict = "MISSED"
	}
	fmt.Fprintf(w, "  from the upstream's answer: median client released after %.1f ms, the last after %.1f ms, %.2fx plain Caddy's last answer of the burst (target <= 1.5x: %s)\n",
		ms(percentile(lags, 0.5)), ms(last), float64(last)/float64(base), verdict)
	if hasReads {
		after := readsAfter - readsGathering
		verdict = "met"
		if after > 1 {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "  ledger reads for the waiters: %.0f while they gathered, %.0f after the answer (target 1: %s)\n",
			readsGathering, after, verdict)
	}
	return nil
}

// charge posts a charge, without an idempotency key, to the server at url
// and checks that the upstream's answer came back.
func charge(c *http.Client, url string) error {
	resp, err := c.Post(url+"/charges", "application/json", strings.NewReader(`{"amount":4200,"currency":"eur"}`))
	if err != nil {
		return err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err == nil && (resp.StatusCode != http.StatusOK || string(body) != answer) {
		err = fmt.Errorf("%d %q", resp.StatusCode, body)
	}
	return err
}

// holder is an upstream that holds every request until release is
// closed, then answers it.
type holder struct {
	l        net.Listener
	release  chan struct{}
	reached  atomic.Int64 // requests that reached it
	answered atomic.Int64 // UnixNano when it last sent an answer
}

func newHolder() (*holder, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &holder{l: l, release: make(chan struct{})}
	go http.Serve(l, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		h.reached.Add(1)
		<-h.release
		// Stamped before the answer leaves (a flush would make it a stream).
		h.answered.Store(time.Now().UnixNano())
		rw.Header().Set("Content-Type", "application/json")
		io.WriteString(rw, answer)
	}))
	return h, nil
}

func (h *holder) addr() string { return h.l.Addr().String() }
func (h *holder) close()       { h.l.Close() }

// heldPlain has plain Caddy's reverse_proxy hold n requests in flight, each
// from a connection of its own, to an upstream that answers once they are
// all there, and reports what holding one cost it: the baseline of a
// waiter's memory (a waiter holds its client's connection and request, but
// no upstream connection).
func heldPlain(cfg config, w io.Writer, n int) (perRequest float64, err error) {
	up, err := newHolder()
	if err != nil {
		return 0, err
	}
	defer up.close()
	srv, err := startServer(cfg, cfg.plain, "held", "", "\treverse_proxy "+up.addr()+"\n")
	if err != nil {
		return 0, err
	}
	defer srv.stop()
	idle := srv.rss()
	tr := &http.Transport{MaxIdleConnsPerHost: n, ResponseHeaderTimeout: 3 * time.Minute}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 3 * time.Minute}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = charge(client, srv.url) }()
		if i%500 == 499 { // in batches, so the listen queue never overflows
			time.Sleep(50 * time.Millisecond)
		}
	}
	err = until(2*time.Minute, func() bool { return up.reached.Load() == int64(n) })
	holding := srv.rss()
	close(up.release)
	wg.Wait()
	if err != nil {
		return 0, fmt.Errorf("plain held: %d of %d requests reached the upstream", up.reached.Load(), n)
	}
	for i, err := range errs {
		if err != nil {
			return 0, fmt.Errorf("plain held: client %d: %v", i, err)
		}
	}
	perRequest = float64(holding-idle) / float64(n)
	fmt.Fprintf(w, "plain Caddy reverse_proxy holding %d requests in flight: RSS %.1f MiB idle, %.1f MiB holding them: %.1f KiB per request\n",
		n, float64(idle)/(1<<20), float64(holding)/(1<<20), perRequest/(1<<10))
	return perRequest, nil
}

// waitReads is the metric of the reads a ledger made for its waiters.
const waitReads = "caddy_idempotency_ledger_wait_reads_total"

// metric sums the samples of one metric (any labels) in the admin
// endpoint's metrics.
func metric(admin, name string) float64 {
	total, _ := metricSeen(admin, name)
	return total
}

// metricSeen is metric, and whether the endpoint had a sample of it.
func metricSeen(admin, name string) (total float64, seen bool) {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			total += v
			seen = true
		}
	}
	return total, seen
}

// until polls cond every 20 ms for at most d.
func until(d time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v", d)
		}
	}
	return nil
}
