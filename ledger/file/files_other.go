//go:build !unix

package file

import (
	"io"
	"time"
)

// openFilesLimit is unknown here (files_unix.go).
func openFilesLimit() uint64 { return 0 }

// flockDir takes the lock on a previous release's directory. That release
// ran on Unix only (files_unix.go): here Pebble's lock on the same file
// keeps two processes of this release from migrating it at once.
func flockDir(dir string, timeout time.Duration) (io.Closer, error) { return lockDir(dir, timeout) }
