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

// When the log outgrows the last snapshot, a snapshot replaces it: the
// directory keeps one snapshot and the log after it, and a restart reads
// every job from them, with the jobs removed since left out.
func TestCompaction(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ledger.db")
	ctx := context.Background()
	l, err := Open(path, Options{CompactAt: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	jobs := someJobs(t, l, 400)
	purged := testParams("purged")
	purged.OwnerHash = []byte("another owner")
	r, err := l.Reserve(ctx, purged.WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Stored: true, Body: []byte{}}); err != nil {
		t.Fatal(err)
	}
	if st, err := l.Purge(ctx, purged.OwnerHash); err != nil || st.Removed != 1 {
		t.Fatalf("purge: %+v %v", st, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	logs, snaps, err := wal.Files(path)
	if err != nil || len(snaps) != 1 || len(logs) == 0 || logs[0] < snaps[0] {
		t.Fatalf("after compactions: segments %v, snapshots %v (%v); want one snapshot and the segments after it", logs, snaps, err)
	}
	t.Logf("segments %v, snapshot %v", logs, snaps)
	if l, err = Open(path, Options{}); err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkJobs(t, l, jobs)
	if _, err := l.Find(ctx, purged.OwnerHash, purged.KeyHash); err != ledger.ErrNotFound {
		t.Fatalf("the purged job after a restart: %v", err)
	}
}
