package contract

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/vektah/gqlparser/v2"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
	"github.com/vektah/gqlparser/v2/validator"
)

// graphQLTokenLimit bounds the requests the graphql_schema rule parses: a
// bigger query is not checked (only the errors-with-null-data rule
// applies), so a client cannot make the gateway's validation slow.
const graphQLTokenLimit = 15000

// graphQLSchema is a loaded SDL schema, read-only after loading.
type graphQLSchema struct {
	schema *ast.Schema
	// objects lists, for each interface and union, the object types that
	// may stand for it, sorted by name.
	objects map[string][]*ast.Definition
}

func loadGraphQLSchema(path string) (*graphQLSchema, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	s, err := gqlparser.LoadSchema(&ast.Source{Name: path, Input: string(b)})
	if err != nil {
		return nil, err
	}
	if s.Query == nil {
		return nil, fmt.Errorf("no query root type")
	}
	g := &graphQLSchema{schema: s, objects: map[string][]*ast.Definition{}}
	for name, def := range s.Types {
		if def.Kind != ast.Interface && def.Kind != ast.Union {
			continue
		}
		var objs []*ast.Definition
		for _, p := range s.GetPossibleTypes(def) {
			if p != nil && p.Kind == ast.Object && !slices.Contains(objs, p) {
				objs = append(objs, p)
			}
		}
		slices.SortFunc(objs, func(a, b *ast.Definition) int { return strings.Compare(a.Name, b.Name) })
		g.objects[name] = objs
	}
	return g, nil
}

// graphQLRequest is a GraphQL-over-HTTP request body.
type graphQLRequest struct {
	Query         string `json:"query"`
	OperationName string `json:"operationName"`
}

// operation parses and validates the client's request and returns the
// operation it runs, or nil when the request is not one this schema can
// run (the upstream answers those with errors).
func (g *graphQLSchema) operation(request []byte) (op *ast.OperationDefinition) {
	defer func() {
		if recover() != nil { // a parser bug must not take the gateway down
			op = nil
		}
	}()
	var req graphQLRequest
	if err := json.Unmarshal(request, &req); err != nil || req.Query == "" {
		return nil
	}
	doc, err := parser.ParseQueryWithTokenLimit(&ast.Source{Input: req.Query}, graphQLTokenLimit)
	if err != nil {
		return nil
	}
	if errs := validator.ValidateWithRules(g.schema, doc, nil); len(errs) > 0 {
		return nil
	}
	switch {
	case req.OperationName != "":
		return doc.Operations.ForName(req.OperationName)
	case len(doc.Operations) == 1:
		return doc.Operations[0]
	}
	return nil
}

func (g *graphQLSchema) root(op *ast.OperationDefinition) *ast.Definition {
	switch op.Operation {
	case ast.Mutation:
		return g.schema.Mutation
	case ast.Subscription:
		return g.schema.Subscription
	}
	return g.schema.Query
}

// check judges a decoded answer body against the client's request and
// returns what is wrong, or "". size is the body's length, which bounds
// the work.
func (g *graphQLSchema) check(body any, request []byte, size int) string {
	op := g.operation(request)
	if op == nil {
		// A request the schema cannot run (a batch among them): the
		// upstream owns GraphQL errors, but an answer with errors and no
		// data is no result.
		switch body := body.(type) {
		case map[string]any:
			if failed(body) {
				return "errors with null data"
			}
		case []any:
			for i, item := range body {
				if m, ok := item.(map[string]any); ok && failed(m) {
					return "at /" + strconv.Itoa(i) + ": errors with null data"
				}
			}
		}
		return ""
	}
	resp, ok := body.(map[string]any)
	if !ok {
		return "answer is not a JSON object, got " + jsonKind(body)
	}
	if errs, ok := resp["errors"]; ok && errs != nil {
		if _, ok := errs.([]any); !ok {
			return "errors is not a list, got " + jsonKind(errs)
		}
	}
	data := resp["data"]
	if data == nil {
		if failed(resp) {
			return "errors with null data"
		}
		return "no data and no errors"
	}
	root := g.root(op)
	if root == nil {
		return ""
	}
	c := &gqlCheck{
		g:        g,
		memo:     map[memoKey][]*responseKey{},
		maxSteps: 4*size + 10000,
	}
	err := c.value(&path{key: "data"}, ast.NonNullNamedType(root.Name, nil), []ast.SelectionSet{op.SelectionSet}, nil, data)
	if err == nil || err == errBudget {
		return ""
	}
	return err.Error()
}

