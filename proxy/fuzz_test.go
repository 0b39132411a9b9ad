package proxy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// graphqlSeeds are documents worth mutating: every kind of definition,
// selection and value, the lexical forms that normalize (comments, commas,
// block strings, escapes, BOM, CR LF) and some that must not parse.
var graphqlSeeds = []string{
	`{ a }`,
	`query { a b c }`,
	`mutation Pay($amount: Int! = 1 @d, $card: [String!]) @live { charge(amount: $amount, card: $card) @include(if: true) { id alias: status } }`,
	`subscription S { events(since: "2024-01-01") { id } }`,
	"# comment\nmutation {\r\n  a, b # trailing\n}\n",
	"\ufeffmutation { a }",
	`mutation { a(s: """
    block
      indented
  """) }`,
	`mutation { a(s: """say \"""""") }`,
	`mutation { a(s: "\u0041\u{1F600}\ud83d\ude00\/\"\\\b\f\n\r\t") }`,
	`mutation { a(s: "\ud800") }`,
	`mutation { a(o: {x: 1, y: [1.5e3, -0, null, true, ENUM, $v, {z: "w"}]}) }`,
	`fragment F on T { x } mutation M { a { ...F @skip(if: false) ... on T { y } ... @d { z } ... { w } } }`,
	`fragment F($v: Int = 1) on T { x(v: $v) } query { ...F }`,
	`"Description." mutation M("Var." $v: Int) { a(v: $v) }`,
	`query Q { a } mutation M { b }`,
	`type Query { a: Int }`,
	`mutation { a(b: ) }`,
	`mutation {`,
	`{ a(b: "` + "\x00" + `") }`,
	`{ a(b: 1a) }`,
	`{ ` + strings.Repeat(`a{`, 50) + `b` + strings.Repeat(`}`, 50) + ` }`,
	``,
}

// FuzzGraphQLNormalize checks ParseGraphQL on arbitrary documents, operation
// names and bodies: it does not panic, it is deterministic, and the
// canonical form is a fixed point: a body holding the printed document
// parses to the same canonical encoding.
func FuzzGraphQLNormalize(f *testing.F) {
	for _, q := range graphqlSeeds {
		f.Add(q, "", []byte(gql(q, "", "")))
	}
	f.Add(`query Q { a } mutation M { b }`, "M", []byte(`{"query":"query Q { a } mutation M { b }","operationName":"Q"}`))
	f.Add(`mutation M { a }`, "N", []byte(`{"query":"mutation { a }","variables":{"b":1,"a":[{"y":2,"x":1}]},"extensions":{"k":"v"}}`))
	f.Add(`mutation { a }`, "", []byte(`{"query":"mutation { a }","variables":null,"operationName":null}`))
	f.Add(`mutation { a }`, "", []byte(`[{"query":"mutation { a }"}]`))
	f.Add(`mutation { a }`, "", []byte(`{"query":"mutation { a }","query":"query { a }"}`))
	f.Add(`mutation { a }`, "", []byte(`{"query":1}`))
	f.Add(`mutation { a }`, "", []byte(`{"query":"mutation { a }","variables":[]}`))

	f.Fuzz(func(t *testing.T, query, operationName string, body []byte) {
		built, err := json.Marshal(map[string]string{"query": query, "operationName": operationName})
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{built, body} {
			g, ok := ParseGraphQL(b)
			g2, ok2 := ParseGraphQL(b)
			if ok != ok2 || !bytes.Equal(g.Canonical, g2.Canonical) || g.Mutation != g2.Mutation {
				t.Fatalf("ParseGraphQL(%q) is not deterministic", b)
			}
			if !ok {
				continue
			}
			checkGraphQLFixedPoint(t, b, g)
		}
	})
}

