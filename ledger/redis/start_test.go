package redis

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/onejob/onejob/ledger"
)

// TestOpenWhileUnreachable: a server that cannot be reached when the
// ledger opens is no reason not to start (a gateway restarted during a
// network blip would stay down): Open succeeds and says why it could not
// load the scripts, calls fail while the server is away, and work once it
// answers, the scripts loaded then.
func TestOpenWhileUnreachable(t *testing.T) {
	m := miniredis.RunT(t)
	addr := m.Addr()
	m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Open(ctx, "redis://"+addr+"/0", Options{Prefix: "unreached:"})
	if err != nil {
		t.Fatalf("Open with the server away: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	if l.StartError() == nil {
		t.Error("StartError is nil although the scripts could not be loaded")
	}
	p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte("k"),
		Fingerprint: []byte("f"), FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("primary", time.Minute)}
	if _, err := l.Reserve(ctx, p); err == nil {
		t.Fatal("Reserve succeeded with the server away")
	}
	if err := m.StartAddr(addr); err != nil {
		t.Fatal(err)
	}
	r, err := l.Reserve(ctx, p)
	if err != nil || r.Outcome != ledger.Created {
		t.Fatalf("Reserve once the server answers: %v, %v", r.Outcome, err)
	}
}

// TestOpenRefusesAServerError: a server that answers with an error (here,
// a password it does not accept) is a configuration mistake, refused at
// once.
func TestOpenRefusesAServerError(t *testing.T) {
	m := miniredis.RunT(t)
	m.RequireAuth("secret")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if l, err := Open(ctx, "redis://:wrong@"+m.Addr()+"/0", Options{}); err == nil {
		l.Close()
		t.Fatal("Open with a wrong password succeeded")
	}
}
