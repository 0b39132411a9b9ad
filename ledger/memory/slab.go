package memory

import (
	"hash/maphash"
	"iter"
	"strings"
)

// The jobs are held so that the garbage collector has little to follow,
// however many there are: the entries sit in chunks (a chunk is one object
// to mark, and a settled entry holds one pointer, to its record), and the
// maps from a job's identity and id to its entry hold numbers, which the
// collector does not scan. With the entries as objects of their own and
// the maps holding strings and pointers, a collection with 200,000 jobs
// held took about three times as long (BenchmarkHeldJobsGC).

// chunkEntries is the number of entries in a chunk.
const chunkEntries = 1024

// slab holds entries at fixed places, numbered from 0: a chunk is never
// moved, so a pointer to an entry stays valid while the entry is held,
// and a removed entry's place goes to the next new one.
type slab struct {
	chunks [][]entry
	next   uint32   // entries ever placed
	free   []uint32 // places of removed entries
}

// place returns a zero entry at a free place, numbered.
func (s *slab) place() *entry {
	var n uint32
	if k := len(s.free); k > 0 {
		n, s.free = s.free[k-1], s.free[:k-1]
	} else {
		if s.next%chunkEntries == 0 {
			s.chunks = append(s.chunks, make([]entry, chunkEntries))
		}
		n, s.next = s.next, s.next+1
	}
	e := s.at(n)
	e.place = n
	return e
}

func (s *slab) at(n uint32) *entry { return &s.chunks[n/chunkEntries][n%chunkEntries] }

// release clears the entry, dropping what it pointed to, and frees its
// place. Strings read from the entry (key, id) change with the place's
// next entry: a caller keeps a copy.
func (s *slab) release(e *entry) {
	n := e.place
	*e = entry{}
	s.free = append(s.free, n)
}

// held reports whether the place holds an entry: an entry's identity is
// never empty (it holds at least the separator of owner and key).
func (s *slab) held(n uint32) bool { return n < s.next && s.at(n).keyLen > 0 }

// sparse reports whether the slab has a chunk's worth of free places and
// as many free as held: time to shrink it (Ledger.shrink).
func (s *slab) sparse() bool {
	free := uint32(len(s.free))
	return free >= chunkEntries && 2*free >= s.next
}

// table finds an entry by a string of its own (its identity, or its id) by
// the string's 64-bit hash, and checks that the entry holds that string; a
// string whose hash another entry's string already has (rare: the hash is
// seeded at random per ledger) is kept in a map by itself.
type table struct {
	name   func(*entry) string
	hash   func(string) uint64
	hashed map[uint64]uint32
	clash  map[string]uint32
}

func newTable(name func(*entry) string) table {
	seed := maphash.MakeSeed()
	return table{
		name:   name,
		hash:   func(s string) uint64 { return maphash.String(seed, s) },
		hashed: make(map[uint64]uint32),
		clash:  make(map[string]uint32),
	}
}

// get returns the entry named k, or nil.
func (t *table) get(s *slab, k string) *entry {
	if n, ok := t.hashed[t.hash(k)]; ok {
		if e := s.at(n); t.name(e) == k {
			return e
		}
	}
	if len(t.clash) > 0 {
		if n, ok := t.clash[k]; ok {
			return s.at(n)
		}
	}
	return nil
}

// put names e by its string, in place of the entry of that name, if any.
func (t *table) put(s *slab, e *entry) {
	k := t.name(e)
	h := t.hash(k)
	if n, ok := t.hashed[h]; ok && n != e.place && t.name(s.at(n)) != k {
		t.clash[strings.Clone(k)] = e.place
		return
	}
	delete(t.clash, k) // a clash named k before is replaced
	t.hashed[h] = e.place
}

// remove forgets e's name, if it names e.
func (t *table) remove(e *entry) {
	k := t.name(e)
	h := t.hash(k)
	if n, ok := t.hashed[h]; ok && n == e.place {
		delete(t.hashed, h)
		return
	}
	if n, ok := t.clash[k]; ok && n == e.place {
		delete(t.clash, k)
	}
}

func (t *table) len() int { return len(t.hashed) + len(t.clash) }

// all yields every entry named.
func (t *table) all(s *slab) iter.Seq[*entry] {
	return func(yield func(*entry) bool) {
		for _, n := range t.hashed {
			if !yield(s.at(n)) {
				return
			}
		}
		for _, n := range t.clash {
			if !yield(s.at(n)) {
				return
			}
		}
	}
}
