//go:build integration

package redis

import (
	"context"
	"os"
	"strconv"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// BenchmarkLedger measures the ledger's two hot transitions on the test's
// single server and on the test cluster: fresh (a reservation and its
// completion: two scripts) and replay (the reservation of a completed
// job's key by an instance that has not read it yet: one script). Run it
// under integration/services.sh with a fixed -benchtime (e.g. 2000x): each
// iteration uses a key of its own. The servers are the run's own: its
// keys are left to them.
func BenchmarkLedger(b *testing.B) {
	for _, target := range []struct{ name, url string }{
		{"server", os.Getenv("ONEJOB_TEST_REDIS")},
		{"cluster", os.Getenv("ONEJOB_TEST_REDIS_CLUSTER")},
	} {
		if target.url == "" {
			b.Fatalf("%s: no address; run under integration/services.sh", target.name)
		}
		b.Run(target.name+"/fresh", func(b *testing.B) {
			l := benchLedger(b, target.url, "bench-fresh:"+ledger.NewID()+":")
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				r, err := l.Reserve(ctx, params("o", strconv.Itoa(i)))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(target.name+"/replay", func(b *testing.B) {
			prefix := "bench-replay:" + ledger.NewID() + ":"
			l := benchLedger(b, target.url, prefix)
			ctx := context.Background()
			for i := range b.N {
				r, err := l.Reserve(ctx, params("o", strconv.Itoa(i)))
				if err == nil {
					_, err = l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true})
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			peer := benchLedger(b, target.url, prefix)
			b.ResetTimer()
			for i := range b.N {
				if r, err := peer.Reserve(ctx, params("o", strconv.Itoa(i))); err != nil || r.Outcome != ledger.Done {
					b.Fatal(r.Outcome, err)
				}
			}
		})
	}
}

// BenchmarkReplicas measures what acknowledgement by a replica costs on the
// test cluster: a fresh job (reservation and completion) without it and
// with Replicas 1, each script then followed by the ack key's write and
// WAIT in the same round trip. Run it as BenchmarkLedger.
func BenchmarkReplicas(b *testing.B) {
	url := os.Getenv("ONEJOB_TEST_REDIS_CLUSTER")
	if url == "" {
		b.Fatal("cluster: no address; run under integration/services.sh")
	}
	replicasOnline(b, url)
	for _, c := range []struct {
		name     string
		replicas int
	}{{"none", 0}, {"wait1", 1}} {
		b.Run(c.name, func(b *testing.B) {
			l := benchLedgerWith(b, url, Options{Prefix: "bench-replicas:" + ledger.NewID() + ":", Replicas: c.replicas})
			ctx := context.Background()
			b.ResetTimer()
			for i := range b.N {
				r, err := l.Reserve(ctx, params("o", strconv.Itoa(i)))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func benchLedger(b *testing.B, url, prefix string) *Ledger {
	return benchLedgerWith(b, url, Options{Prefix: prefix})
}

func benchLedgerWith(b *testing.B, url string, opts Options) *Ledger {
	l, err := Open(context.Background(), url, opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l
}
