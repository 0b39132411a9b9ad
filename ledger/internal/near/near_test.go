package near

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/notify"
)

func nearJob(body string) *ledger.Job {
	return &ledger.Job{ID: body, Response: &ledger.Response{Status: 200, Body: []byte(body), Stored: true}}
}

func TestNearExpiry(t *testing.T) {
	n := New(10, 1<<20)
	now := time.Now()
	n.Put("k", nearJob("a"), now.Add(time.Second), n.Gen())
	if j := n.Get("k", now); j == nil || j.ID != "a" {
		t.Fatalf("get before expiry: %+v", j)
	}
	if j := n.Get("k", now.Add(time.Second)); j != nil {
		t.Fatalf("get at expiry: %+v, want nothing", j)
	}
	if n.Len() != 0 {
		t.Fatalf("an expired entry is kept: %d entries", n.Len())
	}
}

func TestNearBounds(t *testing.T) {
	until := time.Now().Add(time.Hour)
	n := New(3, 1<<20)
	for i := range 4 {
		n.Put(fmt.Sprint(i), nearJob(fmt.Sprint(i)), until, n.Gen())
		if i == 2 {
			n.Get("0", time.Now()) // 0 is now the most recent: 1 goes first
		}
	}
	for key, want := range map[string]bool{"0": true, "1": false, "2": true, "3": true} {
		if got := n.Get(key, time.Now()) != nil; got != want {
			t.Errorf("entry %s kept: %v, want %v", key, got, want)
		}
	}

	// Bytes: each entry counts its body; the oldest go when over.
	b := New(100, 3*(1024+512+1))
	big := string(make([]byte, 1024))
	for i := range 5 {
		b.Put(fmt.Sprint(i), nearJob(big), until, b.Gen())
	}
	if b.Len() != 3 || b.bytes > b.maxBytes {
		t.Errorf("byte bound: %d entries, %d bytes of %d", b.Len(), b.bytes, b.maxBytes)
	}
	if b.Get("0", time.Now()) != nil || b.Get("4", time.Now()) == nil {
		t.Error("the byte bound evicted the wrong entries")
	}
	// An entry larger than the bound is not kept at all.
	b.Put("huge", nearJob(string(make([]byte, 1<<20))), until, b.Gen())
	if b.Get("huge", time.Now()) != nil {
		t.Error("an entry over the byte bound was kept")
	}

	off := New(0, 1<<20)
	off.Put("k", nearJob("a"), until, off.Gen())
	if off.Get("k", time.Now()) != nil {
		t.Error("a disabled tier kept an entry")
	}
}

func ownedJob(owner, body string) *ledger.Job {
	j := nearJob(body)
	j.OwnerHash = []byte(owner)
	return j
}

// TestNearPurges: a purge heard drops the owner's jobs and refuses a job
// read before it; while the notifications followed are down, nothing is
// kept, and a job read before they came back is refused too.
func TestNearPurges(t *testing.T) {
	until := time.Now().Add(time.Hour)
	n := New(10, 1<<20)
	n.Put("a1", ownedJob("alice", "a1"), until, n.Gen())
	n.Put("b1", ownedJob("bob", "b1"), until, n.Gen())
	before := n.Gen() // a read of alice's a2 starts
	n.ForgetOwner([]byte("alice"))
	n.Put("a2", ownedJob("alice", "a2"), until, before)
	if n.Get("a1", time.Now()) != nil || n.Get("a2", time.Now()) != nil {
		t.Error("a purged owner's job is still kept, or one read before the purge was kept after it")
	}
	if n.Get("b1", time.Now()) == nil {
		t.Error("a purge of alice dropped bob's job")
	}

	n.Live(false)
	n.Put("b2", ownedJob("bob", "b2"), until, n.Gen())
	if n.Len() != 0 {
		t.Errorf("while down the cache holds %d jobs, want none", n.Len())
	}
	if n.Keeps(n.Gen()) {
		t.Error("while down the cache lets another tier keep a job")
	}
	down := n.Gen()
	n.Live(true)
	n.Put("b3", ownedJob("bob", "b3"), until, down)
	if n.Get("b3", time.Now()) != nil {
		t.Error("a job read while the notifications were down was kept after they came back")
	}
	n.Put("b4", ownedJob("bob", "b4"), until, n.Gen())
	if n.Get("b4", time.Now()) == nil || !n.Keeps(n.Gen()) {
		t.Error("a job read while live was not kept")
	}
}

// TestNearFollowStarts: a followed cache keeps nothing until its
// subscription is confirmed, and its first Get starts the subscription,
// even when the cache itself is off (a tier that shares what it reads
// asks it whether to keep).
func TestNearFollowStarts(t *testing.T) {
	for _, entries := range []int{10, 0} {
		started := make(chan struct{})
		var once sync.Once
		sub := notify.NewSubscriber(func(ctx context.Context, ready func(), wake func(string)) error {
			once.Do(func() { close(started) })
			<-ctx.Done()
			return ctx.Err()
		}, nil)
		defer sub.Close()
		n := New(entries, 1<<20)
		n.Follow(sub)
		until := time.Now().Add(time.Hour)
		n.Put("k", nearJob("a"), until, n.Gen())
		if n.Get("k", time.Now()) != nil || n.Keeps(n.Gen()) {
			t.Fatalf("%d entries: a followed cache kept a job before its subscription was confirmed", entries)
		}
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d entries: the first Get did not start the subscription", entries)
		}
	}
}