// checkGraphQLFixedPoint re-parses b with its document replaced by the
// printed canonical document, and wants the same request back.
func checkGraphQLFixedPoint(t *testing.T, b []byte, g GraphQLRequest) {
	t.Helper()
	var members map[string]json.RawMessage
	if err := json.Unmarshal(b, &members); err != nil {
		t.Fatalf("ParseGraphQL accepted %q, which does not decode: %v", b, err)
	}
	var query string
	if err := json.Unmarshal(members["query"], &query); err != nil {
		t.Fatalf("ParseGraphQL accepted %q, whose query does not decode: %v", b, err)
	}
	doc, ok := parseDocument(query)
	if !ok {
		t.Fatalf("ParseGraphQL accepted %q, whose document does not parse", b)
	}
	printed := printDocument(doc)
	again, ok := parseDocument(string(printed))
	if !ok {
		t.Fatalf("printed document %q (from %q) does not parse", printed, query)
	}
	if reprinted := printDocument(again); !bytes.Equal(reprinted, printed) {
		t.Fatalf("printing is not idempotent:\n  source %q\n  printed %q\n  again   %q", query, printed, reprinted)
	}
	q, err := json.Marshal(string(printed))
	if err != nil {
		t.Fatal(err)
	}
	members["query"] = q
	rebuilt, err := json.Marshal(members)
	if err != nil {
		t.Fatal(err)
	}
	g2, ok := ParseGraphQL(rebuilt)
	if !ok {
		t.Fatalf("the body with the printed document, %q, does not parse", rebuilt)
	}
	if !bytes.Equal(g2.Canonical, g.Canonical) || g2.Mutation != g.Mutation {
		t.Fatalf("canonical form is not a fixed point:\n  body    %q\n  canon   %q\n  rebuilt %q\n  canon   %q", b, g.Canonical, rebuilt, g2.Canonical)
	}
}

// FuzzCanonicalJSON checks CanonicalJSON: it does not panic, it is
// deterministic, it accepts only valid JSON, its output is valid JSON that
// means the same and is its own canonical form.
func FuzzCanonicalJSON(f *testing.F) {
	for _, s := range []string{
		`{"b":1,"a":2,"c":3}`,
		" {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } } \n",
		`{"z":{"y":1,"x":[{"q":1,"p":2}]},"a":null}`,
		`[true,false,null,"",{},[]]`,
		`[1,1.0,1e2,1E+2,-0,0.10,123456789012345678901234567890]`,
		`"\u0041\u00e9\u4e16\/\"\\\b\f\n\r\t\u0001\u001f\u007f"`,
		`"\ud83d\ude00"`,
		`"\ud800"`,
		`"\udc00\ud800"`,
		`["\uD83Dx"]`,
		`"\\ud800"`,
		`{"\u0062":1,"a":2}`,
		`{"a":1,"\u0061":2}`,
		`{"b":1,"B":2,"é":3,"a":4}`,
		"\"\xff\"",
		"\"\u2028\u2029\"",
		`{"a":1} x`,
		`[1,2,]`,
		`[01]`,
		` "x" `,
		``,
		strings.Repeat("[", 200) + strings.Repeat("]", 200),
		gql(`mutation { a }`, "M", `{"v":{"b":1,"a":2}}`),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, ok := CanonicalJSON(body)
		out2, ok2 := CanonicalJSON(body)
		if ok != ok2 || !bytes.Equal(out, out2) {
			t.Fatalf("CanonicalJSON(%q) is not deterministic", body)
		}
		if !ok {
			return
		}
		if !json.Valid(body) {
			t.Fatalf("CanonicalJSON accepted invalid JSON %q", body)
		}
		if !json.Valid(out) {
			t.Fatalf("CanonicalJSON(%q) = %q, which is not valid JSON", body, out)
		}
		again, ok := CanonicalJSON(out)
		if !ok || !bytes.Equal(again, out) {
			t.Fatalf("CanonicalJSON(%q) = %q, not a fixed point: %q, %v", body, out, again, ok)
		}
		if a, b := decodeJSON(t, body), decodeJSON(t, out); !reflect.DeepEqual(a, b) {
			t.Fatalf("CanonicalJSON(%q) = %q, which means something else: %#v and %#v", body, out, a, b)
		}
	})
}

func decodeJSON(t *testing.T, b []byte) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %q: %v", b, err)
	}
	return v
}

// keySeeds are header values worth mutating: bare and quoted keys, every
// escape, the edges of the length and character range, and broken quoting.
var keySeeds = []string{
	"abc",
	"8e03978e-40d5-43e8-bc93-6894a57f9324",
	`"abc"`,
	`"a\"b"`,
	`"a\\b"`,
	`"\"\\"`,
	`a"b`,
	`abc"`,
	`"abc`,
	`"`,
	`""`,
	`"a\b"`,
	`"ab"c`,
	"a b",
	"a\tb",
	"a\r\nb",
	"a\x00b",
	"caf\u00e9",
	"\"caf\u00e9\"",
	"a\x7fb",
	"!",
	"~",
	strings.Repeat("k", MaxKeyLength),
	strings.Repeat("k", MaxKeyLength+1),
	`"` + strings.Repeat(`\"`, MaxKeyLength) + `"`,
	`"` + strings.Repeat(`\\`, MaxKeyLength+1) + `"`,
	"",
}

