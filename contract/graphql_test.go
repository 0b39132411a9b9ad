package contract

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/vektah/gqlparser/v2/ast"
)

type graphQLCase struct {
	name      string
	query     string         // "" : raw is the request body
	opName    string         // operationName
	variables map[string]any // variables
	raw       string         // a raw request body, when query is ""
	body      string         // the answer
	want      string         // the Detail of the breach; "" : none
}

func (tt graphQLCase) request() string {
	if tt.query == "" {
		return tt.raw
	}
	b, err := json.Marshal(map[string]any{"query": tt.query, "operationName": tt.opName, "variables": tt.variables})
	if err != nil {
		panic(err)
	}
	return string(b)
}

const (
	qHuman      = `query { human(id: "1") { id name height homePlanet } count episodes }`
	qHumanShort = `{ human(id: "1") { id name } }`
	qCount      = `{ count }`
	qScalars    = `{ count verified now human(id: "1") { id height } }`
	qEpisodes   = `{ episodes }`
	qHero       = `query Hero { hero { __typename name ...DroidParts ... on Human { homePlanet } } }
	               fragment DroidParts on Droid { primaryFunction }`
	qHeroNoType  = `{ hero { id name ... on Droid { primaryFunction } ... on Human { height } } }`
	qSearch      = `{ search(text: "a") { __typename ... on Human { name height } ... on Droid { name primaryFunction } ... on Starship { name length } } }`
	qSearchBare  = `{ search(text: "a") { ... on Human { name height } ... on Starship { name length } } }`
	qFriends     = `{ hero { name friends { name } } }`
	qInclude     = `query ($x: Boolean!) { human(id: "1") { name height @include(if: $x) ... @skip(if: $x) { homePlanet } } }`
	qTwoOps      = `query A { count } query B { episodes }`
	qMutation    = `mutation { createReview(episode: JEDI, review: {stars: 5}) { stars commentary episode } }`
	qRepeated    = `{ human(id: "1") { name } human(id: "1") { id } }`
	qTypename    = `{ __typename count }`
	qNested      = `{ hero { ... on Droid { name friends { name } } ... on Human { name friends { ... on Human { name friends { name } } } } } }`
	qAlias       = `{ luke: human(id: "1") { n: name } }`
	qSpreadTwice = `{ hero { ...Named ... on Character @include(if: true) { ...Named } } }
	               fragment Named on Character { name }`
)

