package file

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func TestFileConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { l.Close() })
			return l
		},
		// One process holds the file: a peer is the same ledger.
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}

// TestSurvivesReopen: what was completed before a close is replayed after
// the file is opened again, and a pending job is still pending.
func TestSurvivesReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	ctx := context.Background()
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Hour}}
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 201, Body: []byte("kept"), Size: 4, Stored: true,
		Header: map[string][]string{"X": {"y"}}}); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	q := p
	q.KeyHash = []byte("k2")
	pending, err := l.Reserve(ctx, q.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	again, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil || again.Outcome != ledger.Done || again.Job.ID != r.Job.ID || string(again.Job.Response.Body) != "kept" ||
		again.Job.Response.Header["X"][0] != "y" {
		t.Fatalf("after reopen: %v %+v %v", again.Outcome, again.Job, err)
	}
	if p2, err := l.Reserve(ctx, q.WithNewIDs()); err != nil || p2.Outcome != ledger.InFlight || p2.Job.ID != pending.Job.ID {
		t.Fatalf("pending job after reopen: %v %v", p2.Outcome, err)
	}
}

// TestLockTimeout: a second open of a held file fails after the timeout
// instead of blocking forever.
func TestLockTimeout(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, err := Open(path, Options{Timeout: 50 * time.Millisecond}); err == nil {
		t.Fatal("a second open of a locked file succeeded")
	}
}

// TestReplaysKeptInProcess: replays of a completed job are answered from
// the process once read, mismatches too, and never past the job's expiry.
func TestReplaysKeptInProcess(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute}}
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 201, Body: []byte("once"), Size: 4, Stored: true}); err != nil || !c.Won {
		t.Fatal(c.Won, err)
	}
	for i := range 3 {
		got, err := l.Reserve(ctx, p.WithNewIDs())
		if err != nil || got.Outcome != ledger.Done || got.Job.ID != r.Job.ID || string(got.Job.Response.Body) != "once" {
			t.Fatalf("replay %d: %v %+v %v", i, got.Outcome, got.Job, err)
		}
	}
	other := p
	other.Fingerprint = []byte("another request")
	if got, err := l.Reserve(ctx, other.WithNewIDs()); err != nil || got.Outcome != ledger.Mismatch || got.Job.ID != r.Job.ID {
		t.Fatalf("another request: %v %v", got.Outcome, err)
	}
	now = now.Add(time.Hour) // the job's retention has passed
	got, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil || got.Outcome != ledger.Created || got.Job.ID == r.Job.ID {
		t.Fatalf("after expiry: %v %v, want a new job", got.Outcome, err)
	}
}

// A path that names a directory of other files is refused, not written in.
func TestNotALedgerDirectory(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := Open(dir, Options{}); err == nil || !strings.Contains(err.Error(), "not a ledger directory") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("opening a directory of other files: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); !os.IsNotExist(err) {
		t.Errorf("the directory was written in: %v", err)
	}
}

// completedModel reserves p's key in l (p has one), completes the job with
// answer, and returns it as read back: a model for copyJob.
func completedModel(tb testing.TB, l *Ledger, p ledger.ReserveParams, answer ledger.Response) *ledger.Job {
	tb.Helper()
	ctx := context.Background()
	r, err := l.Reserve(ctx, p.WithNewIDs())
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), answer); err != nil {
		tb.Fatal(err)
	}
	model, err := l.Job(ctx, r.Job.ID)
	if err != nil {
		tb.Fatal(err)
	}
	model.ReadAt = time.Time{}
	return model
}

// copyJob returns model with ids of its own and the key keyHash, a job to
// Import.
func copyJob(model *ledger.Job, keyHash []byte) *ledger.Job {
	j := model.Clone()
	j.ID, j.KeyHash = ledger.NewID(), keyHash
	j.Attempts[0].ID, j.Attempts[0].JobID = ledger.NewID(), j.ID
	j.CompletedBy = j.Attempts[0].ID
	return j
}

// TestImportSettle: jobs imported whole are read as the ledger's own, and
// stay so once the store is settled (rewritten into its last level).
func TestImportSettle(t *testing.T) {
	ctx := context.Background()
	l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k0"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Hour}}
	model := completedModel(t, l, p, ledger.Response{Status: 200, Body: []byte("kept"), Size: 4, Stored: true})
	ids := map[string]string{"k0": model.ID}
	var jobs []*ledger.Job
	for i := 1; i <= 2500; i++ {
		j := copyJob(model, []byte("k"+strconv.Itoa(i)))
		ids[string(j.KeyHash)] = j.ID
		jobs = append(jobs, j)
	}
	if err := l.Import(jobs); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if n := checkStore(t, l, func(*testing.T, []byte) {}); n != len(ids) {
		t.Fatalf("%d jobs stored, want %d", n, len(ids))
	}
	for key, id := range ids {
		q := p.WithNewIDs()
		q.KeyHash = []byte(key)
		r, err := l.Reserve(ctx, q)
		if err != nil || r.Outcome != ledger.Done || r.Job.ID != id || string(r.Job.Response.Body) != "kept" {
			t.Fatalf("key %s: %v %v, want the job %s done", key, r.Outcome, err, id)
		}
	}
}

