//go:build cgo && linux

package file

/*
#include <stdlib.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

static void trim(void) {
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}
*/
import "C"

// trimMalloc returns to the system the pages C's allocator holds free.
//
// Pebble keeps its block cache and memtables outside the Go heap, with C's
// malloc. glibc gives each thread that allocates an arena of its own (up
// to eight a core), and a block freed in one arena serves no allocation in
// another: under a gateway's load the cache's churn left about 100 MiB
// free but resident across the arenas, more than the cache itself, until
// something returns it (docs/performance-history.md). Go's own memory does not
// use malloc.
func trimMalloc() { C.trim() }
