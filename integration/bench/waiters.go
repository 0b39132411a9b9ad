package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// benchWaiters holds cfg.waiters clients on one in-flight key (memory
// ledger), then lets the attempt finish, and reports the gateway's peak
// RSS and the time from the upstream's answer to the last waiter's.
func benchWaiters(cfg config, w io.Writer) error {
	release := make(chan struct{})
	var answered atomic.Int64 // UnixNano when the upstream sent its answer
	var reached atomic.Int64
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	go http.Serve(l, http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		reached.Add(1)
		<-release
		// Stamped before the answer leaves (a flush would make it a stream).
		answered.Store(time.Now().UnixNano())
		rw.Header().Set("Content-Type", "application/json")
		io.WriteString(rw, answer)
	}))
	site := "\tidempotency {\n\t\tledger memory\n\t\tattempt_timeout 2m\n\t\tin_flight wait 2m\n\t}\n\treverse_proxy " + l.Addr().String() + "\n"
	srv, err := startServer(cfg, cfg.gateway, "waiters", "\tmetrics\n", site)
	if err != nil {
		return err
	}
	defer srv.stop()
	rssBefore := srv.rss()

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
		req.Header.Set("Idempotency-Key", "the-one-key")
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
	if err := until(30*time.Second, func() bool { return reached.Load() == 1 }); err != nil {
		close(release)
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
	if os.Getenv("ONEJOB_BENCH_PPROF") != "" {
		for _, p := range []string{"heap", "goroutine"} {
			if resp, err := http.Get("http://" + srv.admin + "/debug/pprof/" + p); err == nil {
				f, _ := os.Create(filepath.Join(os.Getenv("ONEJOB_BENCH_PPROF"), "waiters-"+p+".pprof"))
				io.Copy(f, resp.Body)
				f.Close()
				resp.Body.Close()
			}
		}
	}
	close(release)
	wg.Wait()
	if err != nil {
		return fmt.Errorf("waiters: only %.0f of %d requests reached the gateway", metric(srv.admin, "caddy_http_requests_in_flight"), cfg.waiters)
	}
	if n := reached.Load(); n != 1 {
		return fmt.Errorf("waiters: %d requests reached the upstream, want 1", n)
	}
	done := time.Unix(0, answered.Load())
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
	fmt.Fprintf(w, "\n%d clients waiting on one in-flight key (memory ledger): one upstream call, every client got the answer\n", cfg.waiters)
	fmt.Fprintf(w, "  RSS: %.1f MiB idle, %.1f MiB holding them, %.1f MiB peak (target < 200 MB)\n",
		float64(rssBefore)/(1<<20), float64(holding)/(1<<20), float64(srv.peakRSS())/(1<<20))
	fmt.Fprintf(w, "  holding them: %.1f MiB of goroutine stacks, %.1f MiB of heap\n", stacks/(1<<20), heap/(1<<20))
	fmt.Fprintf(w, "  from the upstream's answer: median client released after %.1f ms, the last after %.1f ms (target < 100 ms)\n",
		ms(percentile(lags, 0.5)), ms(last))
	return nil
}

// metric sums the samples of one metric (any labels) in the admin
// endpoint's metrics.
func metric(admin, name string) float64 {
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	var total float64
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, " ") || strings.HasPrefix(rest, "{")) {
			v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
			total += v
		}
	}
	return total
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
