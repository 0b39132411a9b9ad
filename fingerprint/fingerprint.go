package fingerprint

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// The versions of the fingerprint encoding below; the ledger stores a job's
// beside its fingerprint, with its scheme (what the fingerprint covered).
const (
	// VersionWhole hashes the whole body.
	VersionWhole = 1
	// VersionSelected hashes the members of a JSON body that a
	// selection names (fingerprint json { include|exclude }), and the
	// scheme itself, so two selections never share a fingerprint.
	VersionSelected = 2
)

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

// Fingerprinter computes the SHA-256 of a versioned, length-prefixed
// encoding of a request: method, original URI, the named headers (in the
// order configured, each with all its values), and the body.
type Fingerprinter struct {
	mode    BodyMode
	headers []string   // canonical header names
	sel     *Selection // in json mode, the members that count; nil: all
	scheme  string     // the scheme's text (schemeText), as jobs record it
}

// schemeText is the scheme of a fingerprint as a job records it, encoded
// as JSON: what a gateway needs to fingerprint a retry as the job was,
// whatever its own configuration says by then.
type schemeText struct {
	Body    string   `json:"body"`
	Headers []string `json:"headers,omitempty"`
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
}

// New returns the Fingerprinter of a body mode, headers
// (canonical names) and selection (nil: the whole body; json mode only).
func New(mode BodyMode, headers []string, sel *Selection) Fingerprinter {
	f := Fingerprinter{mode: mode, headers: headers, sel: sel}
	t := schemeText{Body: mode.String(), Headers: headers}
	if sel != nil {
		if sel.include {
			t.Include = sel.texts()
		} else {
			t.Exclude = sel.texts()
		}
	}
	b, _ := json.Marshal(t) // strings only: cannot fail
	f.scheme = string(b)
	return f
}

// Version is the encoding version of f's fingerprints.
func (f Fingerprinter) Version() int {
	if f.sel != nil {
		return VersionSelected
	}
	return VersionWhole
}

// ForJob returns the Fingerprinter that made the fingerprint of a job
// recorded with version and scheme, so that a retry is fingerprinted as
// its job was: f itself when they are f's. A job of an earlier release
// (version 1, no scheme) was made by the whole body, in the mode and with
// the headers configured then, taken to be f's. It returns false for a
// version or scheme this gateway cannot make (a later release's).
func (f Fingerprinter) ForJob(version int, scheme string) (Fingerprinter, bool) {
	if version == f.Version() && scheme == f.scheme {
		return f, true
	}
	if version == VersionWhole && scheme == "" {
		g := f
		g.sel, g.scheme = nil, ""
		return g, true
	}
	var t schemeText
	if json.Unmarshal([]byte(scheme), &t) != nil {
		return Fingerprinter{}, false
	}
	mode, err := ParseBodyMode(t.Body)
	if err != nil || t.Body == "" {
		return Fingerprinter{}, false
	}
	var sel *Selection
	if len(t.Include) > 0 || len(t.Exclude) > 0 {
		if mode != BodyJSON || (len(t.Include) > 0 && len(t.Exclude) > 0) {
			return Fingerprinter{}, false
		}
		if sel, err = NewSelection(len(t.Include) > 0, append(t.Include, t.Exclude...)); err != nil {
			return Fingerprinter{}, false
		}
	}
	g := New(mode, t.Headers, sel)
	if g.Version() != version {
		return Fingerprinter{}, false
	}
	g.scheme = scheme // as recorded, byte for byte
	return g, true
}

// Mode is how f takes a request's body.
func (f Fingerprinter) Mode() BodyMode { return f.mode }

// Scheme is what f's fingerprints cover (the body's form, the headers,
// the selection), as JSON: a job records it beside its fingerprint, and
// ForJob reads it back. It is empty for a job of an earlier release.
func (f Fingerprinter) Scheme() string { return f.scheme }

func appendField(b []byte, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Sum returns the fingerprint of a request whose body is body. In graphql
// mode it parses the body; a caller that has parsed it already calls
// SumGraphQL instead.
func (f Fingerprinter) Sum(method, uri string, h http.Header, body []byte) []byte {
	switch f.mode {
	case BodyJSON:
		if canon, ok := CanonicalJSON(body); ok {
			if f.sel == nil {
				return f.sum(method, uri, h, 'j', canon)
			}
			if part, ok := f.sel.apply(canon); ok {
				return f.sum(method, uri, h, 's', part)
			}
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
func (f Fingerprinter) SumGraphQL(method, uri string, h http.Header, g *GraphQLRequest, body []byte) []byte {
	if f.mode != BodyGraphQL {
		return f.Sum(method, uri, h, body)
	}
	if g == nil {
		return f.sum(method, uri, h, 'r', body)
	}
	return f.sum(method, uri, h, 'g', g.Canonical)
}

// sum hashes the request's encoding, ending with the body's form (tag: 'r'
// raw, 'j' canonical JSON, 'g' GraphQL, 's' selected JSON members) and the
// length-prefixed payload. Version 2 puts the scheme after the version.
func (f Fingerprinter) sum(method, uri string, h http.Header, tag byte, payload []byte) []byte {
	enc := make([]byte, 0, 64+len(uri))
	enc = append(enc, "onejob-fingerprint"...)
	enc = binary.AppendUvarint(enc, uint64(f.Version()))
	if f.sel != nil {
		enc = appendField(enc, []byte(f.scheme))
	}
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
