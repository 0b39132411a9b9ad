package wal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// readAll returns the payloads of the records of a file, and how many
// bytes they take.
func readAll(t *testing.T, name string) ([]string, int64) {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	n, err := Read(f, func(kind byte, payload []byte) error {
		got = append(got, fmt.Sprintf("%d:%s", kind, payload))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got, n
}

// Concurrent writers each find their record on disk when Sync returns,
// and share flushes.
func TestSyncGroups(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 16, 50
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if err := l.Sync(l.Append(1, fmt.Appendf(nil, "w%d-%d", w, i))); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	got, _ := readAll(t, filepath.Join(dir, Name("log", 1)))
	if len(got) != writers*each {
		t.Fatalf("%d records on disk, want %d", len(got), writers*each)
	}
	if f := l.Flushes(); f > writers*each/2 {
		t.Errorf("%d flushes for %d records: writers waiting for a flush did not share the next", f, writers*each)
	} else {
		t.Logf("%d flushes for %d records", f, writers*each)
	}
}

// A record torn at any byte, or with a byte changed, ends the log there:
// the records before it are read, nothing after.
func TestReadStopsAtTornRecord(t *testing.T) {
	var b []byte
	for i := range 3 {
		b = Append(b, 1, fmt.Appendf(nil, "record %d", i))
	}
	whole := len(b)
	b = Append(b, 2, []byte("the last record"))
	for cut := whole; cut < len(b); cut++ {
		got := 0
		n, err := Read(bytes.NewReader(b[:cut]), func(byte, []byte) error { got++; return nil })
		if err != nil || got != 3 || n != int64(whole) {
			t.Fatalf("cut at %d: %d records, %d bytes, %v; want 3, %d", cut, got, n, err, whole)
		}
	}
	for i := whole; i < len(b); i++ {
		bad := bytes.Clone(b)
		bad[i] ^= 0x40
		got := 0
		n, _ := Read(bytes.NewReader(bad), func(byte, []byte) error { got++; return nil })
		if got != 3 || n != int64(whole) {
			t.Fatalf("byte %d changed: %d records, %d bytes; want 3, %d", i, got, n, whole)
		}
	}
}

// Rotate flushes the segment and appends to the next; snapshots are whole
// by their name.
func TestRotateAndSnapshot(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 7)
	if err != nil {
		t.Fatal(err)
	}
	l.Append(1, []byte("a"))
	seq, err := l.Rotate()
	if err != nil || seq != 8 {
		t.Fatalf("rotate: %d %v, want 8", seq, err)
	}
	if err := l.Sync(l.Append(1, []byte("b"))); err != nil {
		t.Fatal(err)
	}
	err = WriteSnapshot(dir, seq, func(put func(byte, []byte) error) error { return put(1, []byte("a")) })
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	logs, snaps, err := Files(dir)
	if err != nil || fmt.Sprint(logs, snaps) != "[7 8] [8]" {
		t.Fatalf("files: %v %v %v", logs, snaps, err)
	}
	for name, want := range map[string]string{Name("log", 7): "[1:a]", Name("log", 8): "[1:b]", Name("snap", 8): "[1:a]"} {
		if got, _ := readAll(t, filepath.Join(dir, name)); fmt.Sprint(got) != want {
			t.Errorf("%s: %v, want %s", name, got, want)
		}
	}
}

// A failed flush fails every later Sync: nothing after it is acknowledged.
func TestFailedFlushIsFinal(t *testing.T) {
	l, err := Open(t.TempDir(), 1)
	if err != nil {
		t.Fatal(err)
	}
	l.f.Close() // the next write fails
	if err := l.Sync(l.Append(1, []byte("x"))); err == nil {
		t.Fatal("a write to a closed file was acknowledged")
	}
	if err := l.Sync(l.Append(1, []byte("y"))); err == nil {
		t.Fatal("a write after a failed flush was acknowledged")
	}
}

// A segment is written with zeros ahead of its records; read as a crash
// leaves it (not closed), it holds its records and ends where the zeros
// start.
func TestZerosAhead(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(dir, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 3 {
		if err := l.Sync(l.Append(1, fmt.Appendf(nil, "r%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	name := filepath.Join(dir, Name("log", 1))
	got, n := readAll(t, name)
	st, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[1:r0 1:r1 1:r2]" || n != l.Size() || st.Size() < chunk {
		t.Fatalf("records %v in %d bytes of %d (log size %d); want 3 records and zeros after them", got, n, st.Size(), l.Size())
	}
}
