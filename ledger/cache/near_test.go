package cache

import (
	"fmt"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
)

func nearJob(body string) *ledger.Job {
	return &ledger.Job{ID: body, Response: &ledger.Response{Status: 200, Body: []byte(body), Stored: true}}
}

func TestNearExpiry(t *testing.T) {
	n := newNear(10, 1<<20)
	now := time.Now()
	n.put("k", nearJob("a"), now.Add(time.Second))
	if j := n.get("k", now); j == nil || j.ID != "a" {
		t.Fatalf("get before expiry: %+v", j)
	}
	if j := n.get("k", now.Add(time.Second)); j != nil {
		t.Fatalf("get at expiry: %+v, want nothing", j)
	}
	if n.len() != 0 {
		t.Fatalf("an expired entry is kept: %d entries", n.len())
	}
}

func TestNearBounds(t *testing.T) {
	until := time.Now().Add(time.Hour)
	n := newNear(3, 1<<20)
	for i := range 4 {
		n.put(fmt.Sprint(i), nearJob(fmt.Sprint(i)), until)
		if i == 2 {
			n.get("0", time.Now()) // 0 is now the most recent: 1 goes first
		}
	}
	for key, want := range map[string]bool{"0": true, "1": false, "2": true, "3": true} {
		if got := n.get(key, time.Now()) != nil; got != want {
			t.Errorf("entry %s kept: %v, want %v", key, got, want)
		}
	}

	// Bytes: each entry counts its body; the oldest go when over.
	b := newNear(100, 3*(1024+512+1))
	big := string(make([]byte, 1024))
	for i := range 5 {
		b.put(fmt.Sprint(i), nearJob(big), until)
	}
	if b.len() != 3 || b.bytes > b.maxBytes {
		t.Errorf("byte bound: %d entries, %d bytes of %d", b.len(), b.bytes, b.maxBytes)
	}
	if b.get("0", time.Now()) != nil || b.get("4", time.Now()) == nil {
		t.Error("the byte bound evicted the wrong entries")
	}
	// An entry larger than the bound is not kept at all.
	b.put("huge", nearJob(string(make([]byte, 1<<20))), until)
	if b.get("huge", time.Now()) != nil {
		t.Error("an entry over the byte bound was kept")
	}

	off := newNear(0, 1<<20)
	off.put("k", nearJob("a"), until)
	if off.get("k", time.Now()) != nil {
		t.Error("a disabled tier kept an entry")
	}
}
