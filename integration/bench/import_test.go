package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file"
)

// TestPreloadImport: the jobs the sweep imports into a file ledger are
// there, each under its own key, replayed with the model's answer, and
// counted.
func TestPreloadImport(t *testing.T) {
	ctx := context.Background()
	l, err := file.Open(filepath.Join(t.TempDir(), "ledger.db"), file.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	owner, fp := sha256.Sum256([]byte("o")), sha256.Sum256([]byte("f"))
	s := stored{
		params: ledger.ReserveParams{OwnerHash: owner[:], Fingerprint: fp[:], FingerprintVersion: 1,
			Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "next", Lease: time.Minute}},
		answer:  ledger.Response{Status: 200, Body: []byte(answer), Size: int64(len(answer)), Stored: true},
		keyHash: func(i int) []byte { return binary.BigEndian.AppendUint64(nil, uint64(i)) },
	}
	const n = 25_000
	if err := preloadImport(ctx, l, l, s, 1, n); err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, i := range []int{1, 2, 9_999, 10_001, n} {
		p := s.params.WithNewIDs()
		p.KeyHash = s.keyHash(i)
		r, err := l.Reserve(ctx, p)
		if err != nil || r.Outcome != ledger.Done || string(r.Job.Response.Body) != answer || ids[r.Job.ID] {
			t.Fatalf("key %d: %v %v", i, r.Outcome, err)
		}
		ids[r.Job.ID] = true
	}
	c, err := l.Counts(ctx)
	if err != nil || c.ByState[ledger.JobCompleted] != n {
		t.Fatalf("counts %v %v, want %d completed", c.ByState, err, n)
	}
}
