package jsonpointer

import (
	"encoding/json"
	"slices"
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

func TestParse(t *testing.T) {
	good := map[string]Pointer{
		"/a":       {"a"},
		"/a/b":     {"a", "b"},
		"/items/0": {"items", "0"},
		"/":        {""},
		"/a~1b":    {"a/b"},
		"/m~0n":    {"m~n"},
		"/~01":     {"~1"}, // ~1 is unescaped first: "~01" is "~" then "1"
		"/a//b":    {"a", "", "b"},
		"/ é":      {" é"},
	}
	for s, want := range good {
		p, err := Parse(s)
		if err != nil || !slices.Equal(p, want) {
			t.Errorf("Parse(%q) = %q, %v; want %q", s, p, err, want)
			continue
		}
		if p.String() != s {
			t.Errorf("Parse(%q).String() = %q", s, p.String())
		}
	}
	for _, s := range []string{"", "a", "a/b", "/-", "/items/-", "/~", "/a~", "/a~2", "/~x"} {
		if p, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) = %q, want an error", s, p)
		}
	}
}