var graphQLCases = []graphQLCase{
	// Shapes and scalars.
	{name: "valid", query: qHuman,
		body: `{"data":{"human":{"id":"1","name":"Luke","height":1.72,"homePlanet":"Tatooine"},"count":3,"episodes":["NEWHOPE","JEDI"]}}`},
	{name: "nullable field null", query: qHumanShort + ` `,
		body: `{"data":{"human":null}}`},
	{name: "ID as an integer", query: qHumanShort,
		body: `{"data":{"human":{"id":1,"name":"Luke"}}}`},
	{name: "ID as a float", query: qHumanShort,
		body: `{"data":{"human":{"id":1.5,"name":"Luke"}}}`,
		want: `at /data/human/id: expected ID, got float`},
	{name: "alias honoured", query: qAlias,
		body: `{"data":{"luke":{"n":"Luke"}}}`},
	{name: "alias ignored", query: qAlias,
		body: `{"data":{"human":{"name":"Luke"}}}`,
		want: `at /data: missing field "luke"`},
	{name: "missing field", query: qHumanShort,
		body: `{"data":{"human":{"id":"1"}}}`,
		want: `at /data/human: missing field "name"`},
	{name: "extra key", query: qHumanShort,
		body: `{"data":{"human":{"id":"1","name":"Luke","mood":"hopeful"}}}`,
		want: `at /data/human: unexpected key "mood"`},
	{name: "extra top-level data key", query: qCount,
		body: `{"data":{"count":1,"summary":"three"}}`,
		want: `at /data: unexpected key "summary"`},
	{name: "null in non-null field", query: qHumanShort,
		body: `{"data":{"human":{"id":"1","name":null}}}`,
		want: `at /data/human/name: null for non-null String!`},
	{name: "string for Int", query: qCount,
		body: `{"data":{"count":"3"}}`,
		want: `at /data/count: expected Int, got string`},
	{name: "float for Int", query: qCount,
		body: `{"data":{"count":3.5}}`,
		want: `at /data/count: expected Int, got float`},
	{name: "exponent for Int", query: qCount,
		body: `{"data":{"count":1e2}}`,
		want: `at /data/count: expected Int, got float`},
	{name: "Int out of int32", query: qCount,
		body: `{"data":{"count":2147483648}}`,
		want: `at /data/count: Int 2147483648 is out of the 32-bit range`},
	{name: "Int at int32 bounds", query: `{ a: count b: count }`,
		body: `{"data":{"a":2147483647,"b":-2147483648}}`},
	{name: "integer for Float, custom scalar anything", query: qScalars,
		body: `{"data":{"count":1,"verified":true,"now":{"any":["thing"]},"human":{"id":"1","height":2}}}`},
	{name: "string for Boolean", query: qScalars,
		body: `{"data":{"count":1,"verified":"yes","now":null,"human":null}}`,
		want: `at /data/verified: expected Boolean, got string`},
	{name: "string for Float", query: qScalars,
		body: `{"data":{"count":1,"verified":null,"now":null,"human":{"id":"1","height":"tall"}}}`,
		want: `at /data/human/height: expected Float, got string`},
	{name: "enum value", query: qEpisodes,
		body: `{"data":{"episodes":["EMPIRE"]}}`},
	{name: "enum value not in the enum", query: qEpisodes,
		body: `{"data":{"episodes":["NEWHOPE","PHANTOM"]}}`,
		want: `at /data/episodes/1: "PHANTOM" is not a value of enum Episode`},
	{name: "non-null list null", query: qEpisodes,
		body: `{"data":{"episodes":null}}`,
		want: `at /data/episodes: null for non-null [Episode!]!`},
	{name: "null in non-null list", query: qEpisodes,
		body: `{"data":{"episodes":[null]}}`,
		want: `at /data/episodes/0: null for non-null Episode!`},
	{name: "value for a list", query: qEpisodes,
		body: `{"data":{"episodes":"JEDI"}}`,
		want: `at /data/episodes: expected a list for [Episode!]!, got string`},
	{name: "nested lists, nullable items", query: qFriends,
		body: `{"data":{"hero":{"name":"R2","friends":[{"name":"Luke"},null]}}}`},
	{name: "nested null in non-null", query: qFriends,
		body: `{"data":{"hero":{"name":"R2","friends":[{"name":"Luke"},{"name":null}]}}}`,
		want: `at /data/hero/friends/1/name: null for non-null String!`},
	{name: "object for a scalar", query: qCount,
		body: `{"data":{"count":{"value":1}}}`,
		want: `at /data/count: expected Int, got object`},
	{name: "scalar for an object", query: qHumanShort,
		body: `{"data":{"human":"Luke"}}`,
		want: `at /data/human: expected an object for Human, got string`},
	{name: "repeated field merged", query: qRepeated,
		body: `{"data":{"human":{"name":"Luke","id":"1"}}}`},
	{name: "repeated field, one part missing", query: qRepeated,
		body: `{"data":{"human":{"name":"Luke"}}}`,
		want: `at /data/human: missing field "id"`},
	{name: "root __typename", query: qTypename,
		body: `{"data":{"__typename":"Query","count":1}}`},
	{name: "wrong root __typename", query: qTypename,
		body: `{"data":{"__typename":"Mutation","count":1}}`,
		want: `at /data/__typename: __typename is "Mutation", want "Query"`},
	{name: "mutation", query: qMutation,
		body: `{"data":{"createReview":{"stars":5,"commentary":null,"episode":"JEDI"}}}`},
	{name: "mutation, float for Int", query: qMutation,
		body: `{"data":{"createReview":{"stars":4.5,"commentary":null,"episode":"JEDI"}}}`,
		want: `at /data/createReview/stars: expected Int, got float`},

	// Interfaces, unions and fragments.
	{name: "interface with __typename and fragments", query: qHero,
		body: `{"data":{"hero":{"__typename":"Droid","name":"R2-D2","primaryFunction":"Astromech"}}}`},
	{name: "interface, other type", query: qHero,
		body: `{"data":{"hero":{"__typename":"Human","name":"Luke","homePlanet":null}}}`},
	{name: "interface, key of the other type", query: qHero,
		body: `{"data":{"hero":{"__typename":"Human","name":"Luke","homePlanet":"Tatooine","primaryFunction":"farmer"}}}`,
		want: `at /data/hero: unexpected key "primaryFunction"`},
	{name: "interface, fragment field missing", query: qHero,
		body: `{"data":{"hero":{"__typename":"Droid","name":"R2-D2"}}}`,
		want: `at /data/hero: missing field "primaryFunction"`},
	{name: "interface, __typename not a possible type", query: qHero,
		body: `{"data":{"hero":{"__typename":"Starship","name":"Falcon"}}}`,
		want: `at /data/hero/__typename: "Starship" is not a possible type of Character`},
	{name: "interface, __typename unknown", query: qHero,
		body: `{"data":{"hero":{"__typename":"Wookiee","name":"Chewie"}}}`,
		want: `at /data/hero/__typename: "Wookiee" is not a possible type of Character`},
	{name: "interface, __typename not a string", query: qHero,
		body: `{"data":{"hero":{"__typename":7,"name":"R2-D2","primaryFunction":"Astromech"}}}`,
		want: `at /data/hero/__typename: __typename is integer, want "Droid"`},
	{name: "interface without __typename, Droid keys", query: qHeroNoType,
		body: `{"data":{"hero":{"id":"2001","name":"R2-D2","primaryFunction":"Astromech"}}}`},
	{name: "interface without __typename, Human keys", query: qHeroNoType,
		body: `{"data":{"hero":{"id":"1000","name":"Luke","height":null}}}`},
	{name: "interface without __typename, mixed keys", query: qHeroNoType,
		body: `{"data":{"hero":{"id":"1000","name":"Luke","height":1.7,"primaryFunction":"x"}}}`,
		want: `at /data/hero: keys fit no possible type of Character (no __typename)`},
	{name: "interface without __typename, missing field", query: qHeroNoType,
		body: `{"data":{"hero":{"id":"1000","height":1.7}}}`,
		want: `at /data/hero: missing field "name"`},
	{name: "interface without __typename, unknown key", query: qHeroNoType,
		body: `{"data":{"hero":{"id":"1000","name":"Luke","wookiee":true}}}`,
		want: `at /data/hero: unexpected key "wookiee"`},
	{name: "interface without __typename, wrong kind in the fitting type", query: qHeroNoType,
		body: `{"data":{"hero":{"id":"1000","name":"Luke","height":"tall"}}}`,
		want: `at /data/hero/height: expected Float, got string`},
	{name: "union with __typename", query: qSearch,
		body: `{"data":{"search":[{"__typename":"Human","name":"Luke","height":1.72},{"__typename":"Starship","name":"Falcon","length":34.37},{"__typename":"Droid","name":"R2","primaryFunction":"Astromech"}]}}`},
	{name: "union, key of another member", query: qSearch,
		body: `{"data":{"search":[{"__typename":"Starship","name":"Falcon","length":34.37,"height":3}]}}`,
		want: `at /data/search/0: unexpected key "height"`},
	{name: "union, null in non-null list", query: qSearch,
		body: `{"data":{"search":[null]}}`,
		want: `at /data/search/0: null for non-null SearchResult!`},
	{name: "union without __typename", query: qSearchBare,
		body: `{"data":{"search":[{"name":"Luke","height":1.72},{"name":"Falcon","length":34.37},{}]}}`},
	{name: "union without __typename, missing field", query: qSearchBare,
		body: `{"data":{"search":[{"name":"Falcon"}]}}`,
		want: `at /data/search/0: missing field "height"`},
	{name: "union without __typename, unselected key", query: qSearchBare,
		body: `{"data":{"search":[{"name":"R2","primaryFunction":"Astromech"}]}}`,
		want: `at /data/search/0: unexpected key "primaryFunction"`},
	{name: "nested interfaces without __typename, the deepest failure told", query: qNested,
		body: `{"data":{"hero":{"name":"a","friends":[{"name":"b","friends":[{"name":null}]}]}}}`,
		want: `at /data/hero/friends/0/friends/0/name: null for non-null String!`},
	{name: "nested interfaces without __typename", query: qNested,
		body: `{"data":{"hero":{"name":"a","friends":[{"name":"b","friends":[{"name":"c"}]}]}}}`},
	{name: "fragment spread twice", query: qSpreadTwice,
		body: `{"data":{"hero":{"name":"R2"}}}`},
	{name: "fragment spread twice, field missing", query: qSpreadTwice,
		body: `{"data":{"hero":{}}}`,
		want: `at /data/hero: missing field "name"`},

	// @skip and @include.
	{name: "@include field absent", query: qInclude, variables: map[string]any{"x": false},
		body: `{"data":{"human":{"name":"Luke","homePlanet":"Tatooine"}}}`},
	{name: "@include field present", query: qInclude, variables: map[string]any{"x": true},
		body: `{"data":{"human":{"name":"Luke","height":1.72}}}`},
	{name: "@include field, wrong kind", query: qInclude, variables: map[string]any{"x": true},
		body: `{"data":{"human":{"name":"Luke","height":true}}}`,
		want: `at /data/human/height: expected Float, got boolean`},

	// Operations.
	{name: "operationName picks the operation", query: qTwoOps, opName: "B",
		body: `{"data":{"episodes":[]}}`},
	{name: "operationName, the other operation's data", query: qTwoOps, opName: "B",
		body: `{"data":{"count":1}}`,
		want: `at /data: missing field "episodes"`},

	// Errors.
	{name: "errors with null data", query: qHumanShort,
		body: `{"errors":[{"message":"boom"}],"data":null}`,
		want: `errors with null data`},
	{name: "errors without data", query: qHumanShort,
		body: `{"errors":[{"message":"boom"}]}`,
		want: `errors with null data`},
	{name: "errors with partial data", query: qHumanShort,
		body: `{"errors":[{"message":"boom","path":["human","name"]}],"data":{"human":null}}`},
	{name: "errors with partial data breaking nullability", query: qCount,
		body: `{"errors":[{"message":"boom","path":["count"]}],"data":{"count":null}}`,
		want: `at /data/count: null for non-null Int!`},
	{name: "no data and no errors", query: qCount,
		body: `{"data":null}`,
		want: `no data and no errors`},
	{name: "errors not a list", query: qCount,
		body: `{"errors":"boom","data":{"count":1}}`,
		want: `errors is not a list, got string`},
	{name: "answer not an object", query: qCount,
		body: `[{"data":{"count":1}}]`,
		want: `answer is not a JSON object, got array`},
	{name: "answer not JSON", query: qCount,
		body: `Internal Server Error`,
		want: `body is not JSON: invalid character 'I' looking for beginning of value`},

	// Requests the schema cannot run: only the errors-with-null-data rule.
	{name: "unparseable request", raw: `not json`,
		body: `{"data":{"anything":[1,2]}}`},
	{name: "unparseable request, errors with null data", raw: `not json`,
		body: `{"errors":[{"message":"bad request"}],"data":null}`,
		want: `errors with null data`},
	{name: "unparseable request, answer not JSON", raw: `{"query": 5}`,
		body: `oops`,
		want: `body is not JSON: invalid character 'o' looking for beginning of value`},
	{name: "unparseable request, answer an array", raw: `not json`,
		body: `[1]`},
	{name: "batched request", raw: `[{"query":"{ count }"},{"query":"{ episodes }"}]`,
		body: `[{"data":{"count":1}},{"data":{"episodes":[]}}]`},
	{name: "batched request, errors with null data", raw: `[{"query":"{ count }"},{"query":"{ nosuch }"}]`,
		body: `[{"data":{"count":1}},{"errors":[{"message":"no such field"}],"data":null}]`,
		want: `at /1: errors with null data`},
	{name: "unparseable request, errors not a list", raw: `not json`,
		body: `{"errors":"boom"}`,
		want: `errors with null data`},
	{name: "empty request", raw: ``,
		body: `{"data":null}`},
	{name: "query syntax error", query: `{ count `,
		body: `{"data":{"count":"x"}}`},
	{name: "query invalid against the schema", query: `{ nosuch }`,
		body: `{"data":{"nosuch":1}}`},
	{name: "two operations, no operationName", query: qTwoOps,
		body: `{"data":{"whatever":1}}`},
	{name: "unknown operationName", query: qTwoOps, opName: "C",
		body: `{"errors":[{"message":"unknown operation"}]}`,
		want: `errors with null data`},
}