// FuzzParseKey checks ParseKey against the grammar written out again
// (referenceKey): it does not panic, accepts exactly what the grammar
// accepts with the same result, returns one of its own errors and no key
// with an error, and the RFC 8941 string of an accepted key parses back to
// that key (as does the key itself, when it does not start with a quote).
func FuzzParseKey(f *testing.F) {
	for _, s := range keySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseKey(v)
		want, ok := referenceKey(v)
		if err != nil {
			if ok {
				t.Fatalf("ParseKey(%q) = %v; the grammar gives %q", v, err, want)
			}
			if got != "" {
				t.Fatalf("ParseKey(%q) returned %q with its error %v", v, got, err)
			}
			if !errors.Is(err, errKeyEmpty) && !errors.Is(err, errKeyLong) &&
				!errors.Is(err, errKeyChars) && !errors.Is(err, errKeyQuoting) {
				t.Fatalf("ParseKey(%q): error %v is none of the key errors", v, err)
			}
			return
		}
		if !ok || got != want {
			t.Fatalf("ParseKey(%q) = %q; the grammar gives %q, %v", v, got, want, ok)
		}
		if len(got) < 1 || len(got) > MaxKeyLength {
			t.Fatalf("ParseKey(%q) = %q: %d bytes", v, got, len(got))
		}
		for i := 0; i < len(got); i++ {
			if got[i] < 0x21 || got[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x is not visible ASCII", v, got, got[i])
			}
		}
		if again, err := ParseKey(quoteKey(got)); err != nil || again != got {
			t.Fatalf("the quoted form %q of %q parses to %q, %v", quoteKey(got), got, again, err)
		}
		if got[0] != '"' {
			if again, err := ParseKey(got); err != nil || again != got {
				t.Fatalf("the bare key %q parses to %q, %v", got, again, err)
			}
		}
	})
}

// referenceKey is the key grammar of docs/contract.md (section 4,
// "Keys") written the long way: a
// value that starts with DQUOTE is an RFC 8941 sf-string, whose content is
// the key; anything else is the key as is; the key is 1-255 bytes of
// %x21-7E.
func referenceKey(v string) (string, bool) {
	key := v
	if strings.HasPrefix(v, `"`) {
		if len(v) < 2 || !strings.HasSuffix(v, `"`) {
			return "", false
		}
		var b strings.Builder
		escaped := false
		for _, c := range []byte(v[1 : len(v)-1]) {
			switch {
			case escaped:
				if c != '"' && c != '\\' {
					return "", false
				}
				b.WriteByte(c)
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"' || c < 0x20 || c > 0x7e:
				return "", false
			default:
				b.WriteByte(c)
			}
		}
		if escaped {
			return "", false
		}
		key = b.String()
	}
	if len(key) == 0 || len(key) > MaxKeyLength {
		return "", false
	}
	for _, c := range []byte(key) {
		if c < 0x21 || c > 0x7e {
			return "", false
		}
	}
	return key, true
}

