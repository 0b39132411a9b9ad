package main

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"
)

// TestAttack: the open-loop load sends request.lua's requests at its rate
// for its duration (each fresh key once, a replay's among its keys), and
// its report makes a sample only when every answer was 2xx.
func TestAttack(t *testing.T) {
	var mu sync.Mutex
	keys := map[string]int{}
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.Method != http.MethodPost || r.URL.Path != "/charges" || r.Header.Get(runHeader) != "run" ||
			r.Header.Get("Authorization") != "Bearer bench" {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		keys[r.Header.Get("Idempotency-Key")]++
		w.WriteHeader(status)
	}))
	defer srv.Close()

	spec := attackSpec{URL: srv.URL, Rate: 200, Duration: time.Second, Mode: "fresh", Prefix: "run", Keys: 64, Connections: 4}
	rep := attack(spec)
	s, err := rep.sample(time.Second)
	if err != nil {
		t.Fatal(err)
	}
	// 200 a second for a second, whatever the answers take: the count is
	// the rate's, not the server's.
	if rep.Requests < 190 || rep.Requests > 201 || len(keys) != int(rep.Requests) {
		t.Fatalf("%d requests sent, %d keys seen: want about 200, each key once", rep.Requests, len(keys))
	}
	if s.requests != rep.Requests || s.rps < 150 || s.load != time.Second {
		t.Errorf("sample %+v from %+v", s, rep)
	}

	clear(keys)
	spec.Mode, spec.Keys = "replay", 8
	attack(spec)
	if len(keys) != 8 {
		t.Errorf("replays used %d keys, want 8: %v", len(keys), keys)
	}

	mu.Lock()
	status = http.StatusConflict
	mu.Unlock()
	spec.Duration = 100 * time.Millisecond
	if _, err := attack(spec).sample(0); err == nil {
		t.Error("a run answered 409 made a sample")
	}
}

// TestRequestKey: the keys of request.lua's modes.
func TestRequestKey(t *testing.T) {
	for _, c := range []struct {
		mode string
		i    int64
		want string
	}{{"plain", 1, ""}, {"fresh", 7, "p-0-7"}, {"replay", 7, "p-3"}, {"replay", 4, "p-0"}} {
		if got := requestKey(c.mode, "p", 4, c.i); got != c.want {
			t.Errorf("requestKey(%q, %d) = %q, want %q", c.mode, c.i, got, c.want)
		}
	}
	for range 100 {
		if k := requestKey("stored", "p", 2, 1); k != "p-1" && k != "p-2" {
			t.Fatalf("stored key %q, want p-1 or p-2", k)
		}
	}
	// The newest recentJobs of the stored keys, each of them.
	keys := recentJobs + 5
	seen := map[string]bool{}
	for range 50 * recentJobs {
		seen[requestKey("recent", "p", keys, 1)] = true
	}
	if len(seen) != recentJobs || !seen["p-6"] || !seen["p-"+strconv.Itoa(keys)] {
		t.Errorf("recent keys: %d, with p-6 %v and p-%d %v; want the %d from p-6 to p-%d",
			len(seen), seen["p-6"], keys, seen["p-"+strconv.Itoa(keys)], recentJobs, keys)
	}
}
