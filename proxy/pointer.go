package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// A Pointer is a parsed JSON Pointer (RFC 6901): the unescaped reference
// tokens of a path into a JSON document.
type Pointer []string

// ParsePointer parses a JSON Pointer that names a member: it starts with
// "/", each "~" is followed by "0" or "1", and no token is "-" (which names
// the element after an array's last, never one a request holds). The
// pointer to the whole document, "", is refused: it names no member.
func ParsePointer(s string) (Pointer, error) {
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

// arrayIndex reads a reference token as an array index: "0", or digits
// without a leading zero.
func arrayIndex(tok string, n int) (int, bool) {
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

// selection names the members of a JSON body that enter its fingerprint:
// only the included ones, or all but the excluded ones.
type selection struct {
	include  bool
	pointers []Pointer // sorted by their text, no two equal
}

// newSelection parses pointers (at least one) into a selection. Their order
// does not matter; a pointer given twice counts once.
func newSelection(include bool, pointers []string) (*selection, error) {
	if len(pointers) == 0 {
		return nil, errors.New("a fingerprint selection needs at least one JSON pointer")
	}
	texts := slices.Clone(pointers)
	slices.Sort(texts)
	texts = slices.Compact(texts)
	s := &selection{include: include}
	for _, t := range texts {
		p, err := ParsePointer(t)
		if err != nil {
			return nil, err
		}
		s.pointers = append(s.pointers, p)
	}
	return s, nil
}

// texts returns the selection's pointers as text, in its order.
func (s *selection) texts() []string {
	out := make([]string, len(s.pointers))
	for i, p := range s.pointers {
		out[i] = p.String()
	}
	return out
}

// apply returns the part of canon, a canonical JSON document
// (CanonicalJSON), that enters the fingerprint. Included: each pointer, then
// whether its member is present and, if so, its canonical value; an absent
// member is distinct from null. Excluded: the document without those
// members, canonical; a member that is absent changes nothing, so present,
// absent and null are alike. It returns false when the document cannot be
// taken apart (deeper than encoding/json reads): then the body is hashed
// raw, the same way on every instance.
func (s *selection) apply(canon []byte) ([]byte, bool) {
	if !s.include {
		doc := json.RawMessage(canon)
		for _, p := range s.pointers {
			if doc = without(doc, p); doc == nil {
				return nil, false
			}
		}
		return CanonicalJSON(doc)
	}
	var out []byte
	for _, p := range s.pointers {
		out = appendField(out, []byte(p.String()))
		if v, ok := lookup(canon, p); ok {
			out = appendField(append(out, 'p'), v)
		} else {
			out = append(out, 'a')
		}
	}
	return out, true
}

// lookup returns the member of doc (valid JSON) at p, as it is written in
// doc (so canonical when doc is).
func lookup(doc json.RawMessage, p Pointer) (json.RawMessage, bool) {
	for _, tok := range p {
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
			i, ok := arrayIndex(tok, len(a))
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

// without returns doc (valid JSON) with the member at p removed: an object
// member is deleted, an array element taken out (the ones after it move
// up). doc is returned as it was when it has no such member, nil when it
// cannot be read or written.
func without(doc json.RawMessage, p Pointer) json.RawMessage {
	tok, rest := p[0], p[1:]
	switch doc[0] {
	case '{':
		var m map[string]json.RawMessage
		if json.Unmarshal(doc, &m) != nil {
			return nil
		}
		v, ok := m[tok]
		if !ok {
			return doc
		}
		if len(rest) == 0 {
			delete(m, tok)
		} else if m[tok] = without(v, rest); m[tok] == nil {
			return nil
		}
		return marshalPlain(m)
	case '[':
		var a []json.RawMessage
		if json.Unmarshal(doc, &a) != nil {
			return nil
		}
		i, ok := arrayIndex(tok, len(a))
		if !ok {
			return doc
		}
		if len(rest) == 0 {
			a = slices.Delete(a, i, i+1)
		} else if a[i] = without(a[i], rest); a[i] == nil {
			return nil
		}
		return marshalPlain(a)
	}
	return doc
}

// marshalPlain encodes v (maps and slices of json.RawMessage) as JSON
// without HTML escapes, or returns nil; the result is made canonical
// afterwards.
func marshalPlain(v any) json.RawMessage {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if enc.Encode(v) != nil {
		return nil
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n"))
}
