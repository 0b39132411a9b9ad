package ledger

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// NewID returns a new UUIDv7 (RFC 9562) string: ids sort by creation time,
// each after every id made before it in this process.
//
// Ids are made twice for every request, replays included, so this is kept
// cheap: no lock, and the 62 random bits come from math/rand/v2's global
// generator (ChaCha8, seeded by the runtime from the operating system's
// randomness), not from a read of crypto/rand.
func NewID() string {
	var u [16]byte
	t := nextIDTime()
	// 48 bits of milliseconds, the version, then 12 bits of the
	// millisecond's fraction (RFC 9562, section 6.2, method 3), one more
	// than the last id's when the clock has not moved on.
	binary.BigEndian.PutUint64(u[:8], t>>12<<16|0x7000|t&0xfff)
	binary.BigEndian.PutUint64(u[8:], rand.Uint64()>>2|0x8000000000000000) // variant 10
	var s [36]byte
	hex.Encode(s[0:8], u[0:4])
	hex.Encode(s[9:13], u[4:6])
	hex.Encode(s[14:18], u[6:8])
	hex.Encode(s[19:23], u[8:10])
	hex.Encode(s[24:], u[10:])
	s[8], s[13], s[18], s[23] = '-', '-', '-', '-'
	return string(s[:])
}

// lastIDTime is the time of the last id made: milliseconds since the Unix
// epoch shifted left by 12, plus the millisecond's fraction in 4096ths.
var lastIDTime atomic.Uint64

// nextIDTime returns the clock's time in lastIDTime's unit, or the last
// id's plus one if that is not after it (the clock went back, or ids come
// faster than 4096 a millisecond).
func nextIDTime() uint64 {
	ns := uint64(time.Now().UnixNano())
	now := ns/1e6<<12 | ns%1e6*4096/1e6
	for {
		last := lastIDTime.Load()
		next := max(now, last+1)
		if lastIDTime.CompareAndSwap(last, next) {
			return next
		}
	}
}
