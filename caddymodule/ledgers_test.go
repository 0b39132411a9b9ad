package caddymodule

import (
	"context"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/memory"
)

// TestSweeper: the shared ledger's sweeper removes expired jobs by itself,
// and Destruct stops it and closes the ledger.
func TestSweeper(t *testing.T) {
	mem := memory.New()
	ctx, stop := context.WithCancel(context.Background())
	s := &shared{Ledger: mem, stop: stop, done: make(chan struct{})}
	go s.sweep(ctx, zap.NewNop(), 10*time.Millisecond)

	r, err := mem.Reserve(context.Background(), ledger.ReserveParams{
		OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Millisecond, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute},
	}.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if c, err := mem.Complete(context.Background(), r.Attempt.Ref(), ledger.Response{Status: 200, Stored: true}); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for mem.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the sweeper never removed the expired job")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := s.Destruct(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.done:
	default:
		t.Error("Destruct returned with the sweeper still running")
	}
}
