package file

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	mrand "math/rand/v2"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

// benchLedger opens a new ledger for a benchmark, closed at its end, and
// returns it with the reservation the benchmarks make (without a key).
func benchLedger(b *testing.B) (*Ledger, ledger.ReserveParams) {
	l, err := Open(filepath.Join(b.TempDir(), "ledger.db"), Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { l.Close() })
	return l, ledger.ReserveParams{OwnerHash: make([]byte, 32), Fingerprint: make([]byte, 32), FingerprintVersion: 1,
		Retention: 24 * time.Hour, Attempt: ledger.NextAttempt{Provider: "default", Lease: time.Minute}}
}

// BenchmarkFresh measures the file ledger's part of a fresh request: a
// reservation of a new key, then its completion with a small answer, from
// 32 goroutines at once (the bench's connections), each durable.
//
//	go test -run '^$' -bench Fresh -benchtime 3s ./ledger/file
func BenchmarkFresh(b *testing.B) {
	l, p := benchLedger(b)
	ctx := context.Background()
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

// BenchmarkStored measures the ledger's part of a replay (a reservation
// of a stored job's key picked at random) and of a fresh request (a
// reservation of a new key and its completion), from 32 goroutines at
// once (replays first, then fresh keys, which add their jobs), with
// 100k and 1M completed jobs stored, each with an answer of 2 KB
// (the sweep's size, of text that does not compress), imported and
// settled as the sweep does. Past the 10,000 jobs kept for replays, most
// reservations read the store.
//
//	go test -run '^$' -bench Stored -benchtime 3s ./ledger/file
func BenchmarkStored(b *testing.B) {
	l, p := benchLedger(b)
	ctx := context.Background()
	body := make([]byte, 1536)
	rand.Read(body)
	answer := ledger.Response{Status: 200, Header: map[string][]string{"Content-Type": {"text/plain"}},
		Body: []byte(base64.StdEncoding.EncodeToString(body)), Stored: true}
	answer.Size = int64(len(answer.Body))
	key := func(i int) []byte { return []byte("key-" + strconv.Itoa(i)) }
	first := p
	first.KeyHash = key(0)
	model := completedModel(b, l, first, answer)
	stored := 1
	for _, size := range []int{100_000, 1_000_000} {
		for ; stored < size; stored += 10_000 {
			var jobs []*ledger.Job
			for i := stored; i < min(stored+10_000, size); i++ {
				jobs = append(jobs, copyJob(model, key(i)))
			}
			if err := l.Import(jobs); err != nil {
				b.Fatal(err)
			}
		}
		stored = size
		if err := l.Settle(ctx); err != nil { // as the sweep does
			b.Fatal(err)
		}
		b.Run("replay/jobs="+strconv.Itoa(size), func(b *testing.B) {
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					q := p
					q.KeyHash = key(mrand.IntN(size))
					r, err := l.Reserve(ctx, q)
					if err != nil || r.Outcome != ledger.Done {
						b.Fatal(r.Outcome, err)
					}
				}
			})
		})
		b.Run("fresh/jobs="+strconv.Itoa(size), func(b *testing.B) {
			b.SetParallelism(16)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					q := p.WithNewIDs()
					q.KeyHash = []byte("fresh-" + q.JobID)
					r, err := l.Reserve(ctx, q)
					if err != nil || r.Outcome != ledger.Created {
						b.Fatal(r.Outcome, err)
					}
					if _, err := l.Complete(ctx, r.Attempt.Ref(), answer); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
