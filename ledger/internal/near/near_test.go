package near

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
	n := New(10, 1<<20)
	now := time.Now()
	n.Put("k", nearJob("a"), now.Add(time.Second))
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
		n.Put(fmt.Sprint(i), nearJob(fmt.Sprint(i)), until)
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
		b.Put(fmt.Sprint(i), nearJob(big), until)
	}
	if b.Len() != 3 || b.bytes > b.maxBytes {
		t.Errorf("byte bound: %d entries, %d bytes of %d", b.Len(), b.bytes, b.maxBytes)
	}
	if b.Get("0", time.Now()) != nil || b.Get("4", time.Now()) == nil {
		t.Error("the byte bound evicted the wrong entries")
	}
	// An entry larger than the bound is not kept at all.
	b.Put("huge", nearJob(string(make([]byte, 1<<20))), until)
	if b.Get("huge", time.Now()) != nil {
		t.Error("an entry over the byte bound was kept")
	}

	off := New(0, 1<<20)
	off.Put("k", nearJob("a"), until)
	if off.Get("k", time.Now()) != nil {
		t.Error("a disabled tier kept an entry")
	}
}
