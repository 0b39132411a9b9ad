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
// network blip stayed down): Open asks again whether it is a cluster node
// (the keys' layout depends on it, so it is never guessed) until it
// answers, and works then.
func TestOpenWhileUnreachable(t *testing.T) {
	m := miniredis.RunT(t)
	addr := m.Addr()
	m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	back := make(chan error, 1)
	go func() {
		time.Sleep(time.Second)
		back <- m.StartAddr(addr)
	}()
	l, err := Open(ctx, "redis://"+addr+"/0", Options{Prefix: "unreached:"})
	if err != nil {
		t.Fatalf("Open with the server away for a second: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	if err := <-back; err != nil {
		t.Fatal(err)
	}
	p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte("k"),
		Fingerprint: []byte("f"), FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("primary", time.Minute)}
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

// TestOpenClusterWhileUnreachable: with the cluster's nodes named in the
// URL the layout is known, so nodes out of reach at start do not stop it:
// Open says why it could not load the scripts, and calls fail (the gateway
// answers 503) until the nodes answer.
func TestOpenClusterWhileUnreachable(t *testing.T) {
	a, b := miniredis.RunT(t), miniredis.RunT(t)
	addrA, addrB := a.Addr(), b.Addr()
	a.Close()
	b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := Open(ctx, "redis://"+addrA+"?addr="+addrB, Options{})
	if err != nil {
		t.Fatalf("Open with the cluster's nodes away: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	if l.StartError() == nil {
		t.Error("StartError is nil although the scripts could not be loaded")
	}
	p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte("k"),
		Fingerprint: []byte("f"), FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("primary", time.Minute)}
	if _, err := l.Reserve(ctx, p); err == nil {
		t.Fatal("Reserve succeeded with the cluster away")
	}
}
