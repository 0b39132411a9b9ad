// Command storage compares the stores considered for the file
// ledger under the ledger's write workload: bbolt with the group commit the
// ledger used, the ledger's own append-only log (package wal), and Pebble.
//
// Each job is two durable writes under the same 36-byte id, as in the
// ledger: the reservation (a ~300-byte record), then the completion (a
// ~700-byte record). W writers run jobs back to back; every write returns
// only once it is on disk. The program prints, per store and W, jobs per
// second, the mean and 99th percentile latency of one durable write, and
// the process CPU time per job; then, per store, the size on disk after a
// larger load and the time to open the store again.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger/file/wal"
)

// The sizes of the two records of a job.
const (
	reserveSize  = 300
	completeSize = 700
)

// store is one candidate, open in a directory. Put returns once the
// record is durable; it is called by many goroutines at once.
type store interface {
	Put(key, value []byte) error
	Close() error
}

// candidate opens a store in a new directory, and opens it again there
// (reopen), as a process does at start, returning how many records it
// found when it reads them all at open (wal), or -1.
type candidate struct {
	name   string
	open   func(dir string) (store, error)
	reopen func(dir string) (records int, err error)
}

var candidates = []candidate{
	{"bbolt", openBolt, reopenBolt},
	{"wal", openWAL, reopenWAL},
	{"pebble", openPebble, reopenPebble},
}

// ---- bbolt, with the ledger's group commit ----

var boltBucket = []byte("jobs")

// boltOptions are the options the ledger opened its bbolt file with; the
// file is fsynced at every commit (NoSync is false).
func boltOptions() *bolt.Options {
	return &bolt.Options{
		Timeout:        time.Second,
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
	}
}

// boltStore commits writes in groups, as the ledger's groupCommit did:
// each write joins a queue, and one goroutine commits everything queued in
// one transaction as soon as the previous commit is done.
type boltStore struct {
	db *bolt.DB

	mu      sync.Mutex
	queue   []*boltWrite
	running bool // a goroutine is committing
}

type boltWrite struct {
	key, value []byte
	done       chan error
}

func openBolt(dir string) (store, error) {
	db, err := bolt.Open(filepath.Join(dir, "ledger.db"), 0o600, boltOptions())
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &boltStore{db: db}, nil
}

func (s *boltStore) Put(key, value []byte) error {
	w := &boltWrite{key: key, value: value, done: make(chan error, 1)}
	s.mu.Lock()
	s.queue = append(s.queue, w)
	if !s.running {
		s.running = true
		go s.commitAll()
	}
	s.mu.Unlock()
	return <-w.done
}

// commitAll commits the queue, group after group, until it is empty.
func (s *boltStore) commitAll() {
	for {
		s.mu.Lock()
		group := s.queue
		s.queue = nil
		if len(group) == 0 {
			s.running = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		err := s.db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket(boltBucket)
			for _, w := range group {
				if err := b.Put(w.key, w.value); err != nil {
					return err
				}
			}
			return nil
		})
		for _, w := range group {
			w.done <- err
		}
	}
}

func (s *boltStore) Close() error { return s.db.Close() }

// reopenBolt opens the file as the ledger did: with NoFreelistSync, bbolt
// rebuilds its free page list by reading every page's header.
func reopenBolt(dir string) (int, error) {
	db, err := bolt.Open(filepath.Join(dir, "ledger.db"), 0o600, boltOptions())
	if err != nil {
		return 0, err
	}
	return -1, db.Close()
}

// ---- wal: append, then sync the record's number ----

// walStore writes a job's record as the ledger does: the record (which
// holds the job's id) is the payload of one log record of kind walPut.
type walStore struct{ log *wal.Log }

const walPut byte = 1

func openWAL(dir string) (store, error) {
	log, err := wal.Open(dir, 1)
	if err != nil {
		return nil, err
	}
	return &walStore{log: log}, nil
}

func (s *walStore) Put(_, value []byte) error {
	return s.log.Sync(s.log.Append(walPut, value))
}

func (s *walStore) Close() error { return s.log.Close() }

// reopenWAL reads every snapshot and segment of the directory with
// wal.Read, keeping each job's latest record in memory, which is what the
// ledger does at start (it decodes them too).
func reopenWAL(dir string) (int, error) {
	jobs := make(map[string][]byte)
	logs, snaps, err := wal.Files(dir)
	if err != nil {
		return 0, err
	}
	var names []string
	for _, s := range snaps {
		names = append(names, wal.Name("snap", s))
	}
	for _, s := range logs {
		names = append(names, wal.Name("log", s))
	}
	for _, name := range names {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return 0, err
		}
		_, err = wal.Read(f, func(_ byte, payload []byte) error {
			jobs[string(payload[:keySize])] = slices.Clone(payload)
			return nil
		})
		f.Close()
		if err != nil {
			return 0, err
		}
	}
	return len(jobs), nil
}

