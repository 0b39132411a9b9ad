package file

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"
)

func TestGroupCommit(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "group.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	g := &groupCommit{db: db}
	if err := g.do(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	errBad := errors.New("bad write")
	const n = 200
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = g.do(func(tx *bolt.Tx) error {
				switch i % 50 {
				case 7:
					return errBad // fails itself, not the others of its group
				case 9:
					panic("a write that panics")
				}
				return tx.Bucket([]byte("b")).Put(fmt.Appendf(nil, "k%03d", i), []byte("v"))
			})
		}()
	}
	wg.Wait()
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("b"))
		for i := range n {
			got := b.Get(fmt.Appendf(nil, "k%03d", i))
			switch i % 50 {
			case 7:
				if !errors.Is(errs[i], errBad) || got != nil {
					t.Errorf("write %d: %v, stored %q; want its own error and nothing stored", i, errs[i], got)
				}
			case 9:
				if errs[i] == nil || got != nil {
					t.Errorf("write %d panicked: %v, stored %q; want an error and nothing stored", i, errs[i], got)
				}
			default:
				if errs[i] != nil || string(got) != "v" {
					t.Errorf("write %d: %v, stored %q", i, errs[i], got)
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
