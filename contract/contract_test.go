package contract

import (
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

func mustCompile(t testing.TB, spec Spec) *Contract {
	t.Helper()
	c, err := Compile(spec)
	if err != nil {
		t.Fatalf("Compile(%+v): %v", spec, err)
	}
	return c
}

// checkErr runs Check and returns its error text, "" for nil, asserting
// that any error is a well-formed *Breach.
func checkErr(t testing.TB, c *Contract, status int, h http.Header, body, request string) string {
	t.Helper()
	err := c.Check(status, h, []byte(body), []byte(request))
	if err == nil {
		return ""
	}
	var b *Breach
	if !errors.As(err, &b) {
		t.Fatalf("Check returned %T %v, want *Breach", err, err)
	}
	if strings.ContainsAny(b.Detail, "\n\r") || len(b.Detail) > maxDetail || !utf8.ValidString(b.Detail) {
		t.Errorf("Detail is not one short line: %q", b.Detail)
	}
	return err.Error()
}

func TestContractStatuses(t *testing.T) {
	tests := []struct {
		statuses []string
		yes, no  []int
	}{
		{nil, []int{200, 201, 299}, []int{199, 300, 404, 500, 0, 999}},
		{[]string{"200"}, []int{200}, []int{201, 204, 500}},
		{[]string{"2xx", "404"}, []int{200, 250, 404}, []int{400, 500}},
		{[]string{"4XX", "5xx"}, []int{400, 429, 503}, []int{200, 302}},
	}
	for _, tt := range tests {
		c := mustCompile(t, Spec{Statuses: tt.statuses})
		for _, s := range tt.yes {
			if !c.Applies(s) {
				t.Errorf("%v: Applies(%d) = false", tt.statuses, s)
			}
		}
		for _, s := range tt.no {
			if c.Applies(s) {
				t.Errorf("%v: Applies(%d) = true", tt.statuses, s)
			}
		}
	}
	var nilContract *Contract
	if nilContract.Applies(200) || nilContract.ChecksBody() || nilContract.Check(200, nil, nil, nil) != nil {
		t.Error("a nil contract checks answers")
	}
}

func TestContentType(t *testing.T) {
	c := mustCompile(t, Spec{ContentType: "application/json"})
	if c.ChecksBody() {
		t.Error("ChecksBody with content_type only")
	}
	tests := []struct {
		name   string
		status int
		ct     string // "" : no header
		want   string
	}{
		{"match", 200, "application/json", ""},
		{"params ignored", 200, "application/json; charset=utf-8", ""},
		{"case-insensitive", 201, "Application/JSON;Charset=UTF-8", ""},
		{"bad param ignored", 200, "application/json; charset", ""},
		{"mismatch", 200, "text/html; charset=utf-8", "contract: content_type: got text/html, want application/json"},
		{"missing", 200, "", "contract: content_type: no Content-Type, want application/json"},
		{"unparseable", 200, "/json", `contract: content_type: got "/json", want application/json`},
		{"status outside the set", 500, "text/html", ""},
		{"redirect outside the set", 302, "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			if tt.ct != "" {
				h.Set("Content-Type", tt.ct)
			}
			head := ""
			if err := c.CheckHead(tt.status, h); err != nil {
				head = err.Error()
			}
			if head != tt.want {
				t.Errorf("CheckHead = %q, want %q", head, tt.want)
			}
			if got := checkErr(t, c, tt.status, h, "<html>", ""); got != tt.want {
				t.Errorf("Check = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestConfiguredContentTypeParamsIgnored(t *testing.T) {
	c := mustCompile(t, Spec{ContentType: "Application/JSON; charset=utf-8"})
	h := http.Header{"Content-Type": {"application/json"}}
	if err := c.CheckHead(200, h); err != nil {
		t.Error(err)
	}
}

func TestJSONSchema(t *testing.T) {
	c := mustCompile(t, Spec{
		JSONSchema:  "testdata/order.schema.json",
		ContentType: "application/json",
	})
	if !c.ChecksBody() {
		t.Fatal("ChecksBody = false with json_schema")
	}
	json := http.Header{"Content-Type": {"application/json"}}
	tests := []struct {
		name   string
		status int
		body   string
		want   string
	}{
		{"pass", 200, `{"id":"o1","total":12.5,"items":[{"sku":"a","qty":2}]}`, ""},
		{"pass, optional property", 200, `{"id":"o1","total":3,"currency":"EUR","items":[]}`, ""},
		{"wrong type", 200, `{"id":"o1","total":"12.50","items":[]}`,
			"contract: json_schema: at /total: expected number, got string"},
		{"missing required", 200, `{"id":"o1","items":[]}`,
			"contract: json_schema: at (root): missing property 'total'"},
		{"hallucinated top-level key", 200, `{"id":"o1","total":1,"items":[],"discount":"50%"}`,
			"contract: json_schema: at (root): additional properties 'discount' not allowed"},
		{"several extra keys, sorted", 200, `{"id":"o1","total":1,"items":[],"z":1,"a":2}`,
			"contract: json_schema: at (root): additional properties 'a', 'z' not allowed"},
		{"nested, first location", 200, `{"id":"o1","total":1,"items":[{"sku":"a","qty":1},{"sku":"b","qty":0},{"sku":"c"}]}`,
			"contract: json_schema: at /items/1/qty: minimum: got 0, want 1"},
		{"enum", 200, `{"id":"o1","total":1,"items":[],"currency":"GBP"}`,
			"contract: json_schema: at /currency: value must be one of 'EUR', 'USD'"},
		{"not JSON", 200, `<html>oops</html>`,
			"contract: json_schema: body is not JSON: invalid character '<' looking for beginning of value"},
		{"empty body", 200, ``, "contract: json_schema: body is not JSON: empty body"},
		{"trailing data", 200, `{"id":"o1","total":1,"items":[]} {}`,
			"contract: json_schema: body is not JSON: data after the top-level value"},
		{"status outside the set", 500, `<html>oops</html>`, ""},
		{"4xx outside the set", 422, `{"error":"bad"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := checkErr(t, c, tt.status, json, tt.body, ""); got != tt.want {
				t.Errorf("Check = %q\n\twant %q", got, tt.want)
			}
		})
	}
}

func TestJSONSchemaDraftFromFile(t *testing.T) {
	// A draft-04 schema: exclusiveMaximum is a boolean there.
	path := writeFile(t, "d4.json", `{"$schema":"http://json-schema.org/draft-04/schema#",
		"type":"object","properties":{"n":{"type":"number","maximum":5,"exclusiveMaximum":true}}}`)
	c := mustCompile(t, Spec{JSONSchema: path})
	if got := checkErr(t, c, 200, nil, `{"n":4}`, ""); got != "" {
		t.Errorf("n=4: %s", got)
	}
	if got := checkErr(t, c, 200, nil, `{"n":5}`, ""); !strings.Contains(got, "at /n:") {
		t.Errorf("n=5: %q, want a breach at /n", got)
	}
}

func TestBreachError(t *testing.T) {
	b := &Breach{Rule: RuleJSONSchema, Detail: "at /total: expected number, got string"}
	if got, want := b.Error(), "contract: json_schema: at /total: expected number, got string"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	long := breach(RuleGraphQLSchema, strings.Repeat("é", 400)+"\nend")
	if len(long.Detail) > maxDetail || !strings.HasSuffix(long.Detail, "…") || !utf8.ValidString(long.Detail) {
		t.Errorf("long detail not cut: %d bytes", len(long.Detail))
	}
	if got := oneLine("a\nb\x00c\xffd", 100); got != `a\nb\x00c\ufffdd` {
		t.Errorf("oneLine = %q", got)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestCompileContractErrors(t *testing.T) {
	tests := []struct {
		name string
		spec Spec
		want []string // substrings of the error
	}{
		{"missing JSON Schema file", Spec{JSONSchema: "testdata/nope.json"},
			[]string{"json_schema testdata/nope.json", "no such file"}},
		{"JSON Schema not JSON", Spec{JSONSchema: "testdata/broken.schema.json"},
			[]string{"json_schema testdata/broken.schema.json", "not JSON"}},
		{"invalid JSON Schema", Spec{JSONSchema: "testdata/invalid.schema.json"},
			[]string{"json_schema testdata/invalid.schema.json", "not a valid schema", "at /properties/total/type"}},
		{"missing SDL file", Spec{GraphQLSchema: "testdata/nope.graphql"},
			[]string{"graphql_schema testdata/nope.graphql", "no such file"}},
		{"invalid SDL", Spec{GraphQLSchema: "testdata/invalid.graphql"},
			[]string{"graphql_schema testdata/invalid.graphql", "invalid.graphql:2:9", "Undefined type Character"}},
		{"SDL syntax error", Spec{GraphQLSchema: "testdata/broken.schema.json"},
			[]string{"graphql_schema testdata/broken.schema.json", "Unexpected {"}},
		{"SDL without a Query type", Spec{GraphQLSchema: "testdata/noquery.graphql"},
			[]string{"graphql_schema testdata/noquery.graphql", "no query root type"}},
		{"status class 7xx", Spec{Statuses: []string{"2xx", "7xx"}}, []string{`status "7xx"`}},
		{"status abc", Spec{Statuses: []string{"abc"}}, []string{`status "abc"`}},
		{"status 99", Spec{Statuses: []string{"99"}}, []string{`status "99"`}},
		{"status 600", Spec{Statuses: []string{"600"}}, []string{`status "600"`}},
		{"status 2x", Spec{Statuses: []string{"2x"}}, []string{`status "2x"`}},
		{"bad media type", Spec{ContentType: "json"}, []string{`content_type "json"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Compile(tt.spec)
			if err == nil {
				t.Fatalf("no error, got %v", c)
			}
			msg := err.Error()
			if strings.Contains(msg, "\n") {
				t.Errorf("error is not one line: %q", msg)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("error %q does not contain %q", msg, w)
				}
			}
		})
	}
}

// fuzzContract is a contract with every rule, for FuzzContractCheck.
var fuzzContract = sync.OnceValues(func() (*Contract, error) {
	return Compile(Spec{
		Statuses:      []string{"2xx", "422"},
		ContentType:   "application/json",
		JSONSchema:    "testdata/response.schema.json",
		GraphQLSchema: "testdata/starwars.graphql",
	})
})

func FuzzContractCheck(f *testing.F) {
	c, err := fuzzContract()
	if err != nil {
		f.Fatal(err)
	}
	for _, tt := range graphQLCases {
		f.Add(tt.body, tt.request())
	}
	f.Add(`{"data":{"hero":{"__typename":"Droid","name":"R2","friends":[{"__typename":"Human","name":"Luke"}]}}}`,
		`{"query":"{ hero { __typename name friends { __typename name ... on Human { homePlanet } } } }"}`)
	f.Add(`{"data":{"search":[{},{"a":1}]}}`, `{"query":"{ search(text: \"x\") { ... on Human { a: name } ... on Droid { b: name } } }"}`)
	f.Add(`{"errors":[{"message":"x"}]}`, `not json`)
	f.Add(`[`, `{"query":"{ count }"}`)
	h := http.Header{"Content-Type": {"application/json"}}
	f.Fuzz(func(t *testing.T, body, request string) {
		first := checkErr(t, c, 200, h, body, request)
		for range 2 {
			if again := checkErr(t, c, 200, h, body, request); again != first {
				t.Fatalf("Check is not deterministic:\n%q\n%q", first, again)
			}
		}
	})
}

func TestContractConcurrent(t *testing.T) {
	c, err := fuzzContract()
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Content-Type": {"application/json"}}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for _, tt := range graphQLCases {
				body, req := []byte(tt.body), []byte(tt.request())
				first := c.Check(200, h, body, req)
				again := c.Check(200, h, body, req)
				if (first == nil) != (again == nil) || first != nil && first.Error() != again.Error() {
					t.Errorf("%s: %v then %v", tt.name, first, again)
				}
			}
		})
	}
	wg.Wait()
}
