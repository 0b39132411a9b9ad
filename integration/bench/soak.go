package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// soak drives the memory ledger at full speed for cfg.soak over a fixed
// set of keys whose retention is short, so jobs expire and are created
// again all along, and samples the gateway's RSS: retention must bound it.
func soak(cfg config, up *upstream, w io.Writer) error {
	const keys, retention = 5000, 20 * time.Second
	site := fmt.Sprintf("\tidempotency {\n\t\tledger memory\n\t\tretention %v\n\t}\n\treverse_proxy %s %s\n", retention, up.addr, transport)
	srv, err := startServer(cfg, cfg.gateway, "soak", "", site)
	if err != nil {
		return err
	}
	defer srv.stop()
	type result struct {
		s   sample
		err error
	}
	done := make(chan result, 1)
	hits := up.hits.Load()
	go func() {
		s, err := runWrk(cfg, srv.url, cfg.soak, "random", "soak", keys)
		done <- result{s, err}
	}()
	var samples []int64
	tick := time.NewTicker(cfg.soak / 20)
	defer tick.Stop()
	var res result
wait:
	for {
		select {
		case <-tick.C:
			samples = append(samples, srv.rss())
		case res = <-done:
			break wait
		}
	}
	if res.err != nil {
		return res.err
	}
	forwarded := up.hits.Load() - hits
	var mib []string
	for _, s := range samples {
		mib = append(mib, fmt.Sprintf("%.0f", float64(s)/(1<<20)))
	}
	q := len(samples) / 4
	fmt.Fprintf(w, "\nsoak: %v at full speed over %d keys (memory ledger, retention %v): %d requests, %d reached the upstream\n",
		cfg.soak, keys, retention, res.s.requests, forwarded)
	fmt.Fprintf(w, "  RSS every %v (MiB): %s\n", cfg.soak/20, strings.Join(mib, " "))
	if q > 0 {
		fmt.Fprintf(w, "  highest RSS in the first quarter %.1f MiB, in the last quarter %.1f MiB\n",
			float64(maxOf(samples[:q]))/(1<<20), float64(maxOf(samples[len(samples)-q:]))/(1<<20))
	}
	return nil
}

func maxOf(v []int64) int64 {
	var m int64
	for _, x := range v {
		m = max(m, x)
	}
	return m
}
