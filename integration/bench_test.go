//go:build integration

package integration

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// transport is the same upstream transport in every series, so that the
// comparison measures the gateway and not connection pooling.
const transport = `{
		transport http {
			keepalive_idle_conns_per_host 256
		}
	}`

// BenchmarkGateway compares, in one run against one upstream, plain
// reverse_proxy with the gateway on fresh keys and on replays, per ledger.
// ./integration/bench.sh runs it and prints each series' ratio to plain.
func BenchmarkGateway(b *testing.B) {
	// A bare upstream: the recording one of the tests would cost more
	// with every request.
	up := &upstream{Server: httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"ch_123","status":"succeeded","amount":4200,"currency":"eur"}`)
	}))}
	defer up.Close()
	respond := startBenchGateway(b, backend{name: "respond"},
		"\theader Content-Type application/json\n\trespond `{\"id\":\"ch_123\",\"status\":\"succeeded\",\"amount\":4200,\"currency\":\"eur\"}` 200\n")
	b.Run("plain_respond", func(b *testing.B) { drive(b, respond, func(int64) string { return "" }) })
	respond.stop()
	plain := startBenchGateway(b, backend{name: "plain"}, "\treverse_proxy "+up.addr()+" "+transport+"\n")
	b.Run("plain_reverse_proxy", func(b *testing.B) { drive(b, plain, func(int64) string { return "" }) })
	plain.stop()
	cached := pgBackend(b)
	cached.name = "postgres+cache"
	cached.line += "\n\t\tcache redis " + redisURL(b) + " " + cached.schema + ":cache:"
	for _, be := range []backend{
		{name: "memory", line: "ledger memory"},
		{name: "file", line: ""},
		pgBackend(b),
		cached,
		redisBackend(b),
	} {
		g := startBenchGateway(b, be, "\tidempotency {\n\t\t{ledger}\n\t}\n\treverse_proxy "+up.addr()+" "+transport+"\n")
		var seq atomic.Int64
		b.Run(be.name+"_fresh", func(b *testing.B) {
			drive(b, g, func(int64) string { return "fresh-" + strconv.FormatInt(seq.Add(1), 10) })
		})
		b.Run(be.name+"_replay", func(b *testing.B) {
			drive(b, g, func(i int64) string { return "replay-" + strconv.FormatInt(i%64, 10) })
		})
		g.stop()
	}
}

func startBenchGateway(b *testing.B, be backend, site string) *gateway {
	return startGatewayWith(b, be, "\tlog {\n\t\tlevel ERROR\n\t}\n", site)
}

// drive sends b.N POSTs from 32 concurrent clients; key(i) gives the i-th
// request's idempotency key ("" for none).
func drive(b *testing.B, g *gateway, key func(i int64) string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	var n atomic.Int64
	b.SetParallelism(16)
	cpu0 := processCPU(b, g)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			req, _ := http.NewRequest(http.MethodPost, g.url+"/charges", strings.NewReader(`{"amount":4200,"currency":"eur"}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", "Bearer bench")
			if k := key(i); k != "" {
				req.Header.Set("Idempotency-Key", k)
			}
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
	b.StopTimer()
	// The gateway's CPU time per request (user + system, from /proc), and
	// its peak resident memory so far.
	b.ReportMetric(float64(processCPU(b, g)-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-us/op")
	b.ReportMetric(float64(peakRSS(b, g))/(1<<20), "peak-rss-MiB")
}

// processCPU returns the gateway process's CPU time (utime + stime).
func processCPU(b *testing.B, g *gateway) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", g.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(utime+stime) * time.Second / ticks
}

// peakRSS returns the gateway process's peak resident set size in bytes.
func peakRSS(b *testing.B, g *gateway) int64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", g.cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}
