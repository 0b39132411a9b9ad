//go:build unix

package file

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// openFilesLimit is the number of files the process may hold open (its
// soft limit, which Go raises to the hard one at start), or 0 if unknown.
func openFilesLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	return l.Cur
}

// flockDir takes the lock the previous release held on its directory (a
// flock, not Pebble's lock), waiting up to timeout for a process of that
// release to let it go.
func flockDir(dir string, timeout time.Duration) (io.Closer, error) {
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