// failed reports whether a GraphQL response has errors and no data.
func failed(resp map[string]any) bool {
	if resp["data"] != nil {
		return false
	}
	errs, ok := resp["errors"]
	if list, isList := errs.([]any); isList {
		return len(list) > 0
	}
	return ok && errs != nil
}

// path is a location in the answer, as a linked list from the leaf.
type path struct {
	parent *path
	key    string
}

func (p *path) child(key string) *path { return &path{parent: p, key: key} }

func (p *path) depth() int {
	n := 0
	for ; p != nil; p = p.parent {
		n++
	}
	return n
}

func (p *path) String() string {
	var keys []string
	for ; p != nil; p = p.parent {
		keys = append(keys, p.key)
	}
	slices.Reverse(keys)
	return pointer(keys)
}

type gqlError struct {
	at  *path
	msg string
}

func (e *gqlError) Error() string { return "at " + e.at.String() + ": " + e.msg }

// errBudget ends a check that grew too costly; the answer is accepted.
var errBudget = &gqlError{msg: "too costly to check"}

// gqlCheck is one answer's check.
type gqlCheck struct {
	g        *graphQLSchema
	memo     map[memoKey][]*responseKey
	steps    int
	maxSteps int
}

// responseKey is one key of an object in the answer: the fields of the
// query that fill it (several, merged, when the query repeats it).
type responseKey struct {
	key    string
	fields []*ast.Field
	// sub: the fields' selection sets, merged.
	sub []ast.SelectionSet
	// required: at least one of the fields is selected unconditionally
	// (no @skip or @include on it or on the fragments around it).
	required bool
}

type memoKey struct {
	typ *ast.Definition
	src *responseKey // the parent key whose sub-selections are collected; nil: the operation
}

// value checks v against type t; sel is the selection set under a
// composite type (merged from fields), src identifies it for the memo.
func (c *gqlCheck) value(at *path, t *ast.Type, sel []ast.SelectionSet, src *responseKey, v any) *gqlError {
	if c.steps++; c.steps > c.maxSteps {
		return errBudget
	}
	if v == nil {
		if t.NonNull {
			return &gqlError{at, "null for non-null " + t.String()}
		}
		return nil
	}
	if t.Elem != nil {
		list, ok := v.([]any)
		if !ok {
			return &gqlError{at, "expected a list for " + t.String() + ", got " + jsonKind(v)}
		}
		for i, item := range list {
			if err := c.value(at.child(strconv.Itoa(i)), t.Elem, sel, src, item); err != nil {
				return err
			}
		}
		return nil
	}
	def := c.g.schema.Types[t.NamedType]
	if def == nil {
		return nil
	}
	switch def.Kind {
	case ast.Scalar:
		return scalar(at, def.Name, v)
	case ast.Enum:
		s, ok := v.(string)
		if !ok {
			return &gqlError{at, "expected enum " + def.Name + ", got " + jsonKind(v)}
		}
		if def.EnumValues.ForName(s) == nil {
			return &gqlError{at, quote(s) + " is not a value of enum " + def.Name}
		}
		return nil
	case ast.Object, ast.Interface, ast.Union:
		obj, ok := v.(map[string]any)
		if !ok {
			return &gqlError{at, "expected an object for " + def.Name + ", got " + jsonKind(v)}
		}
		return c.object(at, def, sel, src, obj)
	}
	return nil
}

