package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"

	"github.com/onejob/onejob/internal/jsonpointer"
)

// A Selection names the members of a JSON body that enter its fingerprint:
// only the included ones, or all but the excluded ones.
type Selection struct {
	include  bool
	pointers []jsonpointer.Pointer // sorted by their text, no two equal
}

// NewSelection parses pointers (JSON Pointers, RFC 6901; at least one)
// into a selection. Their order does not matter; a pointer given twice
// counts once.
func NewSelection(include bool, pointers []string) (*Selection, error) {
	if len(pointers) == 0 {
		return nil, errors.New("a fingerprint selection needs at least one JSON pointer")
	}
	texts := slices.Clone(pointers)
	slices.Sort(texts)
	texts = slices.Compact(texts)
	s := &Selection{include: include}
	for _, t := range texts {
		p, err := jsonpointer.Parse(t)
		if err != nil {
			return nil, err
		}
		s.pointers = append(s.pointers, p)
	}
	return s, nil
}

// texts returns the selection's pointers as text, in its order.
func (s *Selection) texts() []string {
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
func (s *Selection) apply(canon []byte) ([]byte, bool) {
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
		if v, ok := p.Lookup(canon); ok {
			out = appendField(append(out, 'p'), v)
		} else {
			out = append(out, 'a')
		}
	}
	return out, true
}

// without returns doc (valid JSON) with the member at p removed: an object
// member is deleted, an array element taken out (the ones after it move
// up). doc is returned as it was when it has no such member, nil when it
// cannot be read or written.
func without(doc json.RawMessage, p jsonpointer.Pointer) json.RawMessage {
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
		i, ok := jsonpointer.ArrayIndex(tok, len(a))
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
