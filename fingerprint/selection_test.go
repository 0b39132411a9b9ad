package fingerprint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/onejob/onejob/internal/jsonpointer"
)

func FuzzParsePointer(f *testing.F) {
	for _, s := range []string{"/a", "/a~1b/0", "/~01", "/-", "", "/~", "//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := jsonpointer.Parse(s)
		if err != nil {
			return
		}
		// A pointer has one spelling: it prints as it was written, and
		// reads back as the same tokens.
		if p.String() != s {
			t.Fatalf("jsonpointer.Parse(%q).String() = %q", s, p.String())
		}
		q, err := jsonpointer.Parse(p.String())
		if err != nil || !slices.Equal(p, q) {
			t.Fatalf("%q reads back as %q, %v", s, q, err)
		}
		// It selects from any document without failing.
		sel := &Selection{include: true, pointers: []jsonpointer.Pointer{p}}
		if _, ok := sel.apply([]byte(`{"a":[1,{"b":null}],"":{"":2}}`)); !ok {
			t.Fatalf("include %q failed", s)
		}
		sel.include = false
		if _, ok := sel.apply([]byte(`{"a":[1,{"b":null}],"":{"":2}}`)); !ok {
			t.Fatalf("exclude %q failed", s)
		}
	})
}

func selFP(t *testing.T, include bool, pointers ...string) Fingerprinter {
	t.Helper()
	sel, err := NewSelection(include, pointers)
	if err != nil {
		t.Fatal(err)
	}
	return New(BodyJSON, nil, sel)
}

func TestFingerprintSelection(t *testing.T) {
	exclude := selFP(t, false, "/ts", "/meta/trace")
	include := selFP(t, true, "/amount", "/items/0/sku")
	base := `{"amount":100,"items":[{"sku":"a","n":1}],"ts":1,"meta":{"trace":"x","v":1}}`
	same := func(f Fingerprinter, a, b string) bool { return bytes.Equal(sum(f, a), sum(f, b)) }
	tests := []struct {
		name string
		f    Fingerprinter
		body string
		same bool
	}{
		{"exclude: excluded member changed", exclude, `{"amount":100,"items":[{"sku":"a","n":1}],"ts":2,"meta":{"trace":"y","v":1}}`, true},
		{"exclude: excluded members absent", exclude, `{"amount":100,"items":[{"sku":"a","n":1}],"meta":{"v":1}}`, true},
		{"exclude: excluded member null", exclude, `{"amount":100,"items":[{"sku":"a","n":1}],"ts":null,"meta":{"trace":null,"v":1}}`, true},
		{"exclude: another member changed", exclude, `{"amount":101,"items":[{"sku":"a","n":1}],"ts":1,"meta":{"trace":"x","v":1}}`, false},
		{"exclude: a sibling of an excluded member changed", exclude, `{"amount":100,"items":[{"sku":"a","n":1}],"ts":1,"meta":{"trace":"x","v":2}}`, false},
		{"include: other members changed", include, `{"amount":100,"items":[{"sku":"a","n":9},{"sku":"b"}],"ts":5}`, true},
		{"include: key order and spaces", include, `{ "items" : [ {"n":1, "sku":"a"} ], "amount" : 100 }`, true},
		{"include: included member changed", include, `{"amount":200,"items":[{"sku":"a","n":1}],"ts":1}`, false},
		{"include: included member absent", include, `{"items":[{"sku":"a","n":1}]}`, false},
		{"include: included member null", include, `{"amount":null,"items":[{"sku":"a","n":1}]}`, false},
		{"include: number as written", include, `{"amount":100.0,"items":[{"sku":"a","n":1}]}`, false},
	}
	for _, tt := range tests {
		if got := same(tt.f, base, tt.body); got != tt.same {
			t.Errorf("%s: same fingerprint = %v, want %v", tt.name, got, tt.same)
		}
	}
	// Absent and null differ under include: both are part of the intent.
	if same(selFP(t, true, "/a"), `{}`, `{"a":null}`) {
		t.Error("include: an absent member and a null one share a fingerprint")
	}
	// Not JSON: hashed raw, still under the selection's own version.
	if !same(exclude, `not json`, `not json`) || same(exclude, `not json`, `not json `) {
		t.Error("a body that is not JSON is not hashed raw")
	}
	// Two selections never share a fingerprint, nor does a selection with
	// the whole body.
	if same2 := bytes.Equal(sum(exclude, base), sum(selFP(t, false, "/ts"), base)); same2 {
		t.Error("two exclusions share a fingerprint")
	}
	if bytes.Equal(sum(selFP(t, false, "/nothing"), `{"a":1}`), sum(jsonFP(), `{"a":1}`)) {
		t.Error("a selection shares the whole body's fingerprint")
	}
	// Order and repeats of pointers do not matter.
	if a, b := selFP(t, true, "/b", "/a", "/b"), selFP(t, true, "/a", "/b"); a.scheme != b.scheme || !bytes.Equal(sum(a, base), sum(b, base)) {
		t.Errorf("schemes %s and %s", a.scheme, b.scheme)
	}
}