// TestCacheSizeBoundsReplays: the answers kept for replays take an eighth
// of CacheSize, which the storage report counts in the cache's bytes.
func TestCacheSizeBoundsReplays(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		cacheSize int64
		kept      bool
	}{{16 << 20, true}, {8 << 20, false}} { // an answer of 512 KiB costs about 1 MiB in the heap: within an eighth of 16 MiB, not of 8 MiB
		l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{CacheSize: c.cacheSize})
		if err != nil {
			t.Fatal(err)
		}
		p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"), FingerprintVersion: 1,
			Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute}}
		r, err := l.Reserve(ctx, p.WithNewIDs())
		if err != nil {
			t.Fatal(err)
		}
		body := make([]byte, 512<<10)
		if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: body, Size: int64(len(body)), Stored: true}); err != nil {
			t.Fatal(err)
		}
		if got, err := l.Reserve(ctx, p.WithNewIDs()); err != nil || got.Outcome != ledger.Done {
			t.Fatalf("replay: %v %v", got.Outcome, err)
		}
		st, err := l.Storage()
		if err != nil {
			t.Fatal(err)
		}
		if kept := l.replays.Len() == 1; kept != c.kept || (kept && st.CacheBytes < heapCost*int64(len(body))) {
			t.Errorf("cache size %d: the answer kept for replays: %v (cache bytes %d), want %v", c.cacheSize, kept, st.CacheBytes, c.kept)
		}
		if st.CacheSize != c.cacheSize {
			t.Errorf("the report's cache size %d, want %d", st.CacheSize, c.cacheSize)
		}
		l.Close()
	}
}

