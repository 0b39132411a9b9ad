//go:build cgo && linux

// Package cmem leaves memory free inside C's allocator, as Pebble's cache
// does under load, for the file ledger's tests of its trimming.
package cmem

/*
#include <stdlib.h>
#include <string.h>

// hold allocates n blocks of size bytes, touched, and frees all but every
// 64th, which it returns in kept: the freed blocks stay in the arena,
// between blocks still in use, where only a trim returns their pages.
static void hold(int n, int size, void **kept) {
	void **all = malloc(n * sizeof(void *));
	for (int i = 0; i < n; i++) {
		all[i] = malloc(size);
		memset(all[i], 1, size);
	}
	for (int i = 0; i < n; i++) {
		if (i % 64 == 63) {
			kept[i / 64] = all[i];
		} else {
			free(all[i]);
		}
	}
	free(all);
}
*/
import "C"

import "unsafe"

// Blocks are C memory kept in use by Hold.
type Blocks []unsafe.Pointer

// Hold allocates about n*size bytes with C's malloc on the calling thread
// and frees all of it but one block in 64, which it returns.
func Hold(n, size int) Blocks {
	kept := make([]unsafe.Pointer, n/64)
	if len(kept) == 0 {
		return nil
	}
	p := C.malloc(C.size_t(len(kept)) * C.size_t(unsafe.Sizeof(unsafe.Pointer(nil))))
	defer C.free(p)
	C.hold(C.int(n), C.int(size), (*unsafe.Pointer)(p))
	copy(kept, unsafe.Slice((*unsafe.Pointer)(p), len(kept)))
	return kept
}

// Free frees the blocks.
func (b Blocks) Free() {
	for _, p := range b {
		C.free(p)
	}
}
