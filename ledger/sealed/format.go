package sealed

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/onejob/onejob/ledger"
)

// The formats of sealed values. Each starts with a marker that names the
// format's version and is followed by the id of the key that sealed it:
//
//	body:   "\x00onejob:sealed:1:" <key id> ":" nonce | ciphertext | tag
//	header: {"Onejob-Sealed": ["1:" <key id> ":" base64(nonce | ciphertext | tag)]}
//
// where the sealed header is the JSON of the whole header map. A body
// without the marker, or a header map that is not that one entry, was
// stored in clear (before encryption was turned on) and is returned as it
// is. Each value is bound to its job and part (the associated data), so
// that a sealed body copied onto another job, or into the header, does
// not open.
const (
	bodyMarker   = "\x00onejob:sealed:1:"
	headerPrefix = "1:"
	// HeaderName is the one header a sealed header map holds.
	HeaderName = "Onejob-Sealed"
)

// aad is the associated data of part ("header", "body") of job id's
// answer sealed with key kid.
func aad(part, jobID, kid string) []byte {
	return []byte("onejob:sealed:1\x00" + part + "\x00" + jobID + "\x00" + kid)
}

// sealBody returns body sealed for job jobID; an empty body stays empty.
func (k *Keyring) sealBody(jobID string, body []byte) []byte {
	if len(body) == 0 {
		return body
	}
	out := append([]byte(bodyMarker+k.sealID+":"), k.seal(body, aad("body", jobID, k.sealID))...)
	return out
}

// openBody reverses sealBody; a body in clear is returned as it is.
func (k *Keyring) openBody(jobID string, body []byte) ([]byte, error) {
	rest, ok := bytes.CutPrefix(body, []byte(bodyMarker))
	if !ok {
		return body, nil
	}
	kid, sealed, ok := bytes.Cut(rest, []byte(":"))
	if !ok {
		return nil, ErrOpen
	}
	return k.open(string(kid), sealed, aad("body", jobID, string(kid)))
}

// sealHeader returns h sealed for job jobID, as a header map of one
// entry; an empty map stays as it is.
func (k *Keyring) sealHeader(jobID string, h map[string][]string) (map[string][]string, error) {
	if len(h) == 0 {
		return h, nil
	}
	plain, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	v := headerPrefix + k.sealID + ":" + base64.RawStdEncoding.EncodeToString(k.seal(plain, aad("header", jobID, k.sealID)))
	return map[string][]string{HeaderName: {v}}, nil
}

// openHeader reverses sealHeader; a header in clear is returned as it is.
func (k *Keyring) openHeader(jobID string, h map[string][]string) (map[string][]string, error) {
	if !sealedHeader(h) {
		return h, nil
	}
	kid, enc, ok := strings.Cut(h[HeaderName][0][len(headerPrefix):], ":")
	if !ok {
		return nil, ErrOpen
	}
	sealed, err := base64.RawStdEncoding.DecodeString(enc)
	if err != nil {
		return nil, ErrOpen
	}
	plain, err := k.open(kid, sealed, aad("header", jobID, kid))
	if err != nil {
		return nil, err
	}
	var out map[string][]string
	if err := json.Unmarshal(plain, &out); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrOpen, err)
	}
	return out, nil
}

// SealResponse returns a copy of r, the answer of job jobID, with its
// header and body sealed; status, size and stored stay in clear.
func (k *Keyring) SealResponse(jobID string, r *ledger.Response) (*ledger.Response, error) {
	if r == nil {
		return nil, nil
	}
	c := *r
	var err error
	if c.Header, err = k.sealHeader(jobID, r.Header); err != nil {
		return nil, err
	}
	c.Body = k.sealBody(jobID, r.Body)
	return &c, nil
}

// OpenResponse returns a copy of r, the answer of job jobID, with its
// header and body opened, or r itself when neither is sealed.
func (k *Keyring) OpenResponse(jobID string, r *ledger.Response) (*ledger.Response, error) {
	if r == nil {
		return nil, nil
	}
	h, err := k.openHeader(jobID, r.Header)
	if err != nil {
		return nil, fmt.Errorf("job %s: header: %w", jobID, err)
	}
	b, err := k.openBody(jobID, r.Body)
	if err != nil {
		return nil, fmt.Errorf("job %s: body: %w", jobID, err)
	}
	if !Sealed(r) {
		return r, nil
	}
	c := *r
	c.Header, c.Body = h, b
	if c.Stored && len(b) != len(r.Body) {
		// A ledger that counts a whole stored body's size itself (an
		// operator's answer) counted the sealed one.
		c.Size = int64(len(b))
	}
	return &c, nil
}

// Sealed reports whether r's header or body is sealed (by any key).
func Sealed(r *ledger.Response) bool {
	if r == nil {
		return false
	}
	return bytes.HasPrefix(r.Body, []byte(bodyMarker)) || sealedHeader(r.Header)
}

// sealedHeader reports whether h is a sealed header map.
func sealedHeader(h map[string][]string) bool {
	vs := h[HeaderName]
	return len(h) == 1 && len(vs) == 1 && strings.HasPrefix(vs[0], headerPrefix)
}