// quoteKey returns the RFC 8941 string of a key.
func quoteKey(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

// FuzzOwner checks how owners separate jobs, through the middleware: a
// request with no owner is refused (401) and nothing runs; two requests
// with one key and one body name one job when their owners are equal, and
// two jobs, each executed, when they differ; neither owner's retry sees
// the other's answer. The stored owner hashes are fixed-size digests that
// never equal a key's hash and never carry the owner in clear.
func FuzzOwner(f *testing.F) {
	for _, s := range [][2]string{
		{"Bearer alice", "Bearer bob"},
		{"Bearer alice", "Bearer alice"},
		{"Bearer alice", "bearer alice"},
		{"Bearer alice", "Bearer alice "},
		{"", "Bearer bob"},
		{"Bearer alice", ""},
		{"user:1", "authorization:1"},
		{"a\x00b", "a"},
		{"caf\u00e9", "cafe\u0301"},
		{"\xff\xfe", "\xfe\xff"},
		{strings.Repeat("x", 4096), strings.Repeat("x", 4095)},
	} {
		f.Add(s[0], s[1], "shared-key", []byte(nil))
		f.Add(s[0], s[1], `"shared-key"`, []byte("s3cret"))
	}
	f.Add("Bearer alice", "Bearer bob", "bad key", []byte(nil))
	f.Add("Bearer alice", "Bearer bob", "", []byte("s"))

	f.Fuzz(func(t *testing.T, ownerA, ownerB, key string, secret []byte) {
		hs := NewHasher(secret)
		for _, o := range []string{ownerA, ownerB} {
			h := hs.Owner(o)
			if len(h) != 32 || !bytes.Equal(h, NewHasher(secret).Owner(o)) {
				t.Fatalf("owner hash of %q: %x, not a deterministic SHA-256 size digest", o, h)
			}
			if bytes.Equal(h, hs.Key(o)) {
				t.Fatalf("owner %q and key %q hash alike", o, o)
			}
			if len(o) >= 8 && bytes.Contains(h, []byte(o)) {
				t.Fatalf("owner hash %x holds the owner %q", h, o)
			}
		}
		if (ownerA == ownerB) != bytes.Equal(hs.Owner(ownerA), hs.Owner(ownerB)) {
			t.Fatalf("owners %q and %q: equal %v, hashes equal %v", ownerA, ownerB, ownerA == ownerB, !(ownerA == ownerB))
		}

		h := newHarness(t, Config{OwnerSecret: secret}, nil)
		send := func(owner string) *httptest.ResponseRecorder {
			r := post("", `{"amount":1}`)
			r.Header[DefaultKeyHeader] = []string{key}
			if owner == "" {
				delete(r.Header, "Authorization")
			} else {
				r.Header["Authorization"] = []string{owner}
			}
			return h.do(r)
		}
		if _, err := ParseKey(key); err != nil {
			rec := send(ownerA)
			if ownerA != "" || rec.Code != http.StatusUnauthorized {
				wantProblem(t, rec, http.StatusBadRequest, ProblemKeyInvalid)
			}
			if h.up.calls() != 0 {
				t.Fatalf("a request with the invalid key %q was forwarded", key)
			}
			return
		}
		a := send(ownerA)
		if ownerA == "" {
			wantProblem(t, a, http.StatusUnauthorized, ProblemOwnerMissing)
			if h.up.calls() != 0 {
				t.Fatal("a request with no owner was forwarded")
			}
			if page, err := h.l.Jobs(context.Background(), ledger.JobQuery{}); err != nil || len(page.Jobs) != 0 {
				t.Fatalf("a request with no owner left jobs %v, %v", page.Jobs, err)
			}
			return
		}
		h.waitRun()
		if a.Code != http.StatusCreated || a.Header().Get(HeaderReplayed) != "" {
			t.Fatalf("owner %q: status %d, replayed %q", ownerA, a.Code, a.Header().Get(HeaderReplayed))
		}
		b := send(ownerB)
		switch {
		case ownerB == "":
			wantProblem(t, b, http.StatusUnauthorized, ProblemOwnerMissing)
		case ownerB == ownerA:
			if b.Header().Get(HeaderReplayed) != "true" || b.Body.String() != a.Body.String() || jobID(t, a) != jobID(t, b) {
				t.Fatalf("one owner %q: the retry is not a replay of the first answer: %d %s", ownerA, b.Code, b.Body)
			}
		default:
			h.waitRun()
			if b.Code != http.StatusCreated || b.Header().Get(HeaderReplayed) != "" ||
				b.Body.String() == a.Body.String() || jobID(t, a) == jobID(t, b) {
				t.Fatalf("owners %q and %q share a job: %d %s / %s", ownerA, ownerB, b.Code, b.Body, a.Body)
			}
			if again := send(ownerB); again.Body.String() != b.Body.String() || again.Header().Get(HeaderReplayed) != "true" {
				t.Fatalf("owner %q's retry got %d %s", ownerB, again.Code, again.Body)
			}
		}
		if again := send(ownerA); again.Body.String() != a.Body.String() || again.Header().Get(HeaderReplayed) != "true" {
			t.Fatalf("owner %q's retry got %d %s", ownerA, again.Code, again.Body)
		}
		want := 1
		if ownerB != "" && ownerB != ownerA {
			want = 2
		}
		if h.up.calls() != want {
			t.Fatalf("upstream called %d times, want %d", h.up.calls(), want)
		}
		page, err := h.l.Jobs(context.Background(), ledger.JobQuery{})
		if err != nil || len(page.Jobs) != want {
			t.Fatalf("%d jobs (%v), want %d", len(page.Jobs), err, want)
		}
		for _, j := range page.Jobs {
			if !bytes.Equal(j.OwnerHash, hs.Owner(ownerA)) && !bytes.Equal(j.OwnerHash, hs.Owner(ownerB)) {
				t.Fatalf("job %s has owner hash %x, neither owner's", j.ID, j.OwnerHash)
			}
		}
	})
}
