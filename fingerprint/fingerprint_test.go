package fingerprint

import (
	"bytes"
	"encoding/hex"
	"net/http"
	"strings"
	"testing"
)

func TestCanonicalJSON(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"object keys sorted", `{"b":1,"a":2,"c":3}`, `{"a":2,"b":1,"c":3}`},
		{"white space dropped", " {\n\t\"a\" : [ 1 , 2 ] ,\r\n \"b\" : { } } \n", `{"a":[1,2],"b":{}}`},
		{"nested objects sorted", `{"z":{"y":1,"x":[{"q":1,"p":2}]},"a":null}`, `{"a":null,"z":{"x":[{"p":2,"q":1}],"y":1}}`},
		{"array order kept", `[3,1,2]`, `[3,1,2]`},
		{"empty containers", `[{},[],""]`, `[{},[],""]`},
		{"literals", `[true,false,null]`, `[true,false,null]`},
		{"numbers as written", `[1,1.0,1e2,1E+2,-0,0.10]`, `[1,1.0,1e2,1E+2,-0,0.10]`},
		{"big number kept", `123456789012345678901234567890`, `123456789012345678901234567890`},
		{"unicode escape unescaped", `"\u0041\u00e9\u4e16"`, "\"A\u00e9\u4e16\""},
		{"solidus unescaped", `"a\/b"`, `"a/b"`},
		{"surrogate pair unescaped", `"\ud83d\ude00"`, "\"\U0001F600\""},
		{"quote and backslash kept escaped", `"\"\\"`, `"\"\\"`},
		{"escaped backslash before u", `"\\ud800"`, `"\\ud800"`},
		{"control characters escaped as \\u", `"\n\t\b\f\r\u0001\u001f"`, `"\u000a\u0009\u0008\u000c\u000d\u0001\u001f"`},
		{"DEL and non-ASCII raw", "\"\u007f\u00e9\"", "\"\u007f\u00e9\""},
		{"escaped key", `{"\u0062":1,"a":2}`, `{"a":2,"b":1}`},
		{"keys sorted by bytes", `{"b":1,"B":2,"\u00e9":3,"a":4}`, "{\"B\":2,\"a\":4,\"b\":1,\"\u00e9\":3}"},
		{"top-level string", ` "x" `, `"x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := CanonicalJSON([]byte(tt.in))
			if !ok || string(got) != tt.want {
				t.Fatalf("CanonicalJSON(%s) = %s, %v; want %s", tt.in, got, ok, tt.want)
			}
			// The canonical form is a fixed point.
			again, ok := CanonicalJSON(got)
			if !ok || !bytes.Equal(again, got) {
				t.Errorf("canonical form %s is not canonical: %s, %v", got, again, ok)
			}
		})
	}
}

func TestCanonicalJSONRejects(t *testing.T) {
	tests := []struct {
		name, in string
	}{
		{"empty", ``},
		{"white space only", " \n "},
		{"unterminated object", `{"a":1`},
		{"unterminated string", `{"a":"x}`},
		{"missing value", `{"a"}`},
		{"missing comma", `[1 2]`},
		{"trailing comma", `[1,2,]`},
		{"trailing data", `{"a":1} x`},
		{"two documents", `{"a":1}{"a":1}`},
		{"single quotes", `{'a':1}`},
		{"bad number", `[01]`},
		{"NaN", `NaN`},
		{"raw control character in string", "\"a\nb\""},
		{"duplicate key", `{"a":1,"a":1}`},
		{"duplicate key after others", `{"a":1,"b":2,"a":3}`},
		{"duplicate key after unescaping", `{"a":1,"\u0061":2}`},
		{"nested duplicate key", `{"x":[{"k":1,"k":2}]}`},
		{"invalid UTF-8 in string", "{\"a\":\"\xff\"}"},
		{"invalid UTF-8 in key", "{\"\xc3\":1}"},
		{"lone high surrogate", `{"a":"\ud800"}`},
		{"lone low surrogate", `{"a":"\udc00"}`},
		{"high surrogate before a letter", `["\uD83Dx"]`},
		{"two high surrogates", `["\ud83d\ud83d"]`},
		{"lone surrogate in a key", `{"\ud800":1}`},
		{"nested too deep", strings.Repeat("[", 100000) + strings.Repeat("]", 100000)},
		{"unclosed deep nesting", strings.Repeat(`{"a":[`, 50000)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, ok := CanonicalJSON([]byte(tt.in)); ok {
				t.Fatalf("CanonicalJSON accepted %.40q as %.40q", tt.in, got)
			}
		})
	}
}

