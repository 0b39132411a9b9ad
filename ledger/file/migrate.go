package file

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file/wal"
	"github.com/onejob/onejob/ledger/internal/record"
)

// The releases before the log kept the ledger in one bbolt file at the
// ledger's path: its bucket "jobs" mapped each job id to the job's record
// (see package record); the other buckets were indexes of it.
var boltJobs = []byte("jobs")

// migrateBolt turns a bbolt ledger file of the earlier releases at path
// into a ledger directory of the previous release (a log, migrated in turn
// by migrateLog) at the same path. The file is first renamed to
// path.bbolt, then read into a snapshot in path.tmp, which is renamed to
// path: a start interrupted at any step finds either the file or the
// renamed file and starts over from there. path.bbolt is kept, for an
// operator to remove once the new release is trusted.
func migrateBolt(path string, timeout time.Duration) error {
	old := path + ".bbolt"
	if st, err := os.Stat(path); err == nil && st.Mode().IsRegular() {
		if err := os.Rename(path, old); err != nil {
			return err
		}
		if err := wal.SyncDir(filepath.Dir(path)); err != nil {
			return err
		}
	} else if err == nil || !os.IsNotExist(err) {
		return err // a directory: nothing to migrate
	}
	if _, err := os.Stat(old); os.IsNotExist(err) {
		return nil // a new ledger
	}
	tmp := path + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	db, err := bolt.Open(old, 0o600, &bolt.Options{ReadOnly: true, Timeout: timeout})
	if err != nil {
		return fmt.Errorf("%s: %w", old, err)
	}
	defer db.Close()
	err = wal.WriteSnapshot(tmp, firstSegment, func(put func(kind byte, payload []byte) error) error {
		return db.View(func(tx *bolt.Tx) error {
			jobs := tx.Bucket(boltJobs)
			if jobs == nil {
				return nil
			}
			return jobs.ForEach(func(k, v []byte) error {
				j, err := record.Decode(v) // the oldest records are JSON
				if err != nil {
					return fmt.Errorf("%s: job %s: %w", old, k, err)
				}
				return put(kindPut, record.Encode(j))
			})
		})
	})
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return wal.SyncDir(filepath.Dir(path))
}

// The previous release kept the ledger as a log (package wal) in its
// directory: segments log-<seq> and snapshots snap-<seq> of the jobs as of
// the start of segment seq, and a LOCK file it held with flock. Each record
// is a job's record or the id of a job removed.
const (
	kindPut      byte = 1 // a job's record
	kindDelete   byte = 2 // the id of a job removed
	firstSegment      = 1 // the number of a new log's first segment
)

// migrateLog turns a log directory of the previous release at path into a
// ledger of this one. The jobs are read into memory (as that release did
// at every start) and written to a new database in path.tmp; then the
// directory moves to path.wal, kept for an operator to remove once the new
// release is trusted, and path.tmp takes its place. A start interrupted
// at any step finds the log at path and starts over, or finds it moved
// and the new database complete, and finishes.
func migrateLog(path string, opts Options) error {
	old, tmp := path+".wal", path+".tmp"
	logs, snaps, err := wal.Files(path)
	if os.IsNotExist(err) || (err == nil && len(logs) == 0 && len(snaps) == 0) {
		if _, err := os.Stat(path); os.IsNotExist(err) && exists(old) && exists(tmp) {
			if err := os.Rename(tmp, path); err != nil {
				return err
			}
			return wal.SyncDir(filepath.Dir(path))
		}
		return nil
	}
	if err != nil {
		return err
	}
	lock, err := flockDir(path, opts.Timeout)
	if err != nil {
		return err
	}
	defer lock.Close()
	jobs, err := readLog(path, opts.Now())
	if err != nil {
		return err
	}
	if err := os.RemoveAll(tmp); err != nil {
		return err
	}
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return err
	}
	db, dbLock, err := openDB(tmp, opts)
	if err != nil {
		return err
	}
	defer dbLock.Close()
	if err := importJobs(db, jobs); err != nil {
		db.Close()
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	if err := os.Rename(path, old); err != nil {
		return err
	}
	if err := wal.SyncDir(filepath.Dir(path)); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	return wal.SyncDir(filepath.Dir(path))
}