// TestAnswersInBlobFiles: records holding answers of kilobytes are kept in
// blob files beside the tables, which hold little more than the keys, and
// read back whole, also after a reopen, when the storage report counts
// them; once their jobs expired and were swept, the blob files go.
func TestAnswersInBlobFiles(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "ledger.db")
	var later atomic.Int64 // how far the ledger's clock is ahead
	opts := Options{Now: func() time.Time { return time.Now().Add(time.Duration(later.Load())) }}
	l, err := Open(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	body := bytes.Repeat([]byte("0123456789abcdef"), 128) // 2 KiB
	p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k0"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Hour}}
	model := completedModel(t, l, p, ledger.Response{Status: 200, Body: body, Size: int64(len(body)), Stored: true})
	const n = 2500
	var jobs []*ledger.Job
	for i := 1; i < n; i++ {
		jobs = append(jobs, copyJob(model, []byte("k"+strconv.Itoa(i))))
	}
	if err := l.Import(jobs); err != nil {
		t.Fatal(err)
	}
	if err := l.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	m := l.db.Metrics()
	tables := m.Total().TablesSize
	if m.BlobFiles.LiveCount == 0 || m.BlobFiles.ReferencedValueSize < n*uint64(len(body)) || tables > n*256 {
		t.Fatalf("%d blob files holding %d bytes of values, %d bytes of tables: want the %d answers of %d bytes in blob files, the tables a fraction",
			m.BlobFiles.LiveCount, m.BlobFiles.ReferencedValueSize, tables, n, len(body))
	}
	l.Close()
	if l, err = Open(path, opts); err != nil {
		t.Fatal(err)
	}
	files, err := Size(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, err := l.Storage(); err != nil || st.DiskBytes < files*9/10 || st.DiskBytes > files {
		t.Fatalf("after a reopen the storage report says %d bytes on disk (%v); its files take %d", st.DiskBytes, err, files)
	}
	for _, i := range []int{0, 1, n / 2, n - 1} {
		q := p.WithNewIDs()
		q.KeyHash = []byte("k" + strconv.Itoa(i))
		r, err := l.Reserve(ctx, q)
		if err != nil || r.Outcome != ledger.Done || !bytes.Equal(r.Job.Response.Body, body) {
			t.Fatalf("key k%d after a reopen: %v %v, want its job done with its answer", i, r.Outcome, err)
		}
	}
	later.Store(int64(2 * time.Hour))
	for {
		st, err := l.Sweep(ctx, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if st.Removed == 0 {
			break
		}
	}
	if err := l.Settle(ctx); err != nil {
		t.Fatal(err)
	}
	if m := l.db.Metrics(); m.BlobFiles.LiveCount != 0 {
		t.Fatalf("%d blob files of %d bytes left after every job expired and was swept", m.BlobFiles.LiveCount, m.BlobFiles.LiveSize)
	}
}

// TestMaxOpenFiles: Pebble's file cache takes half the process's limit of
// open files, at most 10,000, and Pebble's default when the limit is
// unknown; this process's own limit gives it at least its default's half.
func TestMaxOpenFiles(t *testing.T) {
	for _, c := range []struct {
		limit uint64
		want  int
	}{{0, 1000}, {1024, 512}, {20000, 10000}, {1 << 20, 10000}} {
		if got := maxOpenFiles(c.limit); got != c.want {
			t.Errorf("maxOpenFiles(%d) = %d, want %d", c.limit, got, c.want)
		}
	}
	if n := maxOpenFiles(openFilesLimit()); n < 500 {
		t.Errorf("with this process's limit %d, %d files", openFilesLimit(), n)
	}
}

// TestStorageCountsSyncs: the storage report counts the log's syncs since
// the ledger opened: one at least for each transition made alone, fewer
// than transitions when many share a sync.
func TestStorageCountsSyncs(t *testing.T) {
	ctx := context.Background()
	l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	syncs := func() uint64 {
		st, err := l.Storage()
		if err != nil {
			t.Fatal(err)
		}
		return st.Syncs
	}
	before := syncs()
	const alone = 5
	for i := range alone {
		p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte{byte(i)}, Fingerprint: []byte("f"), FingerprintVersion: 1,
			Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute}}
		if _, err := l.Reserve(ctx, p.WithNewIDs()); err != nil {
			t.Fatal(err)
		}
	}
	// Pebble counts a sync just after it wakes the transitions it carried.
	counted := func(want uint64) uint64 {
		for end := time.Now().Add(5 * time.Second); syncs()-before < want && time.Now().Before(end); {
			time.Sleep(time.Millisecond)
		}
		return syncs() - before
	}
	if got := counted(alone); got < alone {
		t.Errorf("%d reservations one after the other: %d syncs, want at least %d", alone, got, alone)
	}
	before = syncs()
	const together = 64
	var wg sync.WaitGroup
	for i := range together {
		wg.Go(func() {
			p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte{1, byte(i)}, Fingerprint: []byte("f"), FingerprintVersion: 1,
				Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Minute}}
			if _, err := l.Reserve(ctx, p.WithNewIDs()); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got := counted(1); got == 0 || got >= together {
		t.Errorf("%d reservations at once: %d syncs, want at least one and fewer than one each", together, got)
	}
}

// TestCacheSizeBoundsMemory: what the ledger holds in memory — Pebble's
// cache, its memtables and the replay cache — stays within CacheSize once
// the cache is full and a memtable holds writes, and the storage report
// counts all of it.
func TestCacheSizeBoundsMemory(t *testing.T) {
	ctx := context.Background()
	const size = 64 << 20
	l, err := Open(filepath.Join(t.TempDir(), "ledger.db"), Options{CacheSize: size})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte("k0"), Fingerprint: []byte("f"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Hour}}
	body := bytes.Repeat([]byte("answer, "), 2<<10) // 16 KiB
	model := completedModel(t, l, p, ledger.Response{Status: 200, Body: body, Size: int64(len(body)), Stored: true})
	// 64 MiB of answers, read once each: more than the cache holds. Then
	// 6 MiB more, left in the memtable.
	const jobs, last = 4096, 384
	var batch []*ledger.Job
	for i := 1; i <= jobs+last; i++ {
		batch = append(batch, copyJob(model, []byte("k"+strconv.Itoa(i))))
		if len(batch) == 256 || i == jobs+last {
			if err := l.Import(batch); err != nil {
				t.Fatal(err)
			}
			batch = batch[:0]
		}
		if i == jobs {
			if err := l.db.Flush(); err != nil {
				t.Fatal(err)
			}
			for k := 1; k <= jobs; k++ {
				q := p.WithNewIDs()
				q.KeyHash = []byte("k" + strconv.Itoa(k))
				if r, err := l.Reserve(ctx, q); err != nil || r.Outcome != ledger.Done {
					t.Fatalf("replay %d: %v %v", k, r.Outcome, err)
				}
			}
		}
	}
	st, err := l.Storage()
	if err != nil {
		t.Fatal(err)
	}
	m := l.db.Metrics()
	if m.BlockCache.Size < size/4 || m.MemTable.Size < 4<<20 || l.replays.Len() == 0 {
		t.Fatalf("the test did not fill the ledger's memory: blocks %d, memtables %d, replays %d",
			m.BlockCache.Size, m.MemTable.Size, l.replays.Len())
	}
	held := m.BlockCache.Size + int64(m.MemTable.Size) + heapCost*int64(l.replays.Bytes())
	if st.CacheBytes != held || held > size {
		t.Errorf("the ledger holds %d bytes (reported %d), want at most its cache_size %d", held, st.CacheBytes, size)
	}
}
