//go:build !cgo || !linux

package file

// Without cgo Pebble allocates in the Go heap, and elsewhere than Linux
// the C allocator is not glibc's: nothing to trim (malloc_cgo.go).
func trimMalloc() {}
