package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

// The open-loop load (-rate): requests sent at a fixed rate whatever the
// server's answers take, so that two series are compared at the same
// offered rate (the same code costs more CPU a request at a lower rate;
// wrk's closed loop gives each series the rate it reaches). Vegeta's
// attacker holds the rate, in a process of its own (the bench run again
// with -attack), so that its CPU is the load's, as wrk's is, and not
// counted with the upstream in the bench's process.

// attackSpec is what the load process sends: request.lua's requests,
// in its modes, at rate requests a second for d, on at most connections
// connections.
type attackSpec struct {
	URL         string        `json:"url"`
	Rate        int           `json:"rate"`
	Duration    time.Duration `json:"duration"`
	Mode        string        `json:"mode"`
	Prefix      string        `json:"prefix"`
	Keys        int           `json:"keys"`
	Connections int           `json:"connections"`
}

// attackReport is what the load process prints when it is done.
type attackReport struct {
	Requests int64          `json:"requests"`
	Seconds  float64        `json:"seconds"` // from the first request sent to the last answer
	P50      time.Duration  `json:"p50"`
	P99      time.Duration  `json:"p99"`
	Codes    map[string]int `json:"codes"`
	Errors   []string       `json:"errors"`
}

// runOpenLoop drives url for d at cfg.rate requests a second, in mode
// (request.lua's), from a load process of its own.
func runOpenLoop(cfg config, url string, d time.Duration, mode, prefix string, keys int) (sample, error) {
	spec, err := json.Marshal(attackSpec{URL: url, Rate: cfg.rate, Duration: d, Mode: mode, Prefix: prefix, Keys: keys,
		Connections: cfg.connections})
	if err != nil {
		return sample{}, err
	}
	self, err := os.Executable()
	if err != nil {
		return sample{}, err
	}
	cmd := cfg.command(loadCPU, self, "-attack", string(spec))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return sample{}, fmt.Errorf("open-loop load: %v\n%s", err, out)
	}
	var rep attackReport
	if err := json.Unmarshal(out, &rep); err != nil {
		return sample{}, fmt.Errorf("open-loop load: %v\n%s", err, out)
	}
	return rep.sample(exitedCPU(cmd))
}

// sample is the report as a run's sample; answers other than 2xx and
// transport errors make it invalid, as wrk's do (parseWrk).
func (rep attackReport) sample(load time.Duration) (sample, error) {
	var other int
	for code, n := range rep.Codes {
		if len(code) != 3 || code[0] != '2' {
			other += n
		}
	}
	if other > 0 || len(rep.Errors) > 0 {
		return sample{}, fmt.Errorf("open-loop load: %d answers were not 2xx (%v), errors: %q", other, rep.Codes, rep.Errors)
	}
	if rep.Requests == 0 || rep.Seconds <= 0 {
		return sample{}, fmt.Errorf("open-loop load: no request answered")
	}
	return sample{rps: float64(rep.Requests) / rep.Seconds, p50: rep.P50, p99: rep.P99, requests: rep.Requests,
		shares: shares{load: load}}, nil
}

// attack sends spec's requests and reports how they went.
func attack(spec attackSpec) attackReport {
	var n atomic.Int64
	body := []byte(`{"amount":4200,"currency":"eur"}`)
	header := http.Header{"Content-Type": {"application/json"}, "Authorization": {"Bearer bench"}, runHeader: {spec.Prefix}}
	target := func(t *vegeta.Target) error { // called by several workers at once
		t.Method, t.URL, t.Body, t.Header = http.MethodPost, spec.URL+"/charges", body, header.Clone()
		if key := requestKey(spec.Mode, spec.Prefix, spec.Keys, n.Add(1)); key != "" {
			t.Header.Set("Idempotency-Key", key)
		}
		return nil
	}
	conns := uint64(spec.Connections)
	atk := vegeta.NewAttacker(vegeta.Workers(conns), vegeta.MaxWorkers(conns), vegeta.Connections(spec.Connections),
		vegeta.MaxConnections(spec.Connections), vegeta.KeepAlive(true), vegeta.HTTP2(false), vegeta.Timeout(10*time.Second))
	var m vegeta.Metrics
	for res := range atk.Attack(target, vegeta.Rate{Freq: spec.Rate, Per: time.Second}, spec.Duration, "bench") {
		m.Add(res)
	}
	m.Close()
	errs := m.Errors
	if len(errs) > 5 {
		errs = errs[:5]
	}
	return attackReport{Requests: int64(m.Requests), Seconds: m.Duration.Seconds() + m.Wait.Seconds(),
		P50: m.Latencies.P50, P99: m.Latencies.P99, Codes: m.StatusCodes, Errors: errs}
}

// requestKey is request.lua's Idempotency-Key for the i-th request (from
// 1) in mode: none for plain; fresh keys; one of keys keys for replay,
// created by the warm-up; a random one of keys stored keys for random and
// stored, of the newest recentJobs of them for recent.
func requestKey(mode, prefix string, keys int, i int64) string {
	switch mode {
	case "fresh":
		return prefix + "-0-" + strconv.FormatInt(i, 10)
	case "replay":
		return prefix + "-" + strconv.FormatInt(i%int64(keys), 10)
	case "random", "stored":
		return prefix + "-" + strconv.Itoa(1+rand.IntN(keys))
	case "recent":
		n := min(recentJobs, keys)
		return prefix + "-" + strconv.Itoa(keys-n+1+rand.IntN(n))
	}
	return ""
}

// drive runs the load of one run: open-loop at cfg.rate, or wrk's closed
// loop when no rate is set.
func drive(cfg config, url string, d time.Duration, mode, prefix string, keys int) (sample, error) {
	if cfg.rate > 0 {
		return runOpenLoop(cfg, url, d, mode, prefix, keys)
	}
	return runWrk(cfg, url, d, mode, prefix, keys)
}
