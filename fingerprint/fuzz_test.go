package fingerprint

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
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
