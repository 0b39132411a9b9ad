// Package file is the embedded Ledger: durable across restarts with no
// server to run, for one gateway process on one machine.
//
// The jobs live in memory, in a memory ledger (settled jobs as their
// compact records), and every change to them is appended to a log in the
// ledger's directory. No change is acknowledged, and no reader sees a job,
// before the log holds it on disk: the writes of concurrent requests share
// one fdatasync (group commit, package wal). At start the ledger reads its
// last snapshot and the log written since. When the log outgrows the last
// snapshot, a new snapshot is written in the background and the log before
// it deleted.
//
// Directory layout: log-<seq>, the segments of the log; snap-<seq>, the
// snapshot of every job as of the start of segment seq; LOCK, held by the
// process that has the ledger open. Each record of both is a job's record
// (package record) or the id of a job removed.
package file

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file/wal"
	"github.com/onejob/onejob/ledger/memory"
)

// Record kinds of the log and of snapshots.
const (
	kindPut    byte = 1 // a job's record
	kindDelete byte = 2 // the id of a job removed
)

// firstSegment is the number of a new ledger's first segment.
const firstSegment = 1

// Options configure a Ledger.
type Options struct {
	// Timeout bounds the wait for the directory's lock held by another
	// process (or another config of this process). Default 5s.
	Timeout time.Duration
	// Now is the ledger's clock; default time.Now.
	Now func() time.Time
	// CompactAt is the least size of the log that makes a new snapshot;
	// default 64 MiB. The log is compacted when it is this large and
	// larger than the last snapshot, so that the directory holds at most
	// about twice what the jobs take.
	CompactAt int64
}

// Ledger is a file ledger.
type Ledger struct {
	*memory.Ledger

	dir       string
	lock      *os.File
	log       *wal.Log
	compactAt int64
	// trigger is the log's size that starts the next compaction: the
	// last snapshot's size, at least compactAt. Read after every
	// operation, without a lock.
	trigger atomic.Int64

	compacting sync.Mutex // one compaction at a time
	mu         sync.Mutex
	closed     bool
	done       sync.WaitGroup // a compaction under way
}

// journal is the Ledger's memory.Journal: the log, which it compacts when
// it has grown.
type journal struct{ l *Ledger }

func (j journal) Put(rec []byte) uint64 { return j.l.log.Append(kindPut, rec) }

func (j journal) Delete(id string) uint64 { return j.l.log.Append(kindDelete, []byte(id)) }

func (j journal) Sync(n uint64) error {
	err := j.l.log.Sync(n)
	j.l.maybeCompact()
	return err
}

// Open opens (or creates) the ledger directory at path. A ledger file of
// the earlier releases (bbolt) at path is migrated first.
func Open(path string, opts Options) (*Ledger, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CompactAt <= 0 {
		opts.CompactAt = 64 << 20
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("file ledger: %w", err)
	}
	if err := migrate(path, opts.Timeout); err != nil {
		return nil, fmt.Errorf("file ledger %s: migrating the earlier release's file: %w", path, err)
	}
	if err := makeDir(path); err != nil {
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	l := &Ledger{dir: path, compactAt: opts.CompactAt}
	l.setTrigger(0)
	var err error
	if l.lock, err = lockDir(path, opts.Timeout); err != nil {
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	l.Ledger = memory.New(memory.WithClock(opts.Now), memory.WithJournal(journal{l}))
	next, err := l.recover()
	if err == nil {
		l.log, err = wal.Open(path, next)
	}
	if err != nil {
		l.lock.Close()
		return nil, fmt.Errorf("file ledger %s: %w", path, err)
	}
	return l, nil
}

// makeDir creates the ledger's directory, or checks that the directory
// there is one: empty, or holding only a ledger's files. A path that names
// some other directory ("/", a home directory) is a mistake, not a place
// to write a log in.
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
		name := strings.TrimSuffix(e.Name(), ".tmp")
		if kind, _, _ := strings.Cut(name, "-"); name != "LOCK" && kind != "log" && kind != "snap" {
			return fmt.Errorf("not a ledger directory: it holds %s; give the ledger a path of its own", e.Name())
		}
	}
	return nil
}

