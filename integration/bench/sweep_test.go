package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// BenchmarkPreloaded is the sweep on the memory ledger, which cannot be
// filled before a gateway process starts: with 10k, 100k and 1M completed
// jobs stored, the ledger grown from one size to the next, it measures
// fresh (a Reserve and a Complete of a new key), replay (a Reserve of a
// stored job picked at random) and sweep (one Sweep call, the gateway's
// sweeper's pass, with nothing due). The jobs a fresh run adds expire
// before the next run, on the ledger's clock, which the benchmark moves:
// each size holds its number of jobs.
//
//	go test -run '^$' -bench Preloaded ./integration/bench
func BenchmarkPreloaded(b *testing.B) {
	ctx := context.Background()
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	l := memory.New(memory.WithClock(func() time.Time { return time.Unix(0, clock.Load()) }))
	resp := ledger.Response{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(answer), Size: int64(len(answer)), Stored: true}
	fp := sha256.Sum256([]byte("POST /charges " + `{"amount":4200,"currency":"eur"}`))
	owner := sha256.Sum256([]byte("Bearer bench"))
	s := stored{
		params: ledger.ReserveParams{
			OwnerHash:          owner[:],
			Fingerprint:        fp[:],
			FingerprintVersion: 1,
			Retention:          30 * 24 * time.Hour,
			Attempt:            ledger.NextAttempt{Provider: "next", Lease: 5 * time.Minute},
		},
		answer: resp,
		// Key hashes as short as can be: what the benchmark measures is
		// the ledger, not SHA-256.
		keyHash: func(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) },
	}
	// Fresh jobs are kept an hour, the stored ones 30 days.
	fresh := s
	fresh.params.Retention = time.Hour
	jobs, next := 0, 1
	for _, size := range []int{10_000, 100_000, 1_000_000} {
		if err := preload(ctx, l, s, jobs+1, size, sweepWorkers); err != nil {
			b.Fatal(err)
		}
		jobs, next = size, size+1
		label := jobsLabel(size)
		b.Run(label+"/fresh", func(b *testing.B) {
			for b.Loop() {
				if _, err := fresh.store(ctx, l, next); err != nil {
					b.Fatal(err)
				}
				next++
			}
		})
		// What fresh added expires, and is swept.
		clock.Add(int64(2 * time.Hour))
		for {
			st, err := l.Sweep(ctx, 100_000)
			if err != nil {
				b.Fatal(err)
			}
			if st.Removed < 100_000 {
				break
			}
		}
		if n := l.Len(); n != size {
			b.Fatalf("the ledger holds %d jobs after the sweep, want %d", n, size)
		}
		b.Run(label+"/replay", func(b *testing.B) {
			rng := rand.New(rand.NewPCG(1, uint64(size)))
			for b.Loop() {
				p := s.params.WithNewIDs()
				p.KeyHash = s.keyHash(1 + rng.IntN(size))
				r, err := l.Reserve(ctx, p)
				if err != nil {
					b.Fatal(err)
				}
				if r.Outcome != ledger.Done {
					b.Fatalf("replay: %v, want done", r.Outcome)
				}
			}
		})
		b.Run(label+"/sweep", func(b *testing.B) {
			for b.Loop() {
				if _, err := l.Sweep(ctx, 1000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A padded answer says its new length: a replay of it sends the whole
// body (with the provider's Content-Length kept, the client read a cut
// answer).
func TestPadAnswer(t *testing.T) {
	a := ledger.Response{Status: 200, Header: map[string][]string{"Content-Length": {"9"}, "Content-Type": {"application/json"}},
		Body: []byte(`{"id":1}` + "\n"), Size: 9, Stored: true}
	p := padAnswer(a, 2048)
	if len(p.Body) != 2048 || p.Size != 2048 || !bytes.HasPrefix(p.Body, a.Body) {
		t.Fatalf("padded body: %d bytes (size %d), want 2048 starting with the answer", len(p.Body), p.Size)
	}
	if got := p.Header["Content-Length"]; len(got) != 1 || got[0] != "2048" {
		t.Errorf("Content-Length %q, want 2048", got)
	}
	if got := a.Header["Content-Length"][0]; got != "9" {
		t.Errorf("the original answer's Content-Length became %q", got)
	}
	if same := padAnswer(a, 4); len(same.Body) != 9 {
		t.Errorf("an answer larger than asked became %d bytes", len(same.Body))
	}
}

// TestStoredSeriesReplayStoredJobs: the sweep's replay series (stored, and
// recent) send the keys of the jobs stored before them, all of them, in
// every run, and count as replays: none may reach the upstream.
func TestStoredSeriesReplayStoredJobs(t *testing.T) {
	for _, mode := range []string{"stored", "recent"} {
		r := &seriesRun{s: series{name: "sweep_file_10M_" + mode, mode: mode, prefix: storedPrefix, keys: 10_000_000}, run: "x"}
		for _, rep := range []int{-1, 0, 1} {
			if got := r.prefix(rep); got != storedPrefix {
				t.Errorf("%s: the keys of run %d are named %q, want %q (the stored jobs')", mode, rep, got, storedPrefix)
			}
		}
		if got := r.keyCount(); got != r.s.keys {
			t.Errorf("%s: requests pick among %d keys, want the %d stored", mode, got, r.s.keys)
		}
	}
}
