package redis

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/onejob/onejob/ledger"
)

// TestReplicasShortfall runs with Replicas 1 on miniredis, whose WAIT
// answers 0 replicas as a server without any does: every transition that
// writes fails with ErrReplicas after the master ran it, and a repeat
// answers as the first call; reads and the sweep do not wait.
func TestReplicasShortfall(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	prefix := "t:" + ledger.NewID() + ":"
	l, err := Open(ctx, "redis://"+m.Addr()+"/0", Options{Prefix: prefix, Replicas: 1, ReplicaTimeout: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	plain := openMini(t, m, prefix)

	p := params("o", "k")
	if _, err := l.Reserve(ctx, p); !errors.Is(err, ErrReplicas) || !strings.Contains(err.Error(), "0 of the 1 replica(s)") {
		t.Fatalf("reserve: %v, want ErrReplicas", err)
	}
	// The master has it: the repeat (here through a ledger that does not
	// wait) answers as the first call would have.
	r, err := plain.Reserve(ctx, p)
	if err != nil || r.Outcome != ledger.Created || r.Job.ID != p.JobID {
		t.Fatalf("repeat: %v %v, want the job created by the first call", r.Outcome, err)
	}
	if !m.Exists(prefix + "ack") {
		t.Errorf("%sack was not written before WAIT", prefix)
	}
	// A repeat through the waiting ledger writes nothing but still waits.
	if _, err := l.Reserve(ctx, p); !errors.Is(err, ErrReplicas) {
		t.Errorf("repeat with Replicas: %v, want ErrReplicas", err)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); !errors.Is(err, ErrReplicas) {
		t.Errorf("complete: %v, want ErrReplicas", err)
	}
	if _, err := l.Fail(ctx, r.Attempt.Ref(), "x", nil); !errors.Is(err, ErrReplicas) {
		t.Errorf("fail: %v, want ErrReplicas", err)
	}
	if j, err := l.Job(ctx, r.Job.ID); err != nil || j.State != ledger.JobCompleted {
		t.Errorf("read: %+v %v, want the completed job, read without waiting", j, err)
	}
	if _, err := l.Find(ctx, p.OwnerHash, p.KeyHash); err != nil {
		t.Errorf("find: %v", err)
	}
	if _, err := l.Sweep(ctx, 10); err != nil {
		t.Errorf("sweep: %v", err)
	}
}

// TestReplicasOptions: Open refuses a negative count, a timeout WAIT cannot
// express (it counts milliseconds, and 0 waits for ever), a timeout
// without a count, and a timeout the client's read timeout would cut
// short.
func TestReplicasOptions(t *testing.T) {
	ctx := context.Background()
	m := miniredis.RunT(t)
	for _, c := range []struct {
		url  string
		opts Options
		want string
	}{
		{"/0", Options{Replicas: -1}, "replicas must not be negative"},
		{"/0", Options{Replicas: 1, ReplicaTimeout: -time.Second}, "replica timeout must be 1ms or more"},
		{"/0", Options{Replicas: 1, ReplicaTimeout: time.Microsecond}, "replica timeout must be 1ms or more"},
		{"/0", Options{ReplicaTimeout: time.Second}, "a replica timeout (1s) has no meaning without replicas"},
		{"/0", Options{Replicas: 1, ReplicaTimeout: 5 * time.Second}, "not shorter than the client's read timeout 5s"},
		{"/0?read_timeout=500ms", Options{Replicas: 1}, "replica timeout 1s is not shorter than the client's read timeout 500ms"},
	} {
		l, err := Open(ctx, "redis://"+m.Addr()+c.url, c.opts)
		if err == nil {
			l.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Open(%s, %+v): %v, want %q", c.url, c.opts, err, c.want)
		}
	}
	l, err := Open(ctx, "redis://"+m.Addr()+"/0?read_timeout=-1", Options{Replicas: 1, ReplicaTimeout: time.Minute})
	if err != nil {
		t.Errorf("no read timeout: %v", err)
	} else {
		l.Close()
	}
}