// lockDir takes the directory's lock, waiting up to timeout for another
// holder to let it go.
func lockDir(dir string, timeout time.Duration) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("locked by another process (or config) after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// recover loads the last snapshot and the segments after it, removes the
// files they make obsolete, and returns the number of the next segment.
func (l *Ledger) recover() (uint64, error) {
	entries, err := os.ReadDir(l.dir)
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".tmp") { // a snapshot not finished
			if err := os.Remove(filepath.Join(l.dir, e.Name())); err != nil {
				return 0, err
			}
		}
	}
	logs, snaps, err := wal.Files(l.dir)
	if err != nil {
		return 0, err
	}
	next := uint64(firstSegment)
	if len(snaps) > 0 {
		next = snaps[len(snaps)-1]
		size, err := l.replay(wal.Name("snap", next))
		if err != nil {
			return 0, err
		}
		l.setTrigger(size)
	}
	for _, seq := range logs {
		if seq < next {
			continue
		}
		if _, err := l.replay(wal.Name("log", seq)); err != nil {
			return 0, err
		}
		next = seq + 1
	}
	return next, l.removeBefore(snapsOrFirst(snaps))
}

func snapsOrFirst(snaps []uint64) uint64 {
	if len(snaps) == 0 {
		return firstSegment
	}
	return snaps[len(snaps)-1]
}

// replay applies the records of one file to the jobs in memory, and
// returns its size.
func (l *Ledger) replay(name string) (int64, error) {
	f, err := os.Open(filepath.Join(l.dir, name))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n, err := wal.Read(f, func(kind byte, payload []byte) error {
		switch kind {
		case kindPut:
			return l.Load(payload)
		case kindDelete:
			l.Unload(string(payload))
			return nil
		}
		return fmt.Errorf("record of unknown kind %d", kind)
	})
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return n, nil
}

// removeBefore deletes the segments and snapshots before segment seq: a
// snapshot of seq holds all they held.
func (l *Ledger) removeBefore(seq uint64) error {
	logs, snaps, err := wal.Files(l.dir)
	if err != nil {
		return err
	}
	for _, s := range logs {
		if s < seq {
			if err := os.Remove(filepath.Join(l.dir, wal.Name("log", s))); err != nil {
				return err
			}
		}
	}
	for _, s := range snaps {
		if s < seq {
			if err := os.Remove(filepath.Join(l.dir, wal.Name("snap", s))); err != nil {
				return err
			}
		}
	}
	return nil
}

// maybeCompact starts a compaction when the log has outgrown the last
// snapshot, unless one is under way.
func (l *Ledger) maybeCompact() {
	size := l.log.Size()
	if size < l.trigger.Load() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed || !l.compacting.TryLock() {
		return
	}
	l.done.Add(1)
	go func() {
		defer l.done.Done()
		defer l.compacting.Unlock()
		if err := l.Compact(); err != nil {
			// Tried again once the log has doubled: the log still holds
			// every change, and a full disk may have room by then.
			l.setTrigger(max(l.trigger.Load(), size))
		}
	}()
}

// Compact writes a snapshot of every job and deletes the log before it.
// The jobs are read at once, with a new segment started (which holds off
// changes for one fdatasync); the snapshot is written while changes go on.
func (l *Ledger) Compact() error {
	var seq uint64
	recs, err := l.Checkpoint(func() (err error) {
		seq, err = l.log.Rotate()
		return err
	})
	if err != nil {
		return err
	}
	var size int64
	err = wal.WriteSnapshot(l.dir, seq, func(put func(kind byte, payload []byte) error) error {
		for _, rec := range recs {
			if err := put(kindPut, rec); err != nil {
				return err
			}
			size += int64(len(rec))
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("file ledger %s: snapshot: %w", l.dir, err)
	}
	l.setTrigger(size)
	return l.removeBefore(seq)
}

// setTrigger has the next compaction start once the log is as large as
// a snapshot of size bytes, and at least compactAt.
func (l *Ledger) setTrigger(size int64) { l.trigger.Store(max(l.compactAt, size)) }

// Path returns the ledger directory's path.
func (l *Ledger) Path() string { return l.dir }

// Close flushes the log and lets the directory go.
func (l *Ledger) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	l.done.Wait()
	err := l.log.Close()
	if cerr := l.lock.Close(); err == nil {
		err = cerr
	}
	return err
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
	_ io.Closer      = (*Ledger)(nil)
)
