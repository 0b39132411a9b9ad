package file

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/file/wal"
	"github.com/onejob/onejob/ledger/internal/record"
	"github.com/onejob/onejob/ledger/memory"
)

func testParams(key string) ledger.ReserveParams {
	return ledger.ReserveParams{OwnerHash: []byte("o"), KeyHash: []byte(key), Fingerprint: []byte("f-" + key), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NextAttempt{Provider: "p", Lease: time.Hour}}
}

// someJobs makes n jobs in m, completed with answer "answer <i>" but
// every fourth, left pending, and returns them.
func someJobs(t *testing.T, m ledger.Ledger, n int) []*ledger.Job {
	t.Helper()
	ctx := context.Background()
	var jobs []*ledger.Job
	for i := range n {
		r, err := m.Reserve(ctx, testParams(fmt.Sprint("k", i)).WithNewIDs())
		if err != nil {
			t.Fatal(err)
		}
		if i%4 != 3 {
			body := fmt.Appendf(nil, "answer %d", i)
			if _, err := m.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 201, Body: body, Size: int64(len(body)), Stored: true}); err != nil {
				t.Fatal(err)
			}
		}
		j, err := m.Job(ctx, r.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	return jobs
}

// checkJobs checks that l holds jobs as someJobs made them: completed ones
// replay their answer, pending ones are in flight.
func checkJobs(t *testing.T, l ledger.Ledger, jobs []*ledger.Job) {
	t.Helper()
	for i, j := range jobs {
		r, err := l.Reserve(context.Background(), testParams(fmt.Sprint("k", i)).WithNewIDs())
		want := ledger.Done
		if i%4 == 3 {
			want = ledger.InFlight
		}
		if err != nil || r.Outcome != want || r.Job.ID != j.ID {
			t.Fatalf("job %d: %v %v, want %v of %s", i, r.Outcome, err, want, j.ID)
		}
		if want == ledger.Done && string(r.Job.Response.Body) != fmt.Sprintf("answer %d", i) {
			t.Fatalf("job %d replays %q", i, r.Job.Response.Body)
		}
	}
}

// writeBolt writes jobs as the earlier releases' file held them: by id in
// bucket "jobs", as records, the first one as the first releases' JSON.
func writeBolt(t *testing.T, path string, jobs []*ledger.Job) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucket(boltJobs)
		if err != nil {
			return err
		}
		for _, name := range []string{"keys", "expiry", "leases"} {
			if _, err := tx.CreateBucket([]byte(name)); err != nil {
				return err
			}
		}
		for i, j := range jobs {
			v := record.Encode(j)
			if i == 0 {
				if v, err = json.Marshal(j); err != nil {
					return err
				}
			}
			if err := b.Put([]byte(j.ID), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// A ledger file of the earlier releases (bbolt) is migrated at the first
// start: every job is there, and stays there once the directory is
// opened again; the old file is kept beside it.
func TestMigratesBoltFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	jobs := someJobs(t, memory.New(), 40)
	writeBolt(t, path, jobs)
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkJobs(t, l, jobs)
	l.Close()
	if st, err := os.Stat(path); err != nil || !st.IsDir() {
		t.Fatalf("%s after the migration: %v", path, err)
	}
	if _, err := os.Stat(path + ".bbolt"); err != nil {
		t.Fatalf("the earlier file is not kept: %v", err)
	}
	if l, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkJobs(t, l, jobs)
}

// A migration interrupted after the file was renamed (the new directory
// half written, or not at all) starts over from the renamed file.
func TestMigrationResumes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	jobs := someJobs(t, memory.New(), 12)
	writeBolt(t, path+".bbolt", jobs)
	if err := os.Mkdir(path+".tmp", 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(path+".tmp", wal.Name("snap", 1)+".tmp"), []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkJobs(t, l, jobs)
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the half-written directory is left: %v", err)
	}
}

// writeLog writes jobs as the previous release's directory held them: a
// snapshot of the first half as of segment 2, then segment 2 with the
// rest, a job removed (purged) and the first job written again; segment
// 1, which the snapshot replaced, holds a job that must not come back.
func writeLog(t *testing.T, dir string, jobs []*ledger.Job, purged *ledger.Job) {
	t.Helper()
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	half := len(jobs) / 2
	err := wal.WriteSnapshot(dir, 2, func(put func(kind byte, payload []byte) error) error {
		for _, j := range jobs[:half] {
			if err := put(kindPut, record.Encode(j)); err != nil {
				return err
			}
		}
		return put(kindPut, record.Encode(purged))
	})
	if err != nil {
		t.Fatal(err)
	}
	old, err := wal.Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	gone := testParams("replaced by the snapshot")
	gone.JobID = ledger.NewID()
	old.Append(kindPut, record.Encode(&ledger.Job{ID: gone.JobID, OwnerHash: gone.OwnerHash, KeyHash: gone.KeyHash, State: ledger.JobPending}))
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	log, err := wal.Open(dir, 2)
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, j := range jobs[half:] {
		n = log.Append(kindPut, record.Encode(j))
	}
	log.Append(kindDelete, []byte(purged.ID))
	n = log.Append(kindPut, record.Encode(jobs[0]))
	if err := log.Sync(n); err != nil {
		t.Fatal(err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
}

// A ledger directory of the previous release (a log and a snapshot) is
// migrated at the first start: every job is there as the log left it,
// what the log removed is not, and the old directory is kept beside the
// new one; a start interrupted once the directory moved aside finishes
// the move.
func TestMigratesLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	m := memory.New()
	jobs := someJobs(t, m, 40)
	purgedP := testParams("purged")
	r, err := m.Reserve(context.Background(), purgedP.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	writeLog(t, path, jobs, r.Job)
	l, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	checkJobs(t, l, jobs)
	if _, err := l.Find(context.Background(), purgedP.OwnerHash, purgedP.KeyHash); err != ledger.ErrNotFound {
		t.Errorf("the job the log removed: %v", err)
	}
	if _, err := l.Find(context.Background(), purgedP.OwnerHash, []byte("replaced by the snapshot")); err != ledger.ErrNotFound {
		t.Errorf("a job of a segment the snapshot replaced: %v", err)
	}
	if n := checkStore(t, l, func(*testing.T, []byte) {}); n != len(jobs) {
		t.Errorf("%d jobs migrated, want %d", n, len(jobs))
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if logs, snaps, err := wal.Files(path + ".wal"); err != nil || len(logs) != 2 || len(snaps) != 1 {
		t.Fatalf("the previous release's directory is not kept: %v %v %v", logs, snaps, err)
	}

	// Interrupted after the log moved aside: the new database is whole
	// in path.tmp, and nothing is at path.
	if err := os.Rename(path, path+".tmp"); err != nil {
		t.Fatal(err)
	}
	if l, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkJobs(t, l, jobs)
	if _, err := os.Stat(path + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("the new database is left in path.tmp: %v", err)
	}
}
