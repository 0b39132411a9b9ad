package proxy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/onejob/onejob/ledger/memory"
)

func TestParsePointer(t *testing.T) {
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
		p, err := ParsePointer(s)
		if err != nil || !slices.Equal(p, want) {
			t.Errorf("ParsePointer(%q) = %q, %v; want %q", s, p, err, want)
			continue
		}
		if p.String() != s {
			t.Errorf("ParsePointer(%q).String() = %q", s, p.String())
		}
	}
	for _, s := range []string{"", "a", "a/b", "/-", "/items/-", "/~", "/a~", "/a~2", "/~x"} {
		if p, err := ParsePointer(s); err == nil {
			t.Errorf("ParsePointer(%q) = %q, want an error", s, p)
		}
	}
}

func FuzzParsePointer(f *testing.F) {
	for _, s := range []string{"/a", "/a~1b/0", "/~01", "/-", "", "/~", "//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePointer(s)
		if err != nil {
			return
		}
		// A pointer has one spelling: it prints as it was written, and
		// reads back as the same tokens.
		if p.String() != s {
			t.Fatalf("ParsePointer(%q).String() = %q", s, p.String())
		}
		q, err := ParsePointer(p.String())
		if err != nil || !slices.Equal(p, q) {
			t.Fatalf("%q reads back as %q, %v", s, q, err)
		}
		// It selects from any document without failing.
		sel := &selection{include: true, pointers: []Pointer{p}}
		if _, ok := sel.apply([]byte(`{"a":[1,{"b":null}],"":{"":2}}`)); !ok {
			t.Fatalf("include %q failed", s)
		}
		sel.include = false
		if _, ok := sel.apply([]byte(`{"a":[1,{"b":null}],"":{"":2}}`)); !ok {
			t.Fatalf("exclude %q failed", s)
		}
	})
}

func selFP(t *testing.T, include bool, pointers ...string) fingerprinter {
	t.Helper()
	sel, err := newSelection(include, pointers)
	if err != nil {
		t.Fatal(err)
	}
	return newFingerprinter(BodyJSON, nil, sel)
}

func TestFingerprintSelection(t *testing.T) {
	exclude := selFP(t, false, "/ts", "/meta/trace")
	include := selFP(t, true, "/amount", "/items/0/sku")
	base := `{"amount":100,"items":[{"sku":"a","n":1}],"ts":1,"meta":{"trace":"x","v":1}}`
	same := func(f fingerprinter, a, b string) bool { return bytes.Equal(sum(f, a), sum(f, b)) }
	tests := []struct {
		name string
		f    fingerprinter
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
	g, ok := current.forJob(other.version(), other.scheme)
	if !ok || !bytes.Equal(sum(g, body), sum(other, body)) || g.scheme != other.scheme {
		t.Fatalf("forJob(%d, %s) = %v: does not fingerprint as the job did", other.version(), other.scheme, ok)
	}
	// A job of an earlier release: version 1, no scheme, the whole body in
	// this gateway's mode.
	g, ok = current.forJob(FingerprintVersion, "")
	if !ok || !bytes.Equal(sum(g, body), sum(jsonFP(), body)) || g.scheme != "" {
		t.Fatalf("forJob(1, \"\") = %v", ok)
	}
	whole := newFingerprinter(BodyRaw, []string{"X-A"}, nil)
	g, ok = current.forJob(whole.version(), whole.scheme)
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
		if g, ok := current.forJob(bad.v, bad.scheme); ok {
			t.Errorf("forJob(%d, %s) = %+v, want false", bad.v, bad.scheme, g)
		}
	}
}

// TestRetryFingerprintedAsItsJob: a job's retries are fingerprinted as the
// job was, after the configuration changed or the gateway was upgraded.
func TestRetryFingerprintedAsItsJob(t *testing.T) {
	l := memory.New()
	first := newHarness(t, Config{Ledger: l, FingerprintExclude: []string{"/ts"}}, nil)
	if rec := first.do(post("k", `{"amount":1,"ts":1}`)); rec.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", rec.Code, rec.Body)
	}
	// The operator now fingerprints on /amount alone: the job keeps its
	// own selection, so a retry with another ts replays...
	later := newHarness(t, Config{Ledger: l, FingerprintInclude: []string{"/amount", "/currency"}}, nil)
	if rec := later.do(post("k", `{"amount":1,"ts":7}`)); rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("retry with another ts after the configuration changed: %d %s", rec.Code, rec.Body)
	}
	// ... and one with another amount is still another request.
	wantProblem(t, later.do(post("k", `{"amount":2,"ts":1}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
	// The job's selection decides, not the new one: under it a member the
	// new one ignores still counts.
	wantProblem(t, later.do(post("k", `{"amount":1,"ts":1,"note":"x"}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
	// New keys take the new selection.
	later.do(post("k2", `{"amount":1,"ts":1}`))
	if rec := later.do(post("k2", `{"amount":1,"ts":2,"note":"x"}`)); rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("new job under the new selection: %d %s", rec.Code, rec.Body)
	}
	if got := later.up.calls(); got != 1 {
		t.Errorf("upstream called %d times by the later gateway, want 1", got)
	}

	// A job of an earlier release (version 1, no scheme recorded), retried
	// through a gateway that selects members: fingerprinted by the whole
	// body, as the earlier release did.
	earlier := newHarness(t, Config{Ledger: l}, nil)
	earlier.m.fp = fingerprinter{mode: BodyJSON}
	earlier.do(post("k3", `{"amount":1,"ts":1}`))
	if j, err := l.Find(t.Context(), earlier.m.hasher.Owner(testOwner), earlier.m.hasher.Key("k3")); err != nil ||
		j.FingerprintVersion != 1 || j.FingerprintScheme != "" {
		t.Fatalf("the earlier release's job: %+v, %v", j, err)
	}
	if rec := later.do(post("k3", `{ "ts": 1, "amount": 1 }`)); rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("retry of an earlier release's job: %d %s", rec.Code, rec.Body)
	}
	wantProblem(t, later.do(post("k3", `{"amount":1,"ts":2}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
}

func TestSelectionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"both", Config{FingerprintInclude: []string{"/a"}, FingerprintExclude: []string{"/b"}}, "include or exclude, not both"},
		{"raw", Config{Fingerprint: BodyRaw, FingerprintExclude: []string{"/b"}}, "fingerprint raw cannot select members"},
		{"graphql", Config{Fingerprint: BodyGraphQL, FingerprintInclude: []string{"/a"}}, "fingerprint graphql cannot select members"},
		{"pointer", Config{FingerprintExclude: []string{"/ok", "ts"}}, `JSON pointer "ts" must start with /`},
		{"dash", Config{FingerprintInclude: []string{"/items/-"}}, `"-" names no element`},
	} {
		tc.cfg.Ledger = memory.New()
		tc.cfg.Providers = []Provider{{Name: "default"}}
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
