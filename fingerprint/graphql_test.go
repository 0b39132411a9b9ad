package fingerprint

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
)

// gql returns a GraphQL-over-HTTP body; op and vars are left out when empty.
func gql(query, op, vars string) string {
	m := map[string]any{"query": query}
	if op != "" {
		m["operationName"] = op
	}
	if vars != "" {
		m["variables"] = json.RawMessage(vars)
	}
	b, err := json.Marshal(m)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func gqlFP() Fingerprinter { return Fingerprinter{mode: BodyGraphQL} }

func mustParseGraphQL(t *testing.T, body string) GraphQLRequest {
	t.Helper()
	g, ok := ParseGraphQL([]byte(body))
	if !ok {
		t.Fatalf("ParseGraphQL(%s) failed", body)
	}
	return g
}

func TestFingerprintGraphQLEqual(t *testing.T) {
	const pay = `mutation Pay($amount: Int!) { pay(amount: $amount, currency: "EUR") { id status } }`
	tests := []struct {
		name, a, b string
	}{
		{"identical", gql(pay, "", `{"amount":1}`), gql(pay, "", `{"amount":1}`)},
		{"white space", gql(pay, "", ""),
			gql("mutation   Pay ( $amount :Int! ){pay(amount:$amount currency:\"EUR\"){id\tstatus}}", "", "")},
		{"line breaks", gql("mutation Pay($amount: Int!) {\n  pay(amount: $amount, currency: \"EUR\") {\n    id\n    status\n  }\n}\n", "", ""),
			gql("mutation Pay($amount: Int!) {\r\n  pay(amount: $amount, currency: \"EUR\") {\r\n    id\r\n    status\r\n  }\r\n}\r\n", "", "")},
		{"commas", gql(pay, "", ""),
			gql(`mutation Pay($amount: Int!,) {,pay(amount: $amount,,, currency: "EUR",) { id, status, } }`, "", "")},
		{"comments", gql(pay, "", ""),
			gql("# pay once\nmutation Pay($amount: Int!) { # the charge\n pay(amount: $amount, currency: \"EUR\") { id # its id\n status } }\n# end", "", "")},
		{"byte order mark", gql(pay, "", ""), gql("\ufeff"+pay, "", "")},
		{"description", gql(pay, "", ""), gql(`"Pays." `+pay, "", "")},
		{"block string", gql(`mutation { a(s: "hi") }`, "", ""), gql(`mutation { a(s: """hi""") }`, "", "")},
		{"indented block string", gql(`mutation { a(s: "x\ny") }`, "", ""),
			gql("mutation { a(s: \"\"\"\n      x\n      y\n    \"\"\") }", "", "")},
		{"escaped quotes in a block string", gql(`mutation { a(s: "say \"\"\"") }`, "", ""), gql(`mutation { a(s: """say \"""""") }`, "", "")},
		{"unicode escape", gql(`mutation { a(s: "A") }`, "", ""), gql(`mutation { a(s: "\u0041") }`, "", "")},
		{"braced unicode escape", gql(`mutation { a(s: "😀") }`, "", ""), gql(`mutation { a(s: "\u{1F600}") }`, "", "")},
		{"surrogate pair escape", gql(`mutation { a(s: "😀") }`, "", ""), gql(`mutation { a(s: "\ud83d\ude00") }`, "", "")},
		{"escaped solidus", gql(`mutation { a(s: "/") }`, "", ""), gql(`mutation { a(s: "\/") }`, "", "")},
		{"escaped control character", gql(`mutation { a(s: "\n") }`, "", ""), gql(`mutation { a(s: "\u000A") }`, "", "")},
		{"alias equal to the name", gql(`mutation { pay { id } }`, "", ""), gql(`mutation { pay: pay { id } }`, "", "")},
		{"fragment before the operation", gql(`mutation { pay { ...F } } fragment F on P { id }`, "", ""),
			gql(`fragment F on P { id } mutation { pay { ...F } }`, "", "")},
		{"query shorthand", gql(`{ a }`, "", ""), gql(`query { a }`, "", "")},
		{"variable key order", gql(pay, "", `{"amount":1,"meta":{"a":1,"b":2}}`), gql(pay, "", `{"meta":{"b":2,"a":1},"amount":1}`)},
		{"variable white space and escapes", gql(pay, "", `{"s":"A"}`), gql(pay, "", ` { "s" : "\u0041" } `)},
		{"variables absent and null", gql(pay, "", ""), gql(pay, "", `null`)},
		{"variables absent and empty", gql(pay, "", ""), gql(pay, "", `{}`)},
		{"operationName absent and null", gql(`mutation { a }`, "", ""), `{"query":"mutation { a }","operationName":null}`},
		{"operationName absent and empty", gql(`mutation { a }`, "", ""), `{"query":"mutation { a }","operationName":""}`},
		{"body member order", `{"query":"mutation { a }","variables":{"x":1},"extensions":{"k":1}}`,
			`{"extensions":{"k":1},"variables":{"x":1},"query":"mutation { a }"}`},
		{"body white space and escapes", `{"query":"mutation { a }"}`, "{ \"query\" : \"\\u006dutation {\\n a }\" }\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mustParseGraphQL(t, tt.a)
			mustParseGraphQL(t, tt.b)
			if a, b := sum(gqlFP(), tt.a), sum(gqlFP(), tt.b); !bytes.Equal(a, b) {
				t.Errorf("%s and %s have different fingerprints", tt.a, tt.b)
			}
		})
	}
}

