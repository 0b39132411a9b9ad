package fingerprint

import (
	"encoding/json"
	"maps"
	"slices"

	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/parser"
)

// GraphQLRequest is what the fingerprint and the ledgering decision need from
// a GraphQL-over-HTTP POST body.
type GraphQLRequest struct {
	// Canonical is the request's canonical encoding, which the fingerprint
	// hashes in graphql mode: the length-prefixed canonical document,
	// operationName, variables and the body's other members (see
	// ParseGraphQL).
	Canonical []byte
	// Mutation says the operation to execute is a mutation. Only mutations
	// are ledgered: queries and subscriptions pass through.
	Mutation bool
}

// ParseGraphQL parses body as {"query": "...", "operationName": "...",
// "variables": {...}}. It returns ok=false when the body is not such a JSON
// object or the document does not parse; the request is then forwarded as
// is and fingerprinted raw (and, since it may be a mutation, ledgered).
//
// In graphql mode the middleware parses the body once, with ParseGraphQL,
// decides from Mutation whether to ledger the request, and computes its
// fingerprint with Fingerprinter.SumGraphQL, which does not parse it again.
//
// The body must be canonical JSON's input: valid UTF-8, without duplicate
// keys or unpaired surrogate escapes. "query" must be a string;
// "operationName" a string or null; "variables" an object or null.
//
// The operation to execute is the one named by operationName, or the
// document's only operation. When operationName names none (or several), or
// it is empty and the document holds other than one operation, ok is false.
//
// Canonical is four length-prefixed parts:
//
//   - the document, parsed by gqlparser without a schema and printed by
//     printDocument: white space, commas, comments, descriptions, block
//     string layout and string escapes do not change it; the order of
//     fields, arguments, object fields and directives does, and so does the
//     order of operations among themselves and of fragments among
//     themselves.
//   - operationName, "" when it is absent or null.
//   - variables as canonical JSON; absent, null and {} are all {}.
//   - the body's other members (such as "extensions") as a canonical JSON
//     object, {} when there are none, so that nothing the server may act on
//     is left out of the fingerprint.
func ParseGraphQL(body []byte) (req GraphQLRequest, ok bool) {
	canon, ok := CanonicalJSON(body)
	if !ok || canon[0] != '{' {
		return GraphQLRequest{}, false
	}
	// Every member of canon is canonical JSON already, and its keys are
	// unique.
	var members map[string]json.RawMessage
	if json.Unmarshal(canon, &members) != nil {
		return GraphQLRequest{}, false
	}
	var query, name string
	if raw := members["query"]; len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &query) != nil {
		return GraphQLRequest{}, false // absent, null, or not a string
	}
	if raw, ok := members["operationName"]; ok && string(raw) != "null" {
		if json.Unmarshal(raw, &name) != nil {
			return GraphQLRequest{}, false
		}
	}
	vars := json.RawMessage("{}")
	if raw, ok := members["variables"]; ok && string(raw) != "null" {
		if raw[0] != '{' {
			return GraphQLRequest{}, false
		}
		vars = raw
	}
	doc, ok := parseDocument(query)
	if !ok {
		return GraphQLRequest{}, false
	}
	op, ok := selectOperation(doc, name)
	if !ok {
		return GraphQLRequest{}, false
	}

	rest := []byte{'{'}
	for _, k := range slices.Sorted(maps.Keys(members)) {
		switch k {
		case "query", "operationName", "variables":
			continue
		}
		if len(rest) > 1 {
			rest = append(rest, ',')
		}
		rest = appendJSONString(rest, k)
		rest = append(rest, ':')
		rest = append(rest, members[k]...)
	}
	rest = append(rest, '}')

	printed := printDocument(doc)
	enc := make([]byte, 0, len(printed)+len(name)+len(vars)+len(rest)+16)
	enc = appendField(enc, printed)
	enc = appendField(enc, []byte(name))
	enc = appendField(enc, vars)
	enc = appendField(enc, rest)
	return GraphQLRequest{Canonical: enc, Mutation: op.Operation == ast.Mutation}, true
}

// parseDocument parses an executable GraphQL document. It refuses one that
// escapes an unpaired UTF-16 surrogate (a string holding "\ud800"): the
// parser turns each into U+FFFD, so distinct documents would print alike.
// The check also refuses such text in comments and block strings, where it
// is harmless: those documents are merely hashed raw.
func parseDocument(query string) (*ast.QueryDocument, bool) {
	if loneSurrogate([]byte(query)) {
		return nil, false
	}
	doc, err := parser.ParseQuery(&ast.Source{Input: query})
	if err != nil {
		return nil, false
	}
	return doc, true
}

// selectOperation returns the operation a server would execute: the one
// named name, or the only one when name is empty.
func selectOperation(doc *ast.QueryDocument, name string) (*ast.OperationDefinition, bool) {
	var found *ast.OperationDefinition
	for _, op := range doc.Operations {
		if name == "" && len(doc.Operations) == 1 || name != "" && op.Name == name {
			if found != nil {
				return nil, false // two operations of that name
			}
			found = op
		}
	}
	return found, found != nil
}

