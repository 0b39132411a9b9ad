package caddymodule

import (
	"context"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestProbeLogsChangesOnly: a provider probed every second, failing,
// failing, passing, passing, failing, failing, gets three log lines: one
// for each change of its state (the first probe's included), not one a
// probe.
func TestProbeLogsChangesOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		statuses := []int{503, 503, 200, 200, 503, 503}
		n := 0
		p := &Provider{Name: "p", handler: caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
			w.WriteHeader(statuses[min(n, len(statuses)-1)])
			n++
			return nil
		})}
		m, err := newMetrics(prometheus.NewRegistry(), "srv0")
		if err != nil {
			t.Fatal(err)
		}
		core, logs := observer.New(zap.InfoLevel)
		pr := &prober{cfg: ProbeConfig{Method: http.MethodGet, Path: "/", Every: caddy.Duration(time.Second)},
			scope: "probe-test", timeout: time.Second, max: 1 << 20, metrics: m, logger: zap.New(core)}
		ctx, cancel := context.WithCancel(t.Context())
		pr.start(ctx, []*Provider{p})
		time.Sleep(5*time.Second + time.Second/2) // probes at 0, 1, ... 5 s
		cancel()
		synctest.Wait()
		if n != len(statuses) {
			t.Fatalf("%d probes, want %d", n, len(statuses))
		}
		var got []string
		for _, e := range logs.All() {
			got = append(got, e.Message)
		}
		want := []string{"probe failed: no failover or hedge to this provider", "probe passed",
			"probe failed: no failover or hedge to this provider"}
		if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
			t.Errorf("log lines %q, want %q", got, want)
		}
	})
}