// randomValue returns a random JSON value of at most depth levels.
func randomValue(r *rand.Rand, depth int) any {
	switch k := r.IntN(7); {
	case k == 0 || depth == 0 && k >= 4:
		return json.Number(fmt.Sprint(r.IntN(1000)))
	case k == 1:
		return fmt.Sprintf("s%d~/", r.IntN(50))
	case k == 2:
		return nil
	case k == 3:
		return r.IntN(2) == 0
	case k == 4 || k == 5:
		m := map[string]any{}
		for range r.IntN(4) {
			m[fmt.Sprintf("k%d", r.IntN(6))] = randomValue(r, depth-1)
		}
		return m
	default:
		a := make([]any, r.IntN(4))
		for i := range a {
			a[i] = randomValue(r, depth-1)
		}
		return a
	}
}

// somePointer returns a pointer to a member of v (an object or array with
// members), escaped, and a copy of v with that member set to repl.
func somePointer(r *rand.Rand, v any, repl any) (string, any, bool) {
	switch c := v.(type) {
	case map[string]any:
		if len(c) == 0 {
			return "", nil, false
		}
		keys := make([]string, 0, len(c))
		for k := range c {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		k := keys[r.IntN(len(keys))]
		out := make(map[string]any, len(c))
		for kk, vv := range c {
			out[kk] = vv
		}
		tok := strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
		if p, inner, ok := somePointer(r, c[k], repl); ok && r.IntN(2) == 0 {
			out[k] = inner
			return "/" + tok + p, out, true
		}
		out[k] = repl
		return "/" + tok, out, true
	case []any:
		if len(c) == 0 {
			return "", nil, false
		}
		i := r.IntN(len(c))
		out := slices.Clone(c)
		if p, inner, ok := somePointer(r, c[i], repl); ok && r.IntN(2) == 0 {
			out[i] = inner
			return fmt.Sprintf("/%d%s", i, p), out, true
		}
		out[i] = repl
		return fmt.Sprintf("/%d", i), out, true
	}
	return "", nil, false
}

// TestSelectionProperties: on random documents, a change to an excluded
// member never changes the fingerprint, and a change to an included one
// always does.
func TestSelectionProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	marshal := func(v any) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	checked := 0
	for range 3000 {
		doc := map[string]any{"root": randomValue(r, 4), "x": randomValue(r, 2)}
		repl := fmt.Sprintf("changed-%d", r.IntN(1000))
		p, changed, ok := somePointer(r, doc, repl)
		if !ok {
			continue
		}
		before, after := marshal(doc), marshal(changed)
		if before == after {
			continue // the member held the replacement already
		}
		checked++
		if ex := selFP(t, false, p); !bytes.Equal(sum(ex, before), sum(ex, after)) {
			t.Fatalf("exclude %s: changing it changed the fingerprint\n%s\n%s", p, before, after)
		}
		if in := selFP(t, true, p); bytes.Equal(sum(in, before), sum(in, after)) {
			t.Fatalf("include %s: changing it kept the fingerprint\n%s\n%s", p, before, after)
		}
	}
	if checked < 1000 {
		t.Fatalf("only %d documents checked", checked)
	}
}

func TestFingerprinterForJob(t *testing.T) {
	current := selFP(t, false, "/ts")
	body := `{"amount":1,"ts":2}`
	// The job's own scheme, from its text alone.
	other := selFP(t, true, "/amount")
	g, ok := current.ForJob(other.Version(), other.scheme)
	if !ok || !bytes.Equal(sum(g, body), sum(other, body)) || g.scheme != other.scheme {
		t.Fatalf("forJob(%d, %s) = %v: does not fingerprint as the job did", other.Version(), other.scheme, ok)
	}
	// A job of an earlier release: version 1, no scheme, the whole body in
	// this gateway's mode.
	g, ok = current.ForJob(VersionWhole, "")
	if !ok || !bytes.Equal(sum(g, body), sum(jsonFP(), body)) || g.scheme != "" {
		t.Fatalf("forJob(1, \"\") = %v", ok)
	}
	whole := New(BodyRaw, []string{"X-A"}, nil)
	g, ok = current.ForJob(whole.Version(), whole.scheme)
	if !ok || g.mode != BodyRaw || !slices.Equal(g.headers, []string{"X-A"}) {
		t.Fatalf("forJob(%s) = %+v, %v", whole.scheme, g, ok)
	}
	for _, bad := range []struct {
		v      int
		scheme string
	}{
		{3, other.scheme},     // a later release's version
		{1, other.scheme},     // a selection under the whole body's version
		{2, `{"body":"raw"}`}, // the selected version without a selection
		{2, `{"body":"xml"}`}, // no such mode
		{2, `not json`},       // not a scheme
		{1, `{}`},             // no mode
		{2, `{"body":"json","include":["/a"],"exclude":["/b"]}`},
		{2, `{"body":"raw","include":["/a"]}`},
		{2, `{"body":"json","include":["a"]}`},
	} {
		if g, ok := current.ForJob(bad.v, bad.scheme); ok {
			t.Errorf("forJob(%d, %s) = %+v, want false", bad.v, bad.scheme, g)
		}
	}
}
