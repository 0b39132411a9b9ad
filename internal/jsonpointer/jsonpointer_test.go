package jsonpointer

import (
	"encoding/json"
	"testing"
)

func TestLookup(t *testing.T) {
	doc := json.RawMessage(`{"choices":[{"message":{"content":"{\"a\":1}"}}],"a/b":{"~":true},"":0}`)
	for _, tc := range []struct {
		pointer, want string // want "" when there is no such member
	}{
		{"/choices/0/message/content", `"{\"a\":1}"`},
		{"/choices/0", `{"message":{"content":"{\"a\":1}"}}`},
		{"/a~1b/~0", `true`},
		{"/", `0`},
		{"/choices/1", ""},
		{"/choices/01", ""},
		{"/choices/x", ""},
		{"/choices/0/message/content/x", ""},
		{"/missing", ""},
	} {
		p, err := Parse(tc.pointer)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.pointer, err)
		}
		got, ok := p.Lookup(doc)
		if ok != (tc.want != "") || string(got) != tc.want {
			t.Errorf("Lookup(%s) = %s, %v; want %s", tc.pointer, got, ok, tc.want)
		}
	}
	if _, ok := (Pointer{"a"}).Lookup(nil); ok {
		t.Error("a member of an empty document")
	}
}