// The gateway's own nesting limit does not refuse documents that ordinary
// clients send.
func TestCanonicalJSONModerateNesting(t *testing.T) {
	in := strings.Repeat(`{"a":[`, 500) + "1" + strings.Repeat("]}", 500)
	got, ok := CanonicalJSON([]byte(in))
	if !ok || string(got) != in {
		t.Fatalf("1000 levels of nesting: ok=%v", ok)
	}
}

func jsonFP() Fingerprinter { return Fingerprinter{mode: BodyJSON} }
func rawFP() Fingerprinter  { return Fingerprinter{mode: BodyRaw} }

func sum(f Fingerprinter, body string) []byte {
	return f.Sum(http.MethodPost, "/v1/charges", nil, []byte(body))
}

func TestFingerprintJSONEqual(t *testing.T) {
	tests := []struct {
		name, a, b string
	}{
		{"identical", `{"a":1}`, `{"a":1}`},
		{"key order", `{"a":1,"b":{"c":2,"d":3}}`, `{"b":{"d":3,"c":2},"a":1}`},
		{"white space", `{"a":[1,2]}`, "{ \"a\" :\n\t[ 1 , 2 ] }\n"},
		{"\\u0041 and A", `{"a":"\u0041"}`, `{"a":"A"}`},
		{"escaped key", `{"\u0061":1}`, `{"a":1}`},
		{"escaped non-ASCII", `{"a":"\u00e9"}`, "{\"a\":\"\u00e9\"}"},
		{"escaped solidus", `{"a":"\/"}`, `{"a":"/"}`},
		{"surrogate pair", `{"a":"\ud83d\ude00"}`, "{\"a\":\"\U0001F600\"}"},
		{"escaped control character", `{"a":"\n"}`, `{"a":"\u000A"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := sum(jsonFP(), tt.a), sum(jsonFP(), tt.b); !bytes.Equal(a, b) {
				t.Errorf("%s and %s have different fingerprints", tt.a, tt.b)
			}
		})
	}
}

func TestFingerprintJSONDifferent(t *testing.T) {
	tests := []struct {
		name, a, b string
	}{
		{"value", `{"a":1}`, `{"a":2}`},
		{"1 and 1.0", `{"a":1}`, `{"a":1.0}`},
		{"1e2 and 100", `{"a":1e2}`, `{"a":100}`},
		{"0 and -0", `{"a":0}`, `{"a":-0}`},
		{"number and string", `{"a":1}`, `{"a":"1"}`},
		{"null and missing", `{"a":null}`, `{}`},
		{"array order", `[1,2]`, `[2,1]`},
		{"key case", `{"a":1}`, `{"A":1}`},
		{"empty string and null", `""`, `null`},
		{"distinct invalid UTF-8", "{\"a\":\"\xff\"}", "{\"a\":\"\xfe\"}"},
		{"invalid UTF-8 and U+FFFD", "{\"a\":\"\xff\"}", "{\"a\":\"\ufffd\"}"},
		{"lone surrogate and U+FFFD", `{"a":"\ud800"}`, `{"a":"\ufffd"}`},
		{"two lone surrogates", `{"a":"\ud800"}`, `{"a":"\udbff"}`},
		// Bodies hashed raw keep their white space.
		{"duplicate keys, white space", `{"a":1,"a":1}`, `{"a":1, "a":1}`},
		{"duplicate keys, order", `{"a":1,"a":2}`, `{"a":2,"a":1}`},
		{"invalid JSON, white space", `{"a":1`, `{"a": 1`},
		{"invalid JSON and empty", `x`, ``},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if a, b := sum(jsonFP(), tt.a), sum(jsonFP(), tt.b); bytes.Equal(a, b) {
				t.Errorf("%q and %q have the same fingerprint", tt.a, tt.b)
			}
		})
	}
}

// A body that falls back to raw hashing is hashed exactly as raw mode hashes
// it, and a body that parses is not.
func TestFingerprintJSONFallsBackToRaw(t *testing.T) {
	for _, body := range []string{`{"a":1,"a":2}`, `{"a":`, "\"\xff\"", `"\ud800"`, ``} {
		if !bytes.Equal(sum(jsonFP(), body), sum(rawFP(), body)) {
			t.Errorf("%q: json mode does not fall back to the raw hash", body)
		}
	}
	if bytes.Equal(sum(jsonFP(), `{"a":1}`), sum(rawFP(), `{"a":1}`)) {
		t.Error("a valid JSON body is hashed raw in json mode")
	}
}

// The body's encoding is tagged: a raw body whose bytes are exactly the
// canonical form of another JSON body does not collide with it.
func TestFingerprintBodyTag(t *testing.T) {
	jsonBody := `{ "b": 1, "a": [ 2 ] }`
	canon, ok := CanonicalJSON([]byte(jsonBody))
	if !ok || string(canon) != `{"a":[2],"b":1}` {
		t.Fatalf("canonical form %s, %v", canon, ok)
	}
	if bytes.Equal(sum(jsonFP(), jsonBody), sum(rawFP(), string(canon))) {
		t.Error("a raw body equal to a JSON body's canonical bytes has the same fingerprint")
	}
	// Within json mode, a body that is hashed raw never meets a body hashed
	// canonically, even when one is the other's canonical form plus junk.
	if bytes.Equal(sum(jsonFP(), string(canon)+" x"), sum(jsonFP(), jsonBody)) {
		t.Error("raw and canonical bodies collide in json mode")
	}
}

func TestFingerprintRaw(t *testing.T) {
	f := rawFP()
	if !bytes.Equal(sum(f, `{"a":1}`), sum(f, `{"a":1}`)) {
		t.Error("the same raw body gives different fingerprints")
	}
	for _, pair := range [][2]string{
		{`{"a":1}`, `{"a": 1}`},
		{`{"a":1,"b":2}`, `{"b":2,"a":1}`},
		{`{"a":"\u0041"}`, `{"a":"A"}`},
		{"a", "a\n"},
		{"", " "},
	} {
		if bytes.Equal(sum(f, pair[0]), sum(f, pair[1])) {
			t.Errorf("raw mode: %q and %q have the same fingerprint", pair[0], pair[1])
		}
	}
}

func TestFingerprintRequestParts(t *testing.T) {
	f := Fingerprinter{mode: BodyJSON, headers: []string{"X-Account", "Content-Type"}}
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			h.Add(kv[i], kv[i+1])
		}
		return h
	}
	base := f.Sum("POST", "/pay?x=1", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))
	if len(base) != 32 {
		t.Fatalf("fingerprint is %d bytes, want a SHA-256", len(base))
	}
	same := []struct {
		name string
		got  []byte
	}{
		{"identical", f.Sum("POST", "/pay?x=1", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"header insertion order", f.Sum("POST", "/pay?x=1", hdr("Content-Type", "application/json", "X-Account", "1"), []byte(`{"a":1}`))},
		{"header not listed", f.Sum("POST", "/pay?x=1", hdr("X-Account", "1", "Content-Type", "application/json", "X-Request-Id", "r"), []byte(`{"a":1}`))},
		{"JSON white space", f.Sum("POST", "/pay?x=1", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{ "a" : 1 }`))},
	}
	for _, s := range same {
		if !bytes.Equal(s.got, base) {
			t.Errorf("%s: fingerprint changed", s.name)
		}
	}
	different := []struct {
		name string
		got  []byte
	}{
		{"method", f.Sum("PATCH", "/pay?x=1", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"path", f.Sum("POST", "/pay/?x=1", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"query", f.Sum("POST", "/pay?x=2", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"query encoding", f.Sum("POST", "/pay?x=%31", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"header value", f.Sum("POST", "/pay?x=1", hdr("X-Account", "2", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"header missing", f.Sum("POST", "/pay?x=1", hdr("Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"header empty", f.Sum("POST", "/pay?x=1", hdr("X-Account", "", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"header repeated", f.Sum("POST", "/pay?x=1", hdr("X-Account", "1", "X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":1}`))},
		{"body", f.Sum("POST", "/pay?x=1", hdr("X-Account", "1", "Content-Type", "application/json"), []byte(`{"a":2}`))},
	}
	for _, d := range different {
		if bytes.Equal(d.got, base) {
			t.Errorf("%s: fingerprint unchanged", d.name)
		}
	}
}

func TestFingerprintHeaderValueOrder(t *testing.T) {
	f := Fingerprinter{mode: BodyRaw, headers: []string{"X-Tag"}}
	ab := f.Sum("POST", "/", http.Header{"X-Tag": {"a", "b"}}, nil)
	ba := f.Sum("POST", "/", http.Header{"X-Tag": {"b", "a"}}, nil)
	joined := f.Sum("POST", "/", http.Header{"X-Tag": {"a,b"}}, nil)
	if bytes.Equal(ab, ba) {
		t.Error("header value order does not change the fingerprint")
	}
	if bytes.Equal(ab, joined) {
		t.Error("two header values and one joined value have the same fingerprint")
	}
}

// Fields are length-prefixed: moving bytes from one field to the next
// changes the fingerprint.
func TestFingerprintFieldBoundaries(t *testing.T) {
	f := Fingerprinter{mode: BodyRaw, headers: []string{"X-A", "X-B"}}
	h := http.Header{"X-A": {"1"}, "X-B": {"2"}}
	if bytes.Equal(f.Sum("PO", "ST/x", h, nil), f.Sum("POST", "/x", h, nil)) {
		t.Error("method and URI are not separated")
	}
	if bytes.Equal(f.Sum("POST", "/x", h, []byte("y")), f.Sum("POST", "/xy", h, nil)) {
		t.Error("URI and body are not separated")
	}
	if bytes.Equal(f.Sum("POST", "/", http.Header{"X-A": {"12"}}, nil), f.Sum("POST", "/", http.Header{"X-A": {"1"}, "X-B": {"2"}}, nil)) {
		t.Error("header values are not separated")
	}
	// The configured header list is part of the encoding.
	g := Fingerprinter{mode: BodyRaw, headers: []string{"X-B", "X-A"}}
	if bytes.Equal(f.Sum("POST", "/x", http.Header{"X-A": {"1"}, "X-B": {"1"}}, nil), g.Sum("POST", "/x", http.Header{"X-A": {"1"}, "X-B": {"1"}}, nil)) {
		t.Error("fingerprint headers are not named in the encoding")
	}
	none := Fingerprinter{mode: BodyRaw}
	if bytes.Equal(none.Sum("POST", "/x", nil, nil), f.Sum("POST", "/x", nil, nil)) {
		t.Error("absent fingerprint headers and no fingerprint headers hash alike")
	}
}

// Every instance must compute the same fingerprint for the same request,
// across releases: changing the encoding needs a new VersionWhole.
// The golden values were computed independently of this package from the
// encoding: "onejob-fingerprint", uvarint version, length-prefixed method
// and URI, header count and each header's name, value count and values,
// then 'j' or 'r', the body's length and the body.
func TestFingerprintStable(t *testing.T) {
	if VersionWhole != 1 {
		t.Fatalf("VersionWhole is %d: these golden values are version 1's; keep them and add the new version's", VersionWhole)
	}
	f := Fingerprinter{mode: BodyJSON, headers: []string{"X-Account"}}
	got := hex.EncodeToString(f.Sum("POST", "/v1/charges?x=1", http.Header{"X-Account": {"acct_1"}}, []byte(`{"b":2, "a":1}`)))
	const want = "10d2580fa3beb5500491d6627408a897f6717e53a7a6d97715c141f86f7f2450"
	if got != want {
		t.Errorf("json fingerprint = %s, want %s", got, want)
	}
	f.mode = BodyRaw
	got = hex.EncodeToString(f.Sum("POST", "/v1/charges?x=1", http.Header{"X-Account": {"acct_1"}}, []byte(`{"b":2, "a":1}`)))
	const wantRaw = "52f3dff7fa62b814534e12f1552cd86f42268ef9fa177d441230a83660bc3738"
	if got != wantRaw {
		t.Errorf("raw fingerprint = %s, want %s", got, wantRaw)
	}
}

func TestParseBodyMode(t *testing.T) {
	for in, want := range map[string]BodyMode{"": BodyJSON, "json": BodyJSON, "raw": BodyRaw, "graphql": BodyGraphQL} {
		got, err := ParseBodyMode(in)
		if err != nil || got != want {
			t.Errorf("ParseBodyMode(%q) = %v, %v; want %v", in, got, err, want)
		}
		if in != "" && got.String() != in {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), in)
		}
	}
	for _, in := range []string{"GraphQL", "JSON", "raw ", "x"} {
		if _, err := ParseBodyMode(in); err == nil {
			t.Errorf("ParseBodyMode(%q) accepted", in)
		}
	}
}
