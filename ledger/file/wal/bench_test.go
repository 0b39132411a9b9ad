package wal

import (
	"sync"
	"testing"
	"time"
)

// BenchmarkSync measures a durable append — Append, then Sync — with 32
// writers at once, as the gateway's requests make them: the time each
// waits (ns/op is per record, all writers together), and the records one
// flush carried.
//
//	go test -run '^$' -bench Sync ./ledger/file/wal
func BenchmarkSync(b *testing.B) {
	const writers = 32
	l, err := Open(b.TempDir(), 1)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	payload := make([]byte, 400)
	var (
		mu     sync.Mutex
		waited time.Duration
	)
	start := l.Flushes()
	b.SetParallelism(writers / 2)
	b.RunParallel(func(pb *testing.PB) {
		var mine time.Duration
		for pb.Next() {
			t := time.Now()
			if err := l.Sync(l.Append(1, payload)); err != nil {
				b.Error(err)
				return
			}
			mine += time.Since(t)
		}
		mu.Lock()
		waited += mine
		mu.Unlock()
	})
	b.ReportMetric(float64(waited.Microseconds())/float64(b.N), "us-wait/record")
	b.ReportMetric(float64(b.N)/float64(l.Flushes()-start), "records/flush")
}
