//go:build cgo && linux

package file

import (
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger/file/internal/cmem"
)

// TestTrimsFreeMemory: memory freed in C's allocator on many threads, as
// Pebble's cache frees it under load, stays resident until an open ledger
// in use trims it (trimEvery).
func TestTrimsFreeMemory(t *testing.T) {
	l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const threads = 8
	held := make([]cmem.Blocks, threads)
	defer func() {
		for _, b := range held {
			b.Free()
		}
	}()
	var wg sync.WaitGroup
	for i := range threads {
		wg.Go(func() {
			runtime.LockOSThread() // a thread, and an arena, of its own
			held[i] = cmem.Hold(2048, 4096)
		})
	}
	wg.Wait()
	debug.FreeOSMemory() // what the Go heap returns is not the trim's
	before := rssAnon(t)
	deadline := time.Now().Add(3 * trimEvery)
	for now := before; before-now < 16<<20; now = rssAnon(t) {
		if time.Now().After(deadline) {
			t.Fatalf("anonymous memory %d MiB after %d MiB were freed, %d MiB %v later: not returned", before>>20, threads*8, now>>20, 3*trimEvery)
		}
		if _, err := l.Storage(); err != nil { // the ledger in use
			t.Fatal(err)
		}
		time.Sleep(trimEvery / 10)
	}
}

// rssAnon returns the process's anonymous resident memory.
func rssAnon(t *testing.T) int64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if rest, ok := strings.CutPrefix(line, "RssAnon:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no RssAnon in /proc/self/status")
	return 0
}