// compactWAL does what the ledger's compaction does once the log has
// outgrown the last snapshot: it writes a snapshot of each job's latest
// record and deletes the segments before it.
func compactWAL(dir string) error {
	jobs := make(map[string][]byte)
	f, err := os.Open(filepath.Join(dir, wal.Name("log", 1)))
	if err != nil {
		return err
	}
	_, err = wal.Read(f, func(_ byte, payload []byte) error {
		jobs[string(payload[:keySize])] = slices.Clone(payload)
		return nil
	})
	f.Close()
	if err != nil {
		return err
	}
	err = wal.WriteSnapshot(dir, 2, func(put func(kind byte, payload []byte) error) error {
		for _, rec := range jobs {
			if err := put(walPut, rec); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return os.Remove(filepath.Join(dir, wal.Name("log", 1)))
}

// ---- Pebble: one synced Set per write ----

type pebbleStore struct{ db *pebble.DB }

// pebbleOptions are Pebble's defaults, but for the newest on-disk format,
// which a new store would be created with. Durability comes from
// pebble.Sync on every Set: the write-ahead log is fdatasynced before Set
// returns, and concurrent synced commits share one fdatasync.
func pebbleOptions() *pebble.Options {
	return &pebble.Options{
		FormatMajorVersion: pebble.FormatNewest,
		Logger:             quietLogger{},
	}
}

// quietLogger drops Pebble's informational messages, which would be
// interleaved with the table; errors are still returned by the calls.
type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
	os.Exit(1)
}

func openPebble(dir string) (store, error) {
	db, err := pebble.Open(dir, pebbleOptions())
	if err != nil {
		return nil, err
	}
	return &pebbleStore{db: db}, nil
}

func (s *pebbleStore) Put(key, value []byte) error {
	return s.db.Set(key, value, pebble.Sync)
}

func (s *pebbleStore) Close() error { return s.db.Close() }

// reopenPebble opens the store: Pebble reads its manifest and replays the
// write-ahead log that was not yet flushed to tables.
func reopenPebble(dir string) (int, error) {
	db, err := pebble.Open(dir, pebbleOptions())
	if err != nil {
		return 0, err
	}
	return -1, db.Close()
}

// ---- the workload ----

const keySize = 36

// record fills buf with a record of size n for key: the key (the ledger's
// records hold the job's id), then random bytes for half of the rest
// (hashes, ids, timestamps, a response body), then fixed text (header
// names, states) which compresses.
func record(buf []byte, n int, key []byte, rng *rand.Rand) []byte {
	buf = append(buf[:0], key...)
	for len(buf) < keySize+(n-keySize)/2 {
		buf = append(buf, byte(rng.Uint32()))
	}
	for len(buf) < n {
		buf = append(buf, filler[len(buf)%len(filler)])
	}
	return buf
}

const filler = "content-type: application/json; state=completed; attempt=1; "

// newKey returns a random 36-byte id in the form of a UUID.
func newKey(rng *rand.Rand) []byte {
	var b [16]byte
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return fmt.Appendf(nil, "%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// result is what one run of the workload measured.
type result struct {
	jobs    int
	elapsed time.Duration
	lat     []time.Duration // of every durable write, sorted
	cpu     time.Duration   // process user+sys time
}

// run has writers goroutines do jobs jobs in s, back to back, and
// measures them.
func run(s store, jobs, writers int) (result, error) {
	var (
		next     atomic.Int64 // jobs started
		wg       sync.WaitGroup
		mu       sync.Mutex
		lat      []time.Duration
		firstErr error
	)
	cpu0 := cpuTime()
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			var own []time.Duration
			var buf []byte
			var err error
			for err == nil && next.Add(1) <= int64(jobs) {
				key := newKey(rng)
				for _, n := range []int{reserveSize, completeSize} {
					buf = record(buf, n, key, rng)
					t := time.Now()
					if err = s.Put(key, buf); err != nil {
						break
					}
					own = append(own, time.Since(t))
				}
			}
			mu.Lock()
			lat = append(lat, own...)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	r := result{jobs: jobs, elapsed: time.Since(start), cpu: cpuTime() - cpu0}
	slices.Sort(lat)
	r.lat = lat
	return r, firstErr
}

// cpuTime returns the user and system time the process has used.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (r result) mean() time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.lat {
		sum += d
	}
	return sum / time.Duration(len(r.lat))
}

func (r result) p99() time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[(len(r.lat)*99)/100]
}

// diskUsage returns the bytes allocated to the files under dir (as du
// counts them) and their apparent size.
func diskUsage(dir string) (allocated, apparent int64, err error) {
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		apparent += info.Size()
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			allocated += st.Blocks * 512
		}
		return nil
	})
	return allocated, apparent, err
}

