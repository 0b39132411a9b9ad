package cache

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"hash"
	"slices"
	"time"

	"github.com/onejob/onejob/ledger"
)

// entryFormat is the first byte of every cache value. A value with another
// first byte (an older or newer gateway's, or anything else) is a miss.
// Format 2 added the fingerprint's scheme.
const entryFormat byte = 2

// sumSize is the length of the integrity check that follows the format byte.
const sumSize = sha256.Size

// Errors of decode. They only ever turn a lookup into a miss.
var (
	errFormat    = errors.New("cache entry: unknown format")
	errIntegrity = errors.New("cache entry: integrity check failed")
	errCorrupt   = errors.New("cache entry: malformed")
)

// newMAC returns the integrity hash of entries: HMAC-SHA-256 under secret
// when one is set, else plain SHA-256.
func newMAC(secret []byte) func() hash.Hash {
	if len(secret) == 0 {
		return sha256.New
	}
	secret = bytes.Clone(secret)
	return func() hash.Hash { return hmac.New(sha256.New, secret) }
}

// encode returns the cache value of a completed job whose answer is stored:
//
//	format byte | SHA-256 (or HMAC) of format byte and payload | payload
//
// The payload holds the job's identity (owner hash, key hash, fingerprint,
// its version and scheme), the fields a replay shows, and the response.
func encode(j *ledger.Job, mac func() hash.Hash) []byte {
	var p []byte
	p = appendBytes(p, j.OwnerHash)
	p = appendBytes(p, j.KeyHash)
	p = appendBytes(p, j.Fingerprint)
	p = binary.AppendVarint(p, int64(j.FingerprintVersion))
	p = appendBytes(p, []byte(j.FingerprintScheme))
	p = appendBytes(p, []byte(j.ID))
	p = appendBytes(p, []byte(j.State))
	p = binary.AppendVarint(p, j.Version)
	p = appendBytes(p, []byte(j.CompletedBy))
	p = binary.AppendVarint(p, int64(j.Retention))
	p = appendTime(p, j.CreatedAt)
	p = appendTime(p, j.CompletedAt)
	p = appendTime(p, j.ExpiresAt)
	r := j.Response
	p = binary.AppendVarint(p, int64(r.Status))
	names := make([]string, 0, len(r.Header))
	for name := range r.Header {
		names = append(names, name)
	}
	slices.Sort(names)
	p = binary.AppendUvarint(p, uint64(len(names)))
	for _, name := range names {
		p = appendBytes(p, []byte(name))
		p = binary.AppendUvarint(p, uint64(len(r.Header[name])))
		for _, v := range r.Header[name] {
			p = appendBytes(p, []byte(v))
		}
	}
	p = appendBytes(p, r.Body)
	p = binary.AppendVarint(p, r.Size)
	stored := byte(0)
	if r.Stored {
		stored = 1
	}
	p = append(p, stored)

	out := make([]byte, 1+sumSize, 1+sumSize+len(p))
	out[0] = entryFormat
	h := mac()
	h.Write(out[:1])
	h.Write(p)
	h.Sum(out[1:1])
	return append(out, p...)
}

// decode checks a cache value's format and integrity and returns the job it
// holds. It never trusts the value beyond that: the caller still compares
// its identity and expiry with the request's.
func decode(b []byte, mac func() hash.Hash) (*ledger.Job, error) {
	if len(b) < 1+sumSize || b[0] != entryFormat {
		return nil, errFormat
	}
	h := mac()
	h.Write(b[:1])
	h.Write(b[1+sumSize:])
	if !hmac.Equal(h.Sum(nil), b[1:1+sumSize]) {
		return nil, errIntegrity
	}
	d := decoder{b: b[1+sumSize:]}
	j := &ledger.Job{
		OwnerHash:          d.bytes(),
		KeyHash:            d.bytes(),
		Fingerprint:        d.bytes(),
		FingerprintVersion: int(d.varint()),
		FingerprintScheme:  string(d.bytes()),
		ID:                 string(d.bytes()),
		State:              ledger.JobState(d.bytes()),
		Version:            d.varint(),
		CompletedBy:        string(d.bytes()),
		Retention:          time.Duration(d.varint()),
		CreatedAt:          d.time(),
		CompletedAt:        d.time(),
		ExpiresAt:          d.time(),
	}
	r := &ledger.Response{Status: int(d.varint())}
	if n := d.uvarint(); n > 0 && d.err == nil {
		if n > uint64(len(d.b)) {
			return nil, errCorrupt
		}
		r.Header = make(map[string][]string, n)
		for range n {
			name := string(d.bytes())
			m := d.uvarint()
			if m > uint64(len(d.b)) || d.err != nil {
				return nil, errCorrupt
			}
			vs := make([]string, 0, m)
			for range m {
				vs = append(vs, string(d.bytes()))
			}
			r.Header[name] = vs
		}
	}
	r.Body = d.bytes()
	r.Size = d.varint()
	switch d.byte() {
	case 0:
	case 1:
		r.Stored = true
	default:
		return nil, errCorrupt
	}
	if d.err != nil || len(d.b) != 0 {
		return nil, errCorrupt
	}
	j.Response = r
	return j, nil
}

func appendBytes(p, b []byte) []byte {
	p = binary.AppendUvarint(p, uint64(len(b)))
	return append(p, b...)
}

// appendTime encodes t as nanoseconds since the Unix epoch; the zero time
// as 0.
func appendTime(p []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(p, 0)
	}
	return binary.AppendVarint(p, t.UnixNano())
}

// decoder reads a payload; after the first error every read returns zero
// values and err stays set.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errCorrupt
		return 0
	}
	d.b = d.b[n:]
	return v
}

// bytes returns a length-prefixed field, never nil once read.
func (d *decoder) bytes() []byte {
	n := d.uvarint()
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.err = errCorrupt
		return nil
	}
	v := bytes.Clone(d.b[:n])
	if v == nil {
		v = []byte{}
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if d.err != nil {
		return 0
	}
	if len(d.b) == 0 {
		d.err = errCorrupt
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) time() time.Time {
	ns := d.varint()
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
