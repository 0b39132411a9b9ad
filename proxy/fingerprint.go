package proxy

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"net/http"
	"strconv"
)

// FingerprintVersion is the version of the fingerprint encoding below; the
// ledger stores it beside each fingerprint.
const FingerprintVersion = 1

// BodyMode says how a request body enters the fingerprint.
type BodyMode int

const (
	// BodyJSON hashes canonical JSON: object keys sorted, insignificant
	// white space dropped, strings compared after unescaping, numbers as
	// written. A body that is not valid JSON, or has duplicate keys, is
	// hashed raw.
	BodyJSON BodyMode = iota
	// BodyRaw hashes the body's bytes.
	BodyRaw
	// BodyGraphQL hashes a normalized GraphQL-over-HTTP request (see
	// ParseGraphQL). A body that is not one is hashed raw.
	BodyGraphQL
)

// ParseBodyMode parses "json", "raw" or "graphql".
func ParseBodyMode(s string) (BodyMode, error) {
	switch s {
	case "", "json":
		return BodyJSON, nil
	case "raw":
		return BodyRaw, nil
	case "graphql":
		return BodyGraphQL, nil
	}
	return 0, errors.New("fingerprint must be raw, json or graphql, not " + strconv.Quote(s))
}

// String names the mode as the fingerprint option does: raw, json or
// graphql.
func (m BodyMode) String() string {
	switch m {
	case BodyRaw:
		return "raw"
	case BodyGraphQL:
		return "graphql"
	}
	return "json"
}

// fingerprinter computes the SHA-256 of a versioned, length-prefixed
// encoding of a request: method, original URI, the named headers (in the
// order configured, each with all its values), and the body.
type fingerprinter struct {
	mode    BodyMode
	headers []string // canonical header names
}

func appendField(b []byte, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Sum returns the fingerprint of a request whose body is body. In graphql
// mode it parses the body; a caller that has parsed it already calls
// SumGraphQL instead.
func (f fingerprinter) Sum(method, uri string, h http.Header, body []byte) []byte {
	switch f.mode {
	case BodyJSON:
		if canon, ok := CanonicalJSON(body); ok {
			return f.sum(method, uri, h, 'j', canon)
		}
	case BodyGraphQL:
		if g, ok := ParseGraphQL(body); ok {
			return f.sum(method, uri, h, 'g', g.Canonical)
		}
	}
	return f.sum(method, uri, h, 'r', body)
}

// SumGraphQL returns the fingerprint of a request whose body is body and
// which ParseGraphQL parsed as g (nil when it returned false), without
// parsing the body again: it equals Sum's. Outside graphql mode g is ignored.
func (f fingerprinter) SumGraphQL(method, uri string, h http.Header, g *GraphQLRequest, body []byte) []byte {
	if f.mode != BodyGraphQL {
		return f.Sum(method, uri, h, body)
	}
	if g == nil {
		return f.sum(method, uri, h, 'r', body)
	}
	return f.sum(method, uri, h, 'g', g.Canonical)
}

// sum hashes the request's encoding, ending with the body's form (tag: 'r'
// raw, 'j' canonical JSON, 'g' GraphQL) and the length-prefixed payload.
func (f fingerprinter) sum(method, uri string, h http.Header, tag byte, payload []byte) []byte {
	enc := make([]byte, 0, 64+len(uri))
	enc = append(enc, "onejob-fingerprint"...)
	enc = binary.AppendUvarint(enc, FingerprintVersion)
	enc = appendField(enc, []byte(method))
	enc = appendField(enc, []byte(uri))
	enc = binary.AppendUvarint(enc, uint64(len(f.headers)))
	for _, name := range f.headers {
		vs := h[name]
		enc = appendField(enc, []byte(name))
		enc = binary.AppendUvarint(enc, uint64(len(vs)))
		for _, v := range vs {
			enc = appendField(enc, []byte(v))
		}
	}
	enc = binary.AppendUvarint(append(enc, tag), uint64(len(payload)))
	m := sha256.New()
	m.Write(enc)
	m.Write(payload)
	return m.Sum(nil)
}