// importJobs writes jobs, none of them (nor their keys) in db yet, with
// their index entries, a thousand to a batch. Of two jobs of one key,
// which no ledger keeps, the newer (by id) is written.
func importJobs(db *pebble.DB, jobs []*ledger.Job) error {
	newest := make(map[string]*ledger.Job, len(jobs))
	for _, j := range jobs {
		id := string(identityKey(j.OwnerHash, j.KeyHash))
		if o := newest[id]; o == nil || o.ID < j.ID {
			newest[id] = j
		}
	}
	for len(jobs) > 0 {
		n := min(len(jobs), 1000)
		b := db.NewBatch()
		for _, j := range jobs[:n] {
			identity := identityKey(j.OwnerHash, j.KeyHash)
			if newest[string(identity)] == j {
				create(b, identity, j)
			}
		}
		if err := write(b); err != nil {
			return err
		}
		jobs = jobs[n:]
	}
	return nil
}

// Import stores whole jobs as they are, none of them (nor their keys) in
// the ledger yet: for a tool that fills a ledger no gateway is using (the
// benchmark's sweep), a thousand jobs to a durable write.
func (l *Ledger) Import(jobs []*ledger.Job) error {
	done, err := l.open()
	if err != nil {
		return err
	}
	defer done()
	return importJobs(l.db, jobs)
}

// Settle rewrites the whole store as Pebble's background compactions
// leave it once they have caught up: a ledger that grew over days. After
// an Import of millions of jobs, which outruns them, reads would otherwise
// search many overlapping tables while the compactions go on. The
// benchmark's sweep runs it after its Import, as it runs VACUUM on
// PostgreSQL.
func (l *Ledger) Settle(ctx context.Context) error {
	done, err := l.open()
	if err != nil {
		return err
	}
	defer done()
	if err := l.db.Compact(ctx, []byte{0}, []byte{0xff}, true); err != nil {
		return fmt.Errorf("file ledger: %w", err)
	}
	return nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readLog reads the jobs of a log directory: the last snapshot, then the
// segments written since, in order, each job's record in place of the job
// of the same id or the same key, and a removal taking its job out; the
// jobs whose retention ended by now are left out.
func readLog(dir string, now time.Time) ([]*ledger.Job, error) {
	logs, snaps, err := wal.Files(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	next := uint64(firstSegment)
	if len(snaps) > 0 {
		next = snaps[len(snaps)-1]
		names = append(names, wal.Name("snap", next))
	}
	for _, seq := range logs {
		if seq >= next {
			names = append(names, wal.Name("log", seq))
		}
	}
	byID := map[string]*ledger.Job{}
	byKey := map[string]string{} // identity key → id
	drop := func(id string) {
		if j := byID[id]; j != nil {
			delete(byKey, string(identityKey(j.OwnerHash, j.KeyHash)))
			delete(byID, id)
		}
	}
	for _, name := range names {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			return nil, err
		}
		_, err = wal.Read(f, func(kind byte, payload []byte) error {
			switch kind {
			case kindPut:
				j, err := record.Decode(bytes.Clone(payload)) // a job may share its record
				if err != nil {
					return err
				}
				key := string(identityKey(j.OwnerHash, j.KeyHash))
				drop(j.ID)
				drop(byKey[key])
				if !j.Expired(now) {
					byID[j.ID], byKey[key] = j, j.ID
				}
				return nil
			case kindDelete:
				drop(string(payload))
				return nil
			}
			return fmt.Errorf("record of unknown kind %d", kind)
		})
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return slices.Collect(maps.Values(byID)), nil
}