func TestGraphQLSchema(t *testing.T) {
	c := mustCompile(t, Spec{GraphQLSchema: "testdata/starwars.graphql"})
	if !c.ChecksBody() {
		t.Fatal("ChecksBody = false with graphql_schema")
	}
	for _, tt := range graphQLCases {
		t.Run(tt.name, func(t *testing.T) {
			got := checkErr(t, c, 200, nil, tt.body, tt.request())
			want := ""
			if tt.want != "" {
				want = "contract: graphql_schema: " + tt.want
			}
			if got != want {
				t.Errorf("Check = %q\n\twant %q", got, want)
			}
		})
	}
}

func TestGraphQLStatusOutsideTheSet(t *testing.T) {
	c := mustCompile(t, Spec{GraphQLSchema: "testdata/starwars.graphql", Statuses: []string{"200"}})
	req := graphQLCase{query: qCount}.request()
	if err := c.Check(400, nil, []byte(`{"errors":[{"message":"bad"}]}`), []byte(req)); err != nil {
		t.Errorf("400 checked: %v", err)
	}
	if err := c.Check(200, nil, []byte(`{"errors":[{"message":"bad"}]}`), []byte(req)); err == nil {
		t.Error("200 with errors and no data passed")
	}
}

func TestGraphQLBudget(t *testing.T) {
	// A tiny budget ends the check and accepts the answer.
	c := mustCompile(t, Spec{GraphQLSchema: "testdata/starwars.graphql"})
	check := &gqlCheck{g: c.graphql, memo: map[memoKey][]*responseKey{}, maxSteps: 1}
	op := c.graphql.operation([]byte(graphQLCase{query: qEpisodes}.request()))
	if op == nil {
		t.Fatal("no operation")
	}
	data := map[string]any{"episodes": []any{"NOPE"}}
	root := c.graphql.root(op)
	err := check.object(&path{key: "data"}, root, []ast.SelectionSet{op.SelectionSet}, nil, data)
	if err != errBudget {
		t.Errorf("err = %v, want errBudget", err)
	}
	// A large query is not checked.
	q := "{" + strings.Repeat(" count", graphQLTokenLimit) + " }"
	if got := checkErr(t, c, 200, nil, `{"data":{"count":"x"}}`, graphQLCase{query: q}.request()); got != "" {
		t.Errorf("query over the token limit checked: %s", got)
	}
}