func TestFingerprintGraphQLDifferent(t *testing.T) {
	tests := []struct {
		name, a, b string
	}{
		{"field order", gql(`mutation { pay { id status } }`, "", ""), gql(`mutation { pay { status id } }`, "", "")},
		{"argument order", gql(`mutation { pay(a: 1, b: 2) }`, "", ""), gql(`mutation { pay(b: 2, a: 1) }`, "", "")},
		{"argument value", gql(`mutation { pay(a: 1) }`, "", ""), gql(`mutation { pay(a: 2) }`, "", "")},
		{"1 and 1.0", gql(`mutation { pay(a: 1) }`, "", ""), gql(`mutation { pay(a: 1.0) }`, "", "")},
		{"number and string", gql(`mutation { pay(a: 1) }`, "", ""), gql(`mutation { pay(a: "1") }`, "", "")},
		{"enum and string", gql(`mutation { pay(a: EUR) }`, "", ""), gql(`mutation { pay(a: "EUR") }`, "", "")},
		{"string value", gql(`mutation { pay(a: "x") }`, "", ""), gql(`mutation { pay(a: "x ") }`, "", "")},
		{"object field order", gql(`mutation { pay(a: {x: 1, y: 2}) }`, "", ""), gql(`mutation { pay(a: {y: 2, x: 1}) }`, "", "")},
		{"list order", gql(`mutation { pay(a: [1, 2]) }`, "", ""), gql(`mutation { pay(a: [2, 1]) }`, "", "")},
		{"alias", gql(`mutation { pay { id } }`, "", ""), gql(`mutation { p: pay { id } }`, "", "")},
		{"directive", gql(`mutation { pay { id } }`, "", ""), gql(`mutation { pay @idem { id } }`, "", "")},
		{"directive on a variable", gql(`mutation($a: Int) { pay(a: $a) }`, "", ""), gql(`mutation($a: Int @d) { pay(a: $a) }`, "", "")},
		{"variable default", gql(`mutation($a: Int) { pay(a: $a) }`, "", ""), gql(`mutation($a: Int = 1) { pay(a: $a) }`, "", "")},
		{"variable type", gql(`mutation($a: Int) { pay(a: $a) }`, "", ""), gql(`mutation($a: Int!) { pay(a: $a) }`, "", "")},
		{"operation type", gql(`query { pay }`, "", ""), gql(`mutation { pay }`, "", "")},
		{"operation name", gql(`mutation A { pay }`, "", ""), gql(`mutation B { pay }`, "", "")},
		{"fragment", gql(`mutation { pay { ...F } } fragment F on P { id }`, "", ""),
			gql(`mutation { pay { ...F } } fragment F on P { status }`, "", "")},
		{"variables", gql(`mutation { pay }`, "", `{"a":1}`), gql(`mutation { pay }`, "", `{"a":2}`)},
		{"variable number and string", gql(`mutation { pay }`, "", `{"a":1}`), gql(`mutation { pay }`, "", `{"a":"1"}`)},
		{"variable null and absent", gql(`mutation { pay }`, "", `{"a":null}`), gql(`mutation { pay }`, "", `{}`)},
		{"operationName", gql(`mutation A { a } mutation B { b }`, "A", ""), gql(`mutation A { a } mutation B { b }`, "B", "")},
		// operationName enters as given, even when it names the only
		// operation.
		{"operationName absent and given", gql(`mutation A { a }`, "", ""), gql(`mutation A { a }`, "A", "")},
		{"extensions", `{"query":"mutation { a }","extensions":{"k":1}}`, `{"query":"mutation { a }","extensions":{"k":2}}`},
		{"extensions and none", `{"query":"mutation { a }","extensions":{}}`, `{"query":"mutation { a }"}`},
		{"U+FFFD and a lone surrogate escape", gql(`mutation { a(s: "\ufffd") }`, "", ""), gql(`mutation { a(s: "\ud800") }`, "", "")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := sum(gqlFP(), tt.a), sum(gqlFP(), tt.b); bytes.Equal(a, b) {
				t.Errorf("%s and %s have the same fingerprint", tt.a, tt.b)
			}
		})
	}
}

