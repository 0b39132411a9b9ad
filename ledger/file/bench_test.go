package file

import (
	"context"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// BenchmarkFresh measures the file ledger's part of a fresh request: a
// reservation of a new key, then its completion with a small answer, from
// 32 goroutines at once (the bench's connections), each durable.
//
//	go test -run '^$' -bench Fresh -benchtime 3s ./ledger/file
func BenchmarkFresh(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "ledger.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	p := ledger.ReserveParams{OwnerHash: make([]byte, 32), Fingerprint: make([]byte, 32), FingerprintVersion: 1,
		Retention: 24 * time.Hour, Attempt: ledger.NextAttempt{Provider: "default", Lease: time.Minute}}
	answer := ledger.Response{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(`{"id":"ch_123","status":"succeeded","amount":4200,"currency":"eur"}`), Stored: true}
	answer.Size = int64(len(answer.Body))
	var n atomic.Int64
	b.SetParallelism(16) // 32 goroutines on two CPUs
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			q := p.WithNewIDs()
			q.KeyHash = []byte("key-" + strconv.FormatInt(n.Add(1), 10))
			r, err := l.Reserve(ctx, q)
			if err != nil || r.Outcome != ledger.Created {
				b.Fatal(r.Outcome, err)
			}
			if c, err := l.Complete(ctx, r.Attempt.Ref(), answer); err != nil || !c.Won {
				b.Fatal(err)
			}
		}
	})
}
