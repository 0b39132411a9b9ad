//go:build integration

package integration

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
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
}