func TestParseGraphQL(t *testing.T) {
	const two = `query Q { a } mutation M { b }`
	tests := []struct {
		name     string
		body     string
		mutation bool
	}{
		{"query", gql(`query { a }`, "", ""), false},
		{"query shorthand", gql(`{ a }`, "", ""), false},
		{"named query", gql(`query Q { a }`, "", ""), false},
		{"mutation", gql(`mutation { a }`, "", ""), true},
		{"named mutation", gql(`mutation M($x: Int) { a(x: $x) }`, "", `{"x":1}`), true},
		{"subscription", gql(`subscription { a }`, "", ""), false},
		{"mutation named among several", gql(two, "M", ""), true},
		{"query named among several", gql(two, "Q", ""), false},
		{"operationName naming the only operation", gql(`mutation M { a }`, "M", ""), true},
		{"mutation with fragments", gql(`fragment F on T { x } mutation { a { ...F } } fragment G on T { y }`, "", ""), true},
		{"mutation with an operation description", gql(`"Pays." mutation { a }`, "", ""), true},
		{"other members", `{"query":"mutation { a }","extensions":{"persistedQuery":{"version":1}}}`, true},
		{"null variables and operationName", `{"query":"mutation { a }","variables":null,"operationName":null}`, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, ok := ParseGraphQL([]byte(tt.body))
			if !ok {
				t.Fatalf("ParseGraphQL(%s) failed", tt.body)
			}
			if g.Mutation != tt.mutation {
				t.Errorf("ParseGraphQL(%s).Mutation = %v, want %v", tt.body, g.Mutation, tt.mutation)
			}
		})
	}
}

