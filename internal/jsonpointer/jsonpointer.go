// Package jsonpointer is RFC 6901 for onejob: parsing a JSON Pointer that
// names a member, and finding that member in a JSON document. The request
// fingerprint's member selection (package proxy) and the contract's
// json_schema at <pointer> (package fallback) share it.
package jsonpointer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// A Pointer is a parsed JSON Pointer (RFC 6901): the unescaped reference
// tokens of a path into a JSON document.
type Pointer []string

// Parse parses a JSON Pointer that names a member: it starts with "/",
// each "~" is followed by "0" or "1", and no token is "-" (which names the
// element after an array's last, never one a document holds). The pointer
// to the whole document, "", is refused: it names no member.
func Parse(s string) (Pointer, error) {
	if s == "" {
		return nil, errors.New(`the JSON pointer "" is the whole body, not a member`)
	}
	if s[0] != '/' {
		return nil, fmt.Errorf("JSON pointer %q must start with /", s)
	}
	tokens := strings.Split(s[1:], "/")
	for i, tok := range tokens {
		if tok == "-" {
			return nil, fmt.Errorf(`JSON pointer %q: "-" names no element a request holds`, s)
		}
		for j := 0; j < len(tok); j++ {
			if tok[j] == '~' && (j+1 == len(tok) || (tok[j+1] != '0' && tok[j+1] != '1')) {
				return nil, fmt.Errorf(`JSON pointer %q: "~" must be followed by 0 or 1`, s)
			}
		}
		// RFC 6901 section 4: ~1 first, then ~0, so "~01" is "~1".
		tokens[i] = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
	}
	return tokens, nil
}

// String returns p as a JSON Pointer, escaped.
func (p Pointer) String() string {
	var b strings.Builder
	for _, tok := range p {
		b.WriteByte('/')
		b.WriteString(strings.ReplaceAll(strings.ReplaceAll(tok, "~", "~0"), "/", "~1"))
	}
	return b.String()
}

// ArrayIndex reads a reference token as the index of an element of an
// array of n: "0", or digits without a leading zero, less than n.
func ArrayIndex(tok string, n int) (int, bool) {
	if tok == "" || (len(tok) > 1 && tok[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(tok); i++ {
		if tok[i] < '0' || tok[i] > '9' {
			return 0, false
		}
	}
	i, err := strconv.Atoi(tok)
	return i, err == nil && i < n
}

// Lookup returns the member of doc at p, as it is written in doc (so
// canonical when doc is). doc must be valid JSON that starts with its
// value (no leading white space); false when it has no such member.
func (p Pointer) Lookup(doc json.RawMessage) (json.RawMessage, bool) {
	for _, tok := range p {
		if len(doc) == 0 {
			return nil, false
		}
		switch doc[0] {
		case '{':
			var m map[string]json.RawMessage
			if json.Unmarshal(doc, &m) != nil {
				return nil, false
			}
			v, ok := m[tok]
			if !ok {
				return nil, false
			}
			doc = v
		case '[':
			var a []json.RawMessage
			if json.Unmarshal(doc, &a) != nil {
				return nil, false
			}
			i, ok := ArrayIndex(tok, len(a))
			if !ok {
				return nil, false
			}
			doc = a[i]
		default:
			return nil, false
		}
	}
	return doc, true
}
