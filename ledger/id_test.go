package ledger

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
)

func TestNewIDIsUUIDv7(t *testing.T) {
	before := time.Now().Truncate(time.Millisecond)
	s := NewID()
	after := time.Now()
	u, err := uuid.Parse(s)
	if err != nil {
		t.Fatalf("NewID() = %q: %v", s, err)
	}
	if u.String() != s {
		t.Errorf("NewID() = %q, not in the canonical form %q", s, u)
	}
	if u.Version() != 7 || u.Variant() != uuid.RFC4122 {
		t.Errorf("NewID() = %q: version %d, variant %v; want 7, RFC 4122", s, u.Version(), u.Variant())
	}
	sec, nsec := u.Time().UnixTime()
	if at := time.Unix(sec, nsec); at.Before(before) || at.After(after) {
		t.Errorf("NewID() = %q holds %v, not between %v and %v", s, at, before, after)
	}
}

// Ids made one after the other sort in that order, from any goroutine, and
// none is made twice.
func TestNewIDsSortAndDiffer(t *testing.T) {
	const goroutines, each = 4, 20000
	ids := make([][]string, goroutines)
	var wg sync.WaitGroup
	for g := range ids {
		wg.Go(func() {
			for range each {
				ids[g] = append(ids[g], NewID())
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, goroutines*each)
	for g, list := range ids {
		if !slices.IsSorted(list) {
			t.Errorf("goroutine %d: ids not in the order made", g)
		}
		for _, id := range list {
			if seen[id] {
				t.Fatalf("id %s made twice", id)
			}
			seen[id] = true
		}
	}
	// Over 4096 ids a millisecond, the fraction runs ahead of the clock
	// but the order holds.
	a, b := NewID(), NewID()
	if a >= b {
		t.Errorf("NewID() = %s then %s", a, b)
	}
}