func TestParseGraphQLRejects(t *testing.T) {
	const two = `query Q { a } mutation M { b }`
	tests := []struct {
		name, body string
	}{
		{"several operations and no name", gql(two, "", "")},
		{"unknown operationName", gql(two, "X", "")},
		{"operationName naming no operation", gql(`mutation M { a }`, "N", "")},
		{"operationName and an anonymous operation", gql(`mutation { a }`, "M", "")},
		{"two operations of that name", gql(`mutation M { a } mutation M { b }`, "M", "")},
		{"only fragments", gql(`fragment F on T { x }`, "", "")},
		{"empty document", gql(``, "", "")},
		{"comment only", gql(`# mutation { a }`, "", "")},
		{"unparseable document", gql(`mutation { a `, "", "")},
		{"missing argument value", gql(`mutation { a(b: ) }`, "", "")},
		{"schema definition", gql(`type Mutation { a: Int }`, "", "")},
		{"lone surrogate escape in the document", gql(`mutation { a(s: "\ud800") }`, "", "")},
		{"missing query", `{"variables":{},"operationName":"M"}`},
		{"persisted query without a document", `{"extensions":{"persistedQuery":{"version":1,"sha256Hash":"abc"}}}`},
		{"null query", `{"query":null}`},
		{"query not a string", `{"query":1}`},
		{"query an object", `{"query":{"mutation":"a"}}`},
		{"operationName not a string", `{"query":"mutation { a }","operationName":1}`},
		{"variables an array", `{"query":"mutation { a }","variables":[1]}`},
		{"variables a string", `{"query":"mutation { a }","variables":"{}"}`},
		{"array", `[{"query":"mutation { a }"}]`},
		{"string", `"mutation { a }"`},
		{"null", `null`},
		{"empty body", ``},
		{"not JSON", `mutation { a }`},
		{"truncated JSON", `{"query":"mutation { a }"`},
		{"duplicate key", `{"query":"query { a }","query":"mutation { a }"}`},
		{"invalid UTF-8", "{\"query\":\"mutation { a(s: \\\"\xff\\\") }\"}"},
		{"lone surrogate in the JSON", `{"query":"mutation { a(s: \"\ud800\") }"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if g, ok := ParseGraphQL([]byte(tt.body)); ok {
				t.Fatalf("ParseGraphQL(%s) accepted: %q, mutation %v", tt.body, g.Canonical, g.Mutation)
			}
		})
	}
}

// The canonical encoding is exactly four length-prefixed parts: document,
// operationName, variables, other members.
func TestGraphQLCanonicalParts(t *testing.T) {
	g := mustParseGraphQL(t, `{"query":"mutation A { a }","operationName":"A","variables":{"x":"y"},"extensions":{"e":1}}`)
	var parts []string
	for rest := g.Canonical; len(rest) > 0; {
		n, k := binary.Uvarint(rest)
		if k <= 0 || uint64(len(rest)-k) < n {
			t.Fatalf("canonical encoding %q is not a sequence of length-prefixed parts", g.Canonical)
		}
		parts = append(parts, string(rest[k:k+int(n)]))
		rest = rest[k+int(n):]
	}
	want := []string{`mutation A{a}`, `A`, `{"x":"y"}`, `{"extensions":{"e":1}}`}
	if !slices.Equal(parts, want) {
		t.Errorf("parts %q, want %q", parts, want)
	}
}

// A body that is not a GraphQL request is hashed exactly as raw mode hashes
// it; one that is, is not.
func TestFingerprintGraphQLFallsBackToRaw(t *testing.T) {
	for _, body := range []string{`{"query":"mutation {"}`, `[1]`, `{"a":1}`, gql(`query Q { a } query R { b }`, "", ""), ``} {
		if !bytes.Equal(sum(gqlFP(), body), sum(rawFP(), body)) {
			t.Errorf("%s: graphql mode does not fall back to the raw hash", body)
		}
	}
	body := gql(`mutation { a }`, "", "")
	if bytes.Equal(sum(gqlFP(), body), sum(rawFP(), body)) {
		t.Error("a GraphQL body is hashed raw in graphql mode")
	}
	if bytes.Equal(sum(gqlFP(), body), sum(jsonFP(), body)) {
		t.Error("a GraphQL body is hashed as JSON in graphql mode")
	}
	// A raw body whose bytes are a GraphQL body's canonical encoding does
	// not collide with it.
	g := mustParseGraphQL(t, body)
	if bytes.Equal(sum(gqlFP(), body), sum(gqlFP(), string(g.Canonical))) {
		t.Error("a raw body equal to a GraphQL body's canonical encoding has the same fingerprint")
	}
}

// SumGraphQL, given ParseGraphQL's result, computes what Sum does.
func TestSumGraphQL(t *testing.T) {
	f := Fingerprinter{mode: BodyGraphQL, headers: []string{"X-Account"}}
	h := http.Header{"X-Account": {"1"}}
	for _, body := range []string{
		gql(`mutation { a }`, "", `{"x":1}`),
		gql(`query { a }`, "", ""),
		`{"query":"mutation {"}`,
		`not json`,
		``,
	} {
		var gp *GraphQLRequest
		if g, ok := ParseGraphQL([]byte(body)); ok {
			gp = &g
		}
		want := f.Sum("POST", "/graphql", h, []byte(body))
		if got := f.SumGraphQL("POST", "/graphql", h, gp, []byte(body)); !bytes.Equal(got, want) {
			t.Errorf("%s: SumGraphQL differs from Sum", body)
		}
	}
	// Outside graphql mode the parsed request is ignored.
	body := gql(`mutation { a }`, "", "")
	g := mustParseGraphQL(t, body)
	for _, mode := range []BodyMode{BodyJSON, BodyRaw} {
		f := Fingerprinter{mode: mode}
		if !bytes.Equal(f.SumGraphQL("POST", "/", nil, &g, []byte(body)), f.Sum("POST", "/", nil, []byte(body))) {
			t.Errorf("%v mode: SumGraphQL differs from Sum", mode)
		}
	}
}

func TestPrintDocument(t *testing.T) {
	const doc = `# pay
"Charges a card."
mutation Pay($amount: Int! = 1 @deprecated, $card: [String!], "The note." $note: String) @live {
  charge(amount: $amount, card: $card, meta: {note: """
      hi
        there
    """, tags: [A, "b\u00e9\"", -1.5e3, null, true, 0]}) @include(if: true) {
    id,
    alias: status
    status: status
    ...F @skip(if: false)
    ... on Charge { fee }
    ... @skip(if: false) { x }
    ... { y }
  }
}
fragment F on Charge { created }
{ z }
`
	const want = `mutation Pay($amount:Int!=1@deprecated,$card:[String!],$note:String)@live{` +
		`charge(amount:$amount,card:$card,meta:{note:"hi\u000a  there",tags:[A,"bé\"",-1.5e3,null,true,0]})@include(if:true)` +
		`{id alias:status status ...F@skip(if:false) ...on Charge{fee} ...@skip(if:false){x} ...{y}}}` +
		`query{z}` +
		`fragment F on Charge{created}`
	d, ok := parseDocument(doc)
	if !ok {
		t.Fatal("the document does not parse")
	}
	got := printDocument(d)
	if string(got) != want {
		t.Fatalf("printDocument:\n got %s\nwant %s", got, want)
	}
	again, ok := parseDocument(string(got))
	if !ok {
		t.Fatalf("the printed document does not parse: %s", got)
	}
	if got2 := printDocument(again); !bytes.Equal(got2, got) {
		t.Errorf("printing the printed document changes it:\n%s\n%s", got, got2)
	}
}

// The graphql fingerprint is part of the stored encoding: it must not change
// between releases (or gqlparser upgrades) without a new VersionWhole.
// The golden value was computed outside this package from the encoding
// (see TestFingerprintStable), with 'g', the length of the canonical
// encoding, and the canonical encoding: the uvarint-length-prefixed printed
// document, operationName, variables and other members.
func TestFingerprintGraphQLStable(t *testing.T) {
	if VersionWhole != 1 {
		t.Fatalf("VersionWhole is %d: these golden values are version 1's; keep them and add the new version's", VersionWhole)
	}
	body := `{"query":"# pay\nmutation Pay($a: Int!) {\n  pay(amount: $a, note: \"\"\"hi\"\"\") { id, status }\n}",` +
		`"variables":{"b":[1,2],"a":1},"operationName":"Pay","extensions":{"trace":true}}`
	g := mustParseGraphQL(t, body)
	const wantCanon = "\x3amutation Pay($a:Int!){pay(amount:$a,note:\"hi\"){id status}}" +
		"\x03Pay" + "\x11{\"a\":1,\"b\":[1,2]}" + "\x1d{\"extensions\":{\"trace\":true}}"
	if string(g.Canonical) != wantCanon {
		t.Errorf("canonical encoding %q, want %q", g.Canonical, wantCanon)
	}
	if !g.Mutation {
		t.Error("not a mutation")
	}
	f := Fingerprinter{mode: BodyGraphQL, headers: []string{"X-Account"}}
	got := hex.EncodeToString(f.Sum("POST", "/graphql", http.Header{"X-Account": {"acct_1"}}, []byte(body)))
	const want = "557116cbd49fcab9fc571b16eae9d656fb005820f82557785669d57c219fae48"
	if got != want {
		t.Errorf("graphql fingerprint = %s, want %s", got, want)
	}
}