func scalar(at *path, name string, v any) *gqlError {
	ok := true
	switch name {
	case "Int":
		n, isNum := v.(json.Number)
		if !isNum || !isInteger(n) {
			return &gqlError{at, "expected Int, got " + jsonKind(v)}
		}
		if _, err := strconv.ParseInt(string(n), 10, 32); err != nil {
			return &gqlError{at, "Int " + oneLine(string(n), 40) + " is out of the 32-bit range"}
		}
	case "Float":
		_, ok = v.(json.Number)
	case "String":
		_, ok = v.(string)
	case "Boolean":
		_, ok = v.(bool)
	case "ID":
		switch v := v.(type) {
		case string:
		case json.Number:
			ok = isInteger(v)
		default:
			ok = false
		}
	}
	if !ok {
		return &gqlError{at, "expected " + name + ", got " + jsonKind(v)}
	}
	return nil // custom scalars: anything
}

// isInteger reports whether a JSON number is written as an integer.
func isInteger(n json.Number) bool {
	s := strings.TrimPrefix(string(n), "-")
	return isDigits(s)
}

// object checks an object of type def (an object type, interface or
// union). The concrete type of an interface or union is the one its
// __typename names; without one, the keys must fit one of the possible
// object types.
func (c *gqlCheck) object(at *path, def *ast.Definition, sel []ast.SelectionSet, src *responseKey, obj map[string]any) *gqlError {
	if def.Kind == ast.Object {
		return c.as(at, def, sel, src, obj)
	}
	possible := c.g.objects[def.Name]
	if len(possible) == 0 {
		return &gqlError{at, def.Name + " has no possible type"}
	}
	for _, p := range possible {
		for _, rk := range c.collect(p, sel, src) {
			if rk.fields[0].Name != "__typename" {
				continue
			}
			tn, ok := obj[rk.key].(string)
			if !ok {
				continue
			}
			i := slices.IndexFunc(possible, func(d *ast.Definition) bool { return d.Name == tn })
			if i < 0 {
				return &gqlError{at.child(rk.key), quote(tn) + " is not a possible type of " + def.Name}
			}
			return c.as(at, possible[i], sel, src, obj)
		}
	}
	// No __typename: try the object types whose selection the keys fit;
	// when none passes, tell the failure that got deepest.
	var deepest *gqlError
	for _, p := range possible {
		if !fits(c.collect(p, sel, src), obj) {
			continue
		}
		err := c.as(at, p, sel, src, obj)
		if err == nil || err == errBudget {
			return err
		}
		if deepest == nil || err.at.depth() > deepest.at.depth() {
			deepest = err
		}
	}
	if deepest != nil {
		return deepest
	}
	// None fits. A type whose selection has every key present lacks
	// some: name what, for the first such type.
	keys := sortedKeys(obj)
	for _, p := range possible {
		rks := c.collect(p, sel, src)
		if !slices.ContainsFunc(keys, func(k string) bool { return !hasKey(rks, k) }) {
			return c.as(at, p, sel, src, obj)
		}
	}
	for _, k := range keys {
		if !slices.ContainsFunc(possible, func(p *ast.Definition) bool { return hasKey(c.collect(p, sel, src), k) }) {
			return &gqlError{at, "unexpected key " + quote(k)}
		}
	}
	return &gqlError{at, "keys fit no possible type of " + def.Name + " (no __typename)"}
}

func hasKey(keys []*responseKey, k string) bool {
	return slices.ContainsFunc(keys, func(rk *responseKey) bool { return rk.key == k })
}

// fits reports whether obj has every required key and no other.
func fits(keys []*responseKey, obj map[string]any) bool {
	n := 0
	for _, rk := range keys {
		if _, ok := obj[rk.key]; ok {
			n++
		} else if rk.required {
			return false
		}
	}
	return n == len(obj)
}