// ---- the program ----

func main() {
	var (
		jobs1      = flag.Int("jobs1", 3000, "jobs per cell with one writer")
		jobs       = flag.Int("jobs", 20000, "jobs per cell with more than one writer")
		writersArg = flag.String("writers", "1,8,32,128", "writer counts, comma-separated")
		storesArg  = flag.String("stores", "bbolt,wal,pebble", "stores to measure, comma-separated")
		sizeJobs   = flag.Int("sizejobs", 100000, "jobs written before measuring the size on disk and the open time (0: skip)")
		sizeW      = flag.Int("sizewriters", 128, "writers for the size load")
		parent     = flag.String("dir", "/work", "directory under which the stores' temporary directories are made (same disk as the ledger)")
	)
	flag.Parse()
	var writers []int
	for f := range strings.SplitSeq(*writersArg, ",") {
		w, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || w < 1 {
			fatalf("-writers: bad count %q", f)
		}
		writers = append(writers, w)
	}
	var stores []candidate
	for f := range strings.SplitSeq(*storesArg, ",") {
		i := slices.IndexFunc(candidates, func(c candidate) bool { return c.name == strings.TrimSpace(f) })
		if i < 0 {
			fatalf("-stores: unknown store %q", f)
		}
		stores = append(stores, candidates[i])
	}

	// The cells go by writer count, every store in turn, so that a change
	// of the machine's load meanwhile weighs on all of them alike.
	fmt.Printf("%-8s %7s %7s %8s %11s %11s %9s\n", "store", "writers", "jobs", "jobs/s", "mean write", "p99 write", "CPU/job")
	for _, w := range writers {
		n := *jobs
		if w == 1 {
			n = *jobs1
		}
		for _, c := range stores {
			r, err := cell(*parent, c, n, w)
			if err != nil {
				fatalf("%s, %d writers: %v", c.name, w, err)
			}
			fmt.Printf("%-8s %7d %7d %8.0f %11s %11s %9s\n", c.name, w, n,
				float64(n)/r.elapsed.Seconds(), ms(r.mean()), ms(r.p99()),
				us(r.cpu/time.Duration(n)))
		}
	}
	if *sizeJobs <= 0 {
		return
	}

	fmt.Printf("\nafter %d jobs (%d writers), closed and opened again:\n", *sizeJobs, *sizeW)
	fmt.Printf("%-16s %11s %12s %10s %11s\n", "store", "load jobs/s", "on disk (du)", "apparent", "open")
	for _, c := range stores {
		if err := sizes(*parent, c, *sizeJobs, *sizeW); err != nil {
			fatalf("%s, size: %v", c.name, err)
		}
	}
}

// cell runs the workload once in a fresh store, removed after.
func cell(parent string, c candidate, jobs, writers int) (result, error) {
	dir, err := os.MkdirTemp(parent, "tmp-storagebench-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	s, err := c.open(dir)
	if err != nil {
		return result{}, err
	}
	r, err := run(s, jobs, writers)
	return r, errors.Join(err, s.Close())
}

// sizes loads a fresh store with jobs jobs, closes it, and prints its size
// on disk and the time to open it again. For wal, it also prints the same
// after a compaction, as the ledger makes when the log outgrows the last
// snapshot.
func sizes(parent string, c candidate, jobs, writers int) error {
	dir, err := os.MkdirTemp(parent, "tmp-storagebench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s, err := c.open(dir)
	if err != nil {
		return err
	}
	r, err := run(s, jobs, writers)
	if err = errors.Join(err, s.Close()); err != nil {
		return err
	}
	rate := fmt.Sprintf("%.0f", float64(jobs)/r.elapsed.Seconds())
	if err := sizeRow(c, c.name, dir, rate, jobs); err != nil {
		return err
	}
	if c.name != "wal" {
		return nil
	}
	if err := compactWAL(dir); err != nil {
		return err
	}
	return sizeRow(c, "wal, compacted", dir, "", jobs)
}

func sizeRow(c candidate, label, dir, rate string, jobs int) error {
	alloc, apparent, err := diskUsage(dir)
	if err != nil {
		return err
	}
	t := time.Now()
	n, err := c.reopen(dir)
	if err != nil {
		return err
	}
	open := time.Since(t)
	if n >= 0 && n != jobs {
		return fmt.Errorf("read %d jobs at open, want %d", n, jobs)
	}
	fmt.Printf("%-16s %11s %12s %10s %11s\n", label, rate, mib(alloc), mib(apparent), ms(open))
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }
func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }
func mib(n int64) string        { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "storage: "+format+"\n", args...)
	os.Exit(1)
}
