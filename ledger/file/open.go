package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
	dto "github.com/prometheus/client_model/go"

	"github.com/onejob/onejob/internal/tick"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file/wal"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/notify"
)

// Options configure a Ledger.
type Options struct {
	// Timeout bounds the wait for the directory's lock held by another
	// process (or another config of this process). Default 5s.
	Timeout time.Duration
	// Now is the ledger's clock; default time.Now.
	Now func() time.Time
	// CacheSize is the memory the ledger may take, in bytes, whatever
	// the number of jobs it holds: an eighth for the answers replayed
	// lately, decoded and ready to send again, counted at what they cost
	// in the Go heap (replayShare), and the rest for Pebble's cache, which
	// holds its two memtables (the writes not yet in a table on disk) and
	// the stored jobs read lately, with the C allocator's overhead on them
	// (blockCache). Default 96 MiB.
	CacheSize int64
}

// replayShare: the answers replayed lately take 1/replayShare of the
// cache size. Decoded, in the Go heap, a job costs about twice its bytes
// there (the collector's headroom at its default target, GOGC=100), where
// Pebble's cache holds the same record in its own size: the replay cache
// keeps half its share in jobs (heapCost), so that the share bounds the
// memory it takes. An eighth counted at its bytes left the gateway at 10M
// jobs and a cache of 256 MiB 85 MiB over the memory target
// (docs/performance-history.md).
const replayShare = 8

// heapCost is what a byte of the replay cache's jobs costs in the Go heap.
const heapCost = 2

// DefaultCacheSize is CacheSize's default: Pebble's cache then holds
// about 50 MiB of blocks beside its memtables, room for the index and
// filters of 10M jobs and the blocks read lately.
const DefaultCacheSize = 96 << 20

// blockCache is the capacity of Pebble's cache (its memtables count in
// it) in a ledger whose CacheSize is size: what the replay cache leaves,
// less the C allocator's overhead on the cache's blocks, a fifth. At 10M
// jobs a cache of 224 MiB took 282 MiB of the process's memory
// (docs/performance-history.md).
func blockCache(size int64) int64 {
	return (size - size/replayShare) * 4 / 5
}

// memTableSize is the size of one of Pebble's memtables: the writes not yet
// in a table on disk. Pebble holds at most two before it stalls writes.
const memTableSize = 8 << 20

// maxOpenFiles is how many of its files Pebble keeps open: half the
// process's limit (the rest is for its connections), at most 10,000 (Pebble's
// default, 1,000, when the limit is unknown). A replay reads a table and a
// blob file; at 10M jobs of 2 KB the store holds about 2,200 files, and a
// file cache smaller than that opens a file again, reading its footer and
// index, for most replays.
func maxOpenFiles(limit uint64) int {
	if limit == 0 {
		return 1000
	}
	return int(min(limit/2, 10000))
}

// separateFrom is the size from which a record is kept in a blob file
// rather than in its table (openDB).
const separateFrom = 512

// format is the version of the ledger's layout, stored under formatKey: a
// later release's layout is refused, not misread.
const format = "1"

// Ledger is a file ledger.
type Ledger struct {
	fsm.Applier // the transitions of one job, over update

	dir       string
	db        *pebble.DB
	cacheSize int64
	lock      *pebble.Lock // the directory's, let go after the database closes
	now       func() time.Time

	locks   stripes // an owner's key: every change of its job
	waiters notify.Waiters
	replays *near.Cache // settled jobs replayed lately, decoded, by identity

	stopTrim func()        // ends the trimming of C's allocator (trimEvery)
	trimmed  chan struct{} // closed when it has ended
	trims    atomic.Int64  // how many times it trimmed
	used     atomic.Bool   // whether a call used the database since the last trim

	mu     sync.Mutex
	closed bool
	users  sync.WaitGroup // calls using the database (open)
}

