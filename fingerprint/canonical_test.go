package fingerprint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// referenceCanonicalJSON is the canonical form computed with encoding/json's
// tokenizer: slower, and obviously right. CanonicalJSON must agree with it
// on every input, accepted or refused.
func referenceCanonicalJSON(body []byte) ([]byte, bool) {
	if !utf8.Valid(body) || loneSurrogate(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	out, err := refValue(dec, make([]byte, 0, len(body)), 0)
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

func refValue(dec *json.Decoder, out []byte, depth int) ([]byte, error) {
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
			return refObject(dec, out, depth+1)
		case '[':
			out = append(out, '[')
			for i := 0; dec.More(); i++ {
				if i > 0 {
					out = append(out, ',')
				}
				if out, err = refValue(dec, out, depth+1); err != nil {
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

func refObject(dec *json.Decoder, out []byte, depth int) ([]byte, error) {
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
		val, err := refValue(dec, nil, depth)
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

// FuzzCanonicalJSONMatchesReference checks the hand-written parser against
// encoding/json's tokenizer.
func FuzzCanonicalJSONMatchesReference(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":[true,false,null,{"y":"\u00e9\n","x":-0.5e+10}]}`,
		`{"a":1,"a":2}`, `{"\u0061":1,"a":2}`, `["\ud83d\ude00","\"\\\/\b\f\r\t"]`,
		` [ 1 , 2 ] `, `01`, `-`, `1.`, `1e`, `.5`, `tru`, `nullx`, `{"a" 1}`, `{"a":1,}`, `[1,]`,
		`"\u0000\u001f"`, `{"z":{"b":2,"a":1},"y":[{"d":0,"c":1}]}`, `"\x"`, "\"\t\"", `{}`, `[]`, ``,
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat(`{"a":`, 9999) + "1" + strings.Repeat("}", 9999),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := CanonicalJSON(body)
		want, wantOK := referenceCanonicalJSON(body)
		if ok != wantOK || !bytes.Equal(got, want) {
			t.Fatalf("CanonicalJSON(%q) = %q, %v; the reference says %q, %v", body, got, ok, want, wantOK)
		}
	})
}

// TestCanonicalJSONDepthLimit checks the nesting limit on both sides of it.
func TestCanonicalJSONDepthLimit(t *testing.T) {
	for _, n := range []int{maxDepth - 1, maxDepth, maxDepth + 1} {
		for _, open := range []string{"[", `{"k":[`} {
			body := strings.Repeat(open, n) + strings.Repeat(map[string]string{"[": "]", `{"k":[`: "]}"}[open], n)
			_, ok := CanonicalJSON([]byte(body))
			_, want := referenceCanonicalJSON([]byte(body))
			if ok != want {
				t.Errorf("depth %d of %s: accepted %v, the reference %v", n, open, ok, want)
			}
		}
	}
	if _, ok := CanonicalJSON([]byte(strings.Repeat("[", maxDepth+1) + strings.Repeat("]", maxDepth+1))); ok {
		t.Errorf("nesting deeper than %d accepted", maxDepth)
	}
}