// printDocument prints doc in its canonical form. It prints the document
// itself rather than with gqlparser's formatter, whose output would then be
// part of the fingerprint: that formatter drops directives on variable
// definitions (two different documents would print alike), prints
// descriptions in a form that does not parse back to the same text, and may
// change its layout from one release to the next, while a fingerprint must
// stay the same across instances and releases.
//
// The form: operations in order, then fragments in order; every operation
// with its keyword (the { ... } shorthand is "query"); no comments or
// descriptions; an alias only when it differs from the field's name;
// strings, block strings included, as JSON-style string literals of their
// values; numbers, enum values and names as written; lists, arguments,
// variable definitions and object fields separated by commas, selections
// by a space, and otherwise a space only between two name or number
// characters. Printing the parsed form again gives the same bytes.
func printDocument(doc *ast.QueryDocument) []byte {
	var p docPrinter
	for _, op := range doc.Operations {
		p.word(string(op.Operation))
		if op.Name != "" {
			p.word(op.Name)
		}
		p.variableDefinitions(op.VariableDefinitions)
		p.directives(op.Directives)
		p.selectionSet(op.SelectionSet)
	}
	for _, f := range doc.Fragments {
		p.word("fragment")
		p.word(f.Name)
		p.variableDefinitions(f.VariableDefinition)
		p.word("on")
		p.word(f.TypeCondition)
		p.directives(f.Directives)
		p.selectionSet(f.SelectionSet)
	}
	return p.b
}

type docPrinter struct{ b []byte }

func isNameByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// word writes a name, keyword or number, after a space when it would
// otherwise run into the previous one.
func (p *docPrinter) word(s string) {
	if len(p.b) > 0 && isNameByte(p.b[len(p.b)-1]) {
		p.b = append(p.b, ' ')
	}
	p.b = append(p.b, s...)
}

func (p *docPrinter) punct(s string) { p.b = append(p.b, s...) }

func (p *docPrinter) variableDefinitions(defs ast.VariableDefinitionList) {
	if len(defs) == 0 {
		return
	}
	p.punct("(")
	for i, d := range defs {
		if i > 0 {
			p.punct(",")
		}
		p.punct("$")
		p.word(d.Variable)
		p.punct(":")
		p.typ(d.Type)
		if d.DefaultValue != nil {
			p.punct("=")
			p.value(d.DefaultValue)
		}
		p.directives(d.Directives)
	}
	p.punct(")")
}

func (p *docPrinter) typ(t *ast.Type) {
	if t.Elem != nil {
		p.punct("[")
		p.typ(t.Elem)
		p.punct("]")
	} else {
		p.word(t.NamedType)
	}
	if t.NonNull {
		p.punct("!")
	}
}

func (p *docPrinter) directives(ds ast.DirectiveList) {
	for _, d := range ds {
		p.punct("@")
		p.word(d.Name)
		p.arguments(d.Arguments)
	}
}

func (p *docPrinter) arguments(args ast.ArgumentList) {
	if len(args) == 0 {
		return
	}
	p.punct("(")
	for i, a := range args {
		if i > 0 {
			p.punct(",")
		}
		p.word(a.Name)
		p.punct(":")
		p.value(a.Value)
	}
	p.punct(")")
}

func (p *docPrinter) selectionSet(set ast.SelectionSet) {
	if len(set) == 0 {
		return
	}
	p.punct("{")
	for i, sel := range set {
		if i > 0 {
			p.punct(" ")
		}
		switch s := sel.(type) {
		case *ast.Field:
			if s.Alias != "" && s.Alias != s.Name {
				p.word(s.Alias)
				p.punct(":")
			}
			p.word(s.Name)
			p.arguments(s.Arguments)
			p.directives(s.Directives)
			p.selectionSet(s.SelectionSet)
		case *ast.FragmentSpread:
			p.punct("...")
			p.word(s.Name)
			p.directives(s.Directives)
		case *ast.InlineFragment:
			p.punct("...")
			if s.TypeCondition != "" {
				p.word("on")
				p.word(s.TypeCondition)
			}
			p.directives(s.Directives)
			p.selectionSet(s.SelectionSet)
		}
	}
	p.punct("}")
}

func (p *docPrinter) value(v *ast.Value) {
	switch v.Kind {
	case ast.Variable:
		p.punct("$")
		p.word(v.Raw)
	case ast.StringValue, ast.BlockValue:
		p.b = appendJSONString(p.b, v.Raw)
	case ast.ListValue:
		p.punct("[")
		for i, c := range v.Children {
			if i > 0 {
				p.punct(",")
			}
			p.value(c.Value)
		}
		p.punct("]")
	case ast.ObjectValue:
		p.punct("{")
		for i, c := range v.Children {
			if i > 0 {
				p.punct(",")
			}
			p.word(c.Name)
			p.punct(":")
			p.value(c.Value)
		}
		p.punct("}")
	default: // IntValue, FloatValue, BooleanValue, NullValue, EnumValue
		p.word(v.Raw)
	}
}
