//go:build integration

package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// TestClusterReplicasConformance runs the conformance suite with every
// transition acknowledged by the replica of its job's master.
func TestClusterReplicasConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			return openCluster(t, clusterURL(t), newClusterPrefix(t), Options{Replicas: 1})
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return openCluster(t, clusterURL(t), l.(*Ledger).Prefix(), Options{Replicas: 1})
		},
	})
}

// TestClusterReplicas: on the test cluster, each master with one replica,
// Replicas 1 reserves and completes jobs on every master, and the check
// at start has nothing to say of replication; Replicas 2 fails every
// reservation with ErrReplicas, after the master ran it, and the check
// says so.
func TestClusterReplicas(t *testing.T) {
	ctx := context.Background()
	prefix := newClusterPrefix(t)
	one := openCluster(t, clusterURL(t), prefix, Options{Replicas: 1})
	for _, w := range one.CheckDurability(ctx) {
		if strings.Contains(w, "replica") {
			t.Errorf("Replicas 1, one replica per master: %s", w)
		}
	}
	masters := map[string]bool{}
	for i := range 64 {
		p := params("o", strconv.Itoa(i))
		r, err := one.Reserve(ctx, p)
		if err != nil || r.Outcome != ledger.Created {
			t.Fatalf("reserve %d: %v %v", i, r.Outcome, err)
		}
		if _, err := one.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
		n, err := one.cluster.MasterForKey(ctx, ackKey(one.identBucket(identity(p.OwnerHash, p.KeyHash))))
		if err != nil {
			t.Fatal(err)
		}
		masters[n.Options().Addr] = true
	}
	if len(masters) != 3 {
		t.Errorf("the jobs landed on %d masters, want 3", len(masters))
	}

	two := openCluster(t, clusterURL(t), prefix, Options{Replicas: 2, ReplicaTimeout: 100 * time.Millisecond})
	if w := strings.Join(two.CheckDurability(ctx), "\n"); strings.Count(w, "every transition fails") != 3 {
		t.Errorf("Replicas 2: the check does not warn for each master:\n%s", w)
	}
	p := params("o", "two")
	start := time.Now()
	_, err := two.Reserve(ctx, p)
	if !errors.Is(err, ErrReplicas) || !strings.Contains(err.Error(), "1 of the 2 replica(s) asked for acknowledged it within 100ms") {
		t.Fatalf("reserve with Replicas 2: %v, want ErrReplicas", err)
	}
	t.Logf("%v after %v", err, time.Since(start).Round(time.Millisecond))
	if errors.Is(err, ledger.ErrStale) || errors.Is(err, ledger.ErrNotFound) {
		t.Errorf("a shortfall of replicas reads as the ledger's answer: %v", err)
	}
	// The master ran it: the repeat through Replicas 1 answers as the
	// first call would have.
	if r, err := one.Reserve(ctx, p); err != nil || r.Outcome != ledger.Created || r.Job.ID != p.JobID {
		t.Errorf("repeat with Replicas 1: %v %v", r.Outcome, err)
	}
}

// TestRedisReplicasNone: the single test server has no replica, so with
// Replicas 1 a reservation fails with ErrReplicas, and the check at start
// says every transition will.
func TestRedisReplicasNone(t *testing.T) {
	ctx := context.Background()
	l, err := Open(ctx, url(t), Options{Prefix: newPrefix(t), Replicas: 1, ReplicaTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if w := strings.Join(l.CheckDurability(ctx), "\n"); !strings.Contains(w, "0 connected replica(s) and replicas is 1: every transition fails") {
		t.Errorf("the check does not warn:\n%s", w)
	}
	_, err = l.Reserve(ctx, params("o", "k"))
	if !errors.Is(err, ErrReplicas) || !strings.Contains(err.Error(), "0 of the 1 replica(s)") {
		t.Fatalf("reserve: %v, want ErrReplicas", err)
	}
	t.Log(err)
}

// replicasOnline waits until the replica of every master of the cluster at
// url acknowledges the master's replication stream: a cluster just
// started may still be syncing its replicas, and WAIT counts only those
// that acknowledged.
func replicasOnline(t testing.TB, url string) {
	t.Helper()
	o, err := redis.ParseClusterURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClusterClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err = c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		for {
			// WAIT on a connection that wrote nothing counts the
			// replicas that acknowledged anything.
			n, err := m.Wait(ctx, 1, 100*time.Millisecond).Result()
			if err != nil || n >= 1 {
				return err
			}
		}
	})
	if err != nil {
		t.Fatalf("the cluster's replicas are not online: %v", err)
	}
}
