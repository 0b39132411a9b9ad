package proxy

import (
	"crypto/hmac"
	"crypto/sha256"
	"errors"
)

// MaxKeyLength is the longest idempotency key accepted, in bytes.
const MaxKeyLength = 255

var (
	errKeyEmpty   = errors.New("the idempotency key is empty")
	errKeyLong    = errors.New("the idempotency key is longer than 255 bytes")
	errKeyChars   = errors.New("the idempotency key must be visible ASCII (0x21-0x7E)")
	errKeyQuoting = errors.New("the idempotency key is not a valid structured-field string")
)

// ParseKey returns the idempotency key a header value carries: the content
// of an RFC 8941 string ("abc"), or a bare value (abc) as is. The result is
// 1 to 255 bytes of visible ASCII.
func ParseKey(v string) (string, error) {
	if len(v) > 0 && v[0] == '"' {
		var err error
		if v, err = unquote(v); err != nil {
			return "", err
		}
	}
	switch {
	case len(v) == 0:
		return "", errKeyEmpty
	case len(v) > MaxKeyLength:
		return "", errKeyLong
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return "", errKeyChars
		}
	}
	return v, nil
}

// unquote decodes an RFC 8941 sf-string: DQUOTE *chr DQUOTE, where a chr is
// printable ASCII other than DQUOTE and backslash, or an escaped DQUOTE or
// backslash.
func unquote(v string) (string, error) {
	if len(v) < 2 || v[len(v)-1] != '"' {
		return "", errKeyQuoting
	}
	in := v[1 : len(v)-1]
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); i++ {
		c := in[i]
		switch {
		case c == '\\':
			i++
			if i == len(in) || (in[i] != '"' && in[i] != '\\') {
				return "", errKeyQuoting
			}
			out = append(out, in[i])
		case c == '"' || c < 0x20 || c > 0x7e:
			return "", errKeyQuoting
		default:
			out = append(out, c)
		}
	}
	return string(out), nil
}

// Hasher turns owners and keys into the hashes the ledger stores: HMAC-SHA-256
// with the owner secret when one is set, else SHA-256. Owners and keys are
// never stored in clear.
type Hasher struct {
	secret []byte
}

// NewHasher returns a Hasher keyed by secret (empty: plain SHA-256).
func NewHasher(secret []byte) Hasher { return Hasher{secret: secret} }

func (h Hasher) sum(domain, value string) []byte {
	if len(h.secret) > 0 {
		m := hmac.New(sha256.New, h.secret)
		m.Write([]byte(domain))
		m.Write([]byte{0})
		m.Write([]byte(value))
		return m.Sum(nil)
	}
	// The same bytes through SHA-256, in one buffer: most keys and owners
	// are short enough for it to stay on the stack.
	buf := make([]byte, 0, 256)
	buf = append(append(append(buf, domain...), 0), value...)
	sum := sha256.Sum256(buf)
	return sum[:]
}

// Owner returns the stored hash of an owner.
func (h Hasher) Owner(owner string) []byte { return h.sum("onejob-owner", owner) }

// Key returns the stored hash of an idempotency key.
func (h Hasher) Key(key string) []byte { return h.sum("onejob-key", key) }
