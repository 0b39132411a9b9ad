//go:build unix

package file

import "syscall"

// openFilesLimit is the number of files the process may hold open (its
// soft limit, which Go raises to the hard one at start), or 0 if unknown.
func openFilesLimit() uint64 {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0
	}
	return l.Cur
}