// Open opens (or creates) the ledger directory at path. A ledger of the
// earlier releases at path (a directory of log segments and snapshots, or
// a bbolt file) is migrated first.
func Open(path string, opts Options) (*Ledger, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CacheSize <= 0 {
		opts.CacheSize = DefaultCacheSize
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	if err := migrateBolt(path, opts.Timeout); err != nil {
		return nil, fmt.Errorf("file ledger %s: migrating the bbolt file of an earlier release: %w", path, err)
	}
	if err := migrateLog(path, opts); err != nil {
		return nil, fmt.Errorf("file ledger %s: migrating the log of the previous release: %w", path, err)
	}
	if err := makeDir(path); err != nil {
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	db, lock, err := openDB(path, opts)
	if err != nil {
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	l := &Ledger{dir: path, db: db, cacheSize: opts.CacheSize, lock: lock, now: opts.Now, locks: newStripes(),
		replays: near.New(10000, int(opts.CacheSize/replayShare/heapCost))}
	l.Applier = fsm.Applier{Update: l.update}
	ctx, stop := context.WithCancel(context.Background())
	l.stopTrim, l.trimmed = stop, make(chan struct{})
	go func() {
		defer close(l.trimmed)
		tick.Every(ctx, trimEvery, func() {
			if l.used.Swap(false) {
				trimMalloc()
				l.trims.Add(1)
			}
		})
	}()
	return l, nil
}

// trimEvery is how often the pages C's allocator holds free go back to the
// system: Pebble's cache, churning under load, frees blocks in the arenas
// of some threads as others allocate in theirs (malloc_cgo.go). Each
// ledger trims while it is open, though the allocator is the process's:
// a trimmer shared by the process's ledgers would outlive the ledger that
// started it, and with it a test's synctest bubble (sim failed so).
// It trims after a second in which the ledger was used, not every second of
// an idle one (what the allocator holds free came from its calls).
const trimEvery = time.Second

// syncEvery is the least time between two syncs of the log. At 2,000
// fresh requests a second (the benchmark's open loop) it took the syncs
// from 0.56 a request to 0.23, with the same latency.
const syncEvery = time.Millisecond

// openDB opens the Pebble database in dir, waiting up to opts.Timeout for
// another holder of its lock, and checks (or, new, writes) its format. The
// caller closes the lock after the database.
func openDB(dir string, opts Options) (*pebble.DB, *pebble.Lock, error) {
	lock, err := lockDir(dir, opts.Timeout)
	if err != nil {
		return nil, nil, err
	}
	cache := pebble.NewCache(blockCache(opts.CacheSize))
	defer cache.Unref() // the database holds its own reference
	o := &pebble.Options{
		Cache:              cache,
		Lock:               lock,
		MemTableSize:       memTableSize,
		MaxOpenFiles:       maxOpenFiles(openFilesLimit()),
		FormatMajorVersion: pebble.FormatNewest,
		Merger:             sumMerger,
		Logger:             quiet{},
	}
	// A fresh key is looked up before it is reserved, and is nowhere: a
	// Bloom filter per table answers that without reading the table
	// (lookup reads the last level's too).
	for i := range o.Levels {
		o.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	// A job's record holds its stored answer, kilobytes where its key is
	// tens of bytes. Records of separateFrom bytes and more go to blob
	// files beside the tables, which then hold keys and the values'
	// places: the tables' index blocks, read by every lookup, stay small
	// enough for the cache at millions of jobs, and a replay reads one
	// blob block after them.
	o.Experimental.ValueSeparationPolicy = func() pebble.ValueSeparationPolicy {
		return pebble.ValueSeparationPolicy{Enabled: true, MinimumSize: separateFrom, MaxBlobReferenceDepth: 10,
			RewriteMinimumAge: 5 * time.Minute, TargetGarbageRatio: 0.2}
	}
	// Transitions that arrive while the log syncs share the next sync; a
	// sync that would follow the last within syncEvery waits for the rest
	// of it, so that more of them share it under load (none waits when the
	// last sync is older).
	o.WALMinSyncInterval = func() time.Duration { return syncEvery }
	db, err := pebble.Open(dir, o)
	if err != nil {
		lock.Close()
		return nil, nil, err
	}
	v, closer, err := db.Get([]byte(formatKey))
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		err = db.Set([]byte(formatKey), []byte(format), pebble.Sync)
	case err == nil:
		if string(v) != format {
			err = fmt.Errorf("the ledger's layout is version %q, not %q: it was written by a later release", v, format)
		}
		closer.Close()
	}
	if err != nil {
		db.Close()
		lock.Close()
		return nil, nil, err
	}
	return db, lock, nil
}

// lockDir takes the directory's lock, waiting up to timeout for another
// holder to let it go.
func lockDir(dir string, timeout time.Duration) (*pebble.Lock, error) {
	deadline := time.Now().Add(timeout)
	for {
		lock, err := pebble.LockDirectory(dir, vfs.Default)
		if err == nil {
			return lock, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("locked by another process (or config) after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// makeDir creates the ledger's directory, or checks that the directory
// there is one: empty, or holding only a ledger's files. A path that names
// some other directory ("/", a home directory) is a mistake, not a place
// to write a database in.
func makeDir(path string) error {
	entries, err := os.ReadDir(path)
	if os.IsNotExist(err) {
		if err := os.Mkdir(path, 0o700); err != nil {
			return err
		}
		// Its name too must survive a crash.
		return wal.SyncDir(filepath.Dir(path))
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !ledgerFile(e.Name()) {
			return fmt.Errorf("not a ledger directory: it holds %s; give the ledger a path of its own", e.Name())
		}
	}
	return nil
}

// ledgerFile reports whether name is one Pebble gives a file of its
// database.
func ledgerFile(name string) bool {
	switch name {
	case "LOCK", "CURRENT", "archive":
		return true
	}
	for _, prefix := range []string{"MANIFEST-", "OPTIONS-", "marker.", "temporary."} {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	ext := filepath.Ext(name)
	return ext == ".sst" || ext == ".log" || ext == ".blob" || ext == ".dbtmp"
}

// quiet is Pebble's logger: the ledger has nothing to say while it works,
// and a fatal error stops the process, as Pebble expects.
type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("file ledger: "+format, args...))
}

// Path returns the ledger directory's path.
func (l *Ledger) Path() string { return l.dir }

// Local reports that the ledger runs in the gateway's process (ledger.Local).
func (l *Ledger) Local() bool { return true }

// Close lets the directory go, once the calls under way are finished
// (every change acknowledged is on disk already).
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.users.Wait()
	l.stopTrim()
	<-l.trimmed
	err := l.db.Close()
	if lerr := l.lock.Close(); err == nil {
		err = lerr
	}
	return err
}

// Storage implements ledger.StorageReporter.
func (l *Ledger) Storage() (ledger.Storage, error) {
	done, err := l.open()
	if err != nil {
		return ledger.Storage{}, err
	}
	defer done()
	m := l.db.Metrics()
	return ledger.Storage{
		DiskBytes:   int64(diskBytes(m)),
		CacheBytes:  m.BlockCache.Size + int64(m.MemTable.Size) + heapCost*int64(l.replays.Bytes()),
		CacheSize:   l.cacheSize,
		CacheHits:   uint64(m.BlockCache.Hits),
		CacheMisses: uint64(m.BlockCache.Misses),
		Syncs:       syncs(m),
	}, nil
}

// syncs is how many times the database synced its log since it opened:
// the count of Pebble's histogram of their latencies.
func syncs(m *pebble.Metrics) uint64 {
	if m.LogWriter.FsyncLatency == nil {
		return 0
	}
	var d dto.Metric
	if m.LogWriter.FsyncLatency.Write(&d) != nil {
		return 0
	}
	return d.GetHistogram().GetSampleCount()
}

// diskBytes is what the database's files take on disk. Pebble's own sum
// counts the blob files by a tally it keeps from its changes since the
// database opened (the blob files found at the open are not in it, and its
// removals of those wrap it below zero); the live blob files' size, taken
// from the current version, replaces it (in uint64's arithmetic, which
// undoes the wrap).
func diskBytes(m *pebble.Metrics) uint64 {
	return m.DiskSpaceUsage() - m.BlobFiles.Local.LiveSize + m.BlobFiles.LiveSize
}

// Size returns the bytes the ledger's files in dir take on disk (the
// benchmark's sweep reports it).
func Size(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	return n, err
}

var (
	_ ledger.Ledger  = (*Ledger)(nil)
	_ ledger.Counter = (*Ledger)(nil)
	_ ledger.Purger  = (*Ledger)(nil)

	_ ledger.StorageReporter = (*Ledger)(nil)
	_ io.Closer              = (*Ledger)(nil)
)
