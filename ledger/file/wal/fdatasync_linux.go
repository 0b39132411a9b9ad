package wal

import (
	"os"
	"syscall"
)

// fdatasync flushes f's data and what reading it back needs (its size),
// not its other metadata.
func fdatasync(f *os.File) error {
	for {
		err := syscall.Fdatasync(int(f.Fd()))
		if err != syscall.EINTR {
			return err
		}
	}
}
