package proxy

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
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

// CanonicalJSON returns the canonical form of a JSON document, or false when
// body is not one valid UTF-8 JSON value without duplicate object keys,
// unpaired surrogate escapes, or more than maxDepth levels of nesting.
func CanonicalJSON(body []byte) ([]byte, bool) {
	if !utf8.Valid(body) || loneSurrogate(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	out := make([]byte, 0, len(body))
	out, err := canonValue(dec, out, 0)
	if err != nil {
		return nil, false
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, false // trailing data
	}
	return out, true
}

var (
	errDuplicateKey = errors.New("duplicate object key")
	errTooDeep      = errors.New("nested too deeply")
)

// maxDepth bounds the nesting of a document that is canonicalized (the
// limit of encoding/json's own scanner): deeper documents are hashed raw, so
// that a body of brackets cannot make the recursion below take hundreds of
// megabytes of stack.
const maxDepth = 10000

// loneSurrogate reports whether body escapes a UTF-16 surrogate that is not
// half of a pair (\ud800 alone). The decoder turns each into U+FFFD, so
// distinct strings would compare equal: such a body is hashed raw.
func loneSurrogate(body []byte) bool {
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			continue
		}
		switch u := codeUnit(body, i); {
		case u < 0: // a one-character escape: skip the escaped character
			i++
		case u >= 0xd800 && u < 0xdc00: // high: a low must follow
			if lo := codeUnit(body, i+6); lo < 0xdc00 || lo >= 0xe000 {
				return true
			}
			i += 11
		case u >= 0xdc00 && u < 0xe000:
			return true
		default:
			i += 5
		}
	}
	return false
}

// codeUnit returns the code unit of the \uXXXX escape at b[i:], or -1.
func codeUnit(b []byte, i int) int {
	if i+6 > len(b) || b[i] != '\\' || b[i+1] != 'u' {
		return -1
	}
	n, err := strconv.ParseUint(string(b[i+2:i+6]), 16, 16)
	if err != nil {
		return -1
	}
	return int(n)
}

func canonValue(dec *json.Decoder, out []byte, depth int) ([]byte, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxDepth {
			return nil, errTooDeep
		}
		switch t {
		case '{':
			return canonObject(dec, out, depth+1)
		case '[':
			out = append(out, '[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out = append(out, ',')
				}
				if out, err = canonValue(dec, out, depth+1); err != nil {
					return nil, err
				}
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return append(out, ']'), nil
		}
		return nil, errors.New("unexpected delimiter")
	case string:
		return appendJSONString(out, t), nil
	case json.Number:
		return append(out, t...), nil
	case bool:
		return strconv.AppendBool(out, t), nil
	case nil:
		return append(out, "null"...), nil
	}
	return nil, errors.New("unexpected token")
}

func canonObject(dec *json.Decoder, out []byte, depth int) ([]byte, error) {
	type member struct {
		key string
		val []byte
	}
	var members []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := tok.(string)
		if !ok {
			return nil, errors.New("object key is not a string")
		}
		val, err := canonValue(dec, nil, depth)
		if err != nil {
			return nil, err
		}
		members = append(members, member{key, val})
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	slices.SortFunc(members, func(a, b member) int { return strings.Compare(a.key, b.key) })
	out = append(out, '{')
	for i, m := range members {
		if i > 0 {
			if members[i-1].key == m.key {
				return nil, errDuplicateKey
			}
			out = append(out, ',')
		}
		out = appendJSONString(out, m.key)
		out = append(out, ':')
		out = append(out, m.val...)
	}
	return append(out, '}'), nil
}

// appendJSONString writes s as a JSON string with the minimal escapes:
// quote, backslash and control characters.
func appendJSONString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c < 0x20:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			out = append(out, c)
		}
	}
	return append(out, '"')
}
