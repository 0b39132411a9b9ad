package file

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger/file/wal"
	"github.com/onejob/onejob/ledger/internal/record"
)

// The releases before the log kept the ledger in one bbolt file at the
// ledger's path: its bucket "jobs" mapped each job id to the job's record
// (see package record); the other buckets were indexes of it.
var boltJobs = []byte("jobs")

// migrate turns a ledger file of the earlier releases at path into a
// ledger directory at the same path. The file is first renamed to
// path.bbolt, then read into a snapshot in path.tmp, which is renamed to
// path: a start interrupted at any step finds either the file or the
// renamed file and starts over from there. path.bbolt is kept, for an
// operator to remove once the new release is trusted.
func migrate(path string, timeout time.Duration) error {
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