// as checks obj as an object of the object type typ.
func (c *gqlCheck) as(at *path, typ *ast.Definition, sel []ast.SelectionSet, src *responseKey, obj map[string]any) *gqlError {
	keys := c.collect(typ, sel, src)
	for _, rk := range keys {
		if _, ok := obj[rk.key]; !ok && rk.required {
			return &gqlError{at, "missing field " + quote(rk.key)}
		}
	}
	if len(obj) > len(keys) || !fits(keys, obj) {
		for _, k := range sortedKeys(obj) {
			if !hasKey(keys, k) {
				return &gqlError{at, "unexpected key " + quote(k)}
			}
		}
	}
	for _, rk := range keys {
		v, ok := obj[rk.key]
		if !ok {
			continue
		}
		f := rk.fields[0]
		if f.Name == "__typename" {
			if s, ok := v.(string); !ok || s != typ.Name {
				return &gqlError{at.child(rk.key), "__typename is " + shortJSON(v) + ", want " + quote(typ.Name)}
			}
			continue
		}
		fd := typ.Fields.ForName(f.Name)
		if fd == nil {
			fd = f.Definition
		}
		if fd == nil || fd.Type == nil {
			continue
		}
		if err := c.value(at.child(rk.key), fd.Type, rk.sub, rk, v); err != nil {
			return err
		}
	}
	return nil
}

// collect gathers the response keys the selection sets give an object of
// type typ, in query order (GraphQL's CollectFields, with every @skip and
// @include taken as possibly true).
func (c *gqlCheck) collect(typ *ast.Definition, sel []ast.SelectionSet, src *responseKey) []*responseKey {
	mk := memoKey{typ, src}
	if keys, ok := c.memo[mk]; ok {
		return keys
	}
	var keys []*responseKey
	index := map[string]*responseKey{}
	// visited: the fragments walked, unconditionally (true) or not
	// (false); a spread walks its fragment again only to make its fields
	// required.
	visited := map[string]bool{}
	var walk func(set ast.SelectionSet, conditional bool)
	walk = func(set ast.SelectionSet, conditional bool) {
		for _, s := range set {
			switch s := s.(type) {
			case *ast.Field:
				key := s.Alias
				if key == "" {
					key = s.Name
				}
				cond := conditional || hasCondition(s.Directives)
				rk := index[key]
				if rk == nil {
					rk = &responseKey{key: key}
					index[key] = rk
					keys = append(keys, rk)
				}
				rk.fields = append(rk.fields, s)
				if len(s.SelectionSet) > 0 {
					rk.sub = append(rk.sub, s.SelectionSet)
				}
				rk.required = rk.required || !cond
			case *ast.InlineFragment:
				if c.applies(typ, s.TypeCondition) {
					walk(s.SelectionSet, conditional || hasCondition(s.Directives))
				}
			case *ast.FragmentSpread:
				d := s.Definition
				if d == nil || !c.applies(typ, d.TypeCondition) {
					continue
				}
				cond := conditional || hasCondition(s.Directives) || hasCondition(d.Directives)
				if uncond, seen := visited[s.Name]; seen && (uncond || cond) {
					continue
				}
				visited[s.Name] = !cond
				walk(d.SelectionSet, cond)
			}
		}
	}
	for _, set := range sel {
		walk(set, false)
	}
	c.memo[mk] = keys
	return keys
}

func hasCondition(dirs ast.DirectiveList) bool {
	return dirs.ForName("skip") != nil || dirs.ForName("include") != nil
}

// applies reports whether a fragment's type condition holds for the object
// type typ.
func (c *gqlCheck) applies(typ *ast.Definition, cond string) bool {
	if cond == "" || cond == typ.Name {
		return true
	}
	return slices.Contains(c.g.objects[cond], typ)
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "boolean"
	case string:
		return "string"
	case json.Number:
		if isInteger(v) {
			return "integer"
		}
		return "float"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

func shortJSON(v any) string {
	if s, ok := v.(string); ok {
		return quote(s)
	}
	return jsonKind(v)
}

func quote(s string) string { return strconv.Quote(oneLine(s, 60)) }
