package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

	"github.com/onejob/onejob/internal/jsonpointer"
)

// Spec is the configuration of a contract (from the Caddyfile's
// contract block).
type Spec struct {
	// Statuses are the answers the contract checks: codes ("200") and
	// classes ("2xx"). Empty: 2xx.
	Statuses []string
	// ContentType is the media type answers must have, e.g.
	// "application/json"; "" is not checked.
	ContentType string
	// JSONSchema is the path of a JSON Schema file the body must be valid
	// against (draft 2020-12 unless the file says otherwise); "" is none.
	JSONSchema string
	// JSONSchemaAt, when set, is a JSON Pointer (RFC 6901) to the member
	// of the body JSONSchema checks instead of the whole body: a string
	// there is parsed as JSON first (a model's structured output, as in
	// /choices/0/message/content), and a streamed completion
	// (text/event-stream) is assembled from its deltas first (see
	// AssembleStream). Needs JSONSchema.
	JSONSchemaAt string
	// GraphQLSchema is the path of a GraphQL SDL schema file; the body must
	// be a GraphQL response that fits the client's operation; "" is none.
	GraphQLSchema string
}

// Contract is a compiled Spec. It is safe for concurrent use.
type Contract struct {
	codes       map[int]bool
	classes     [6]bool // classes[2]: 2xx
	contentType string  // lower-case type/subtype; "" is not checked
	jsonSchema  *jsonschema.Schema
	at          jsonpointer.Pointer // the member jsonSchema checks; nil: the body
	graphql     *graphQLSchema
}

// Breach is a broken contract rule.
type Breach struct {
	// Rule is "content_type", "json_schema" or "graphql_schema".
	Rule string
	// Detail says what is wrong, on one line.
	Detail string
}

// Error says which rule broke and how: "contract: <rule>: <detail>".
func (b *Breach) Error() string { return "contract: " + b.Rule + ": " + b.Detail }

// The rules a Breach names.
const (
	RuleContentType   = "content_type"
	RuleJSONSchema    = "json_schema"
	RuleGraphQLSchema = "graphql_schema"
)

// maxDetail bounds a Breach's Detail, in bytes.
const maxDetail = 240

func breach(rule, detail string) *Breach {
	return &Breach{Rule: rule, Detail: oneLine(detail, maxDetail)}
}

// Compile reads and compiles the files a contract names.
func Compile(spec Spec) (*Contract, error) {
	c := &Contract{codes: map[int]bool{}}
	if err := c.parseStatuses(spec.Statuses); err != nil {
		return nil, err
	}
	if spec.ContentType != "" {
		mt, _, err := mime.ParseMediaType(spec.ContentType)
		if err != nil || !strings.Contains(mt, "/") {
			return nil, fmt.Errorf("contract: content_type %q is not a media type", spec.ContentType)
		}
		c.contentType = mt
	}
	if spec.JSONSchema != "" {
		sch, err := compileJSONSchema(spec.JSONSchema)
		if err != nil {
			return nil, fmt.Errorf("contract: json_schema %s: %s", spec.JSONSchema, oneLine(err.Error(), 400))
		}
		c.jsonSchema = sch
	}
	if spec.JSONSchemaAt != "" {
		if spec.JSONSchema == "" {
			return nil, errors.New("contract: json_schema at " + spec.JSONSchemaAt + ": a pointer needs a schema file")
		}
		p, err := jsonpointer.Parse(spec.JSONSchemaAt)
		if err != nil {
			return nil, fmt.Errorf("contract: json_schema at: %w", err)
		}
		c.at = p
	}
	if spec.GraphQLSchema != "" {
		g, err := loadGraphQLSchema(spec.GraphQLSchema)
		if err != nil {
			return nil, fmt.Errorf("contract: graphql_schema %s: %s", spec.GraphQLSchema, oneLine(err.Error(), 400))
		}
		c.graphql = g
	}
	return c, nil
}

func (c *Contract) parseStatuses(words []string) error {
	if len(words) == 0 {
		c.classes[2] = true
		return nil
	}
	for _, w := range words {
		if len(w) == 3 && (w[1] == 'x' || w[1] == 'X') && (w[2] == 'x' || w[2] == 'X') {
			if w[0] < '1' || w[0] > '5' {
				return fmt.Errorf("contract: status %q is not a class 1xx to 5xx", w)
			}
			c.classes[w[0]-'0'] = true
			continue
		}
		code, err := strconv.Atoi(w)
		if err != nil || len(w) != 3 || code < 100 || code > 599 {
			return fmt.Errorf("contract: status %q is not a status code (100-599) or a class (2xx)", w)
		}
		c.codes[code] = true
	}
	return nil
}

// Applies reports whether the contract checks answers with this status.
func (c *Contract) Applies(status int) bool {
	if c == nil || status < 100 || status > 599 {
		return false
	}
	return c.codes[status] || c.classes[status/100]
}

// ChecksBody reports whether a rule reads the body (json_schema or
// graphql_schema): such answers must be buffered to be checked.
func (c *Contract) ChecksBody() bool {
	return c != nil && (c.jsonSchema != nil || c.graphql != nil)
}

// CheckHead checks the rules that need only the answer's head
// (content_type). It returns nil when the contract does not apply to status,
// else nil or a *Breach.
func (c *Contract) CheckHead(status int, h http.Header) error {
	if !c.Applies(status) || c.contentType == "" {
		return nil
	}
	got := h.Get("Content-Type")
	if got == "" {
		return breach(RuleContentType, "no Content-Type, want "+c.contentType)
	}
	mt, _, err := mime.ParseMediaType(got)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return breach(RuleContentType, fmt.Sprintf("got %q, want %s", got, c.contentType))
	}
	if mt != c.contentType {
		return breach(RuleContentType, fmt.Sprintf("got %s, want %s", mt, c.contentType))
	}
	return nil
}

// Check checks every rule against an answer. request is the client's request
// body (graphql_schema reads the operation from it). It returns nil when the
// contract does not apply to status, else nil or the first *Breach.
func (c *Contract) Check(status int, h http.Header, body []byte, request []byte) error {
	if !c.Applies(status) {
		return nil
	}
	if err := c.CheckHead(status, h); err != nil {
		return err
	}
	if !c.ChecksBody() {
		return nil
	}
	if c.jsonSchema != nil {
		doc, detail := c.checkedJSON(h, body)
		if detail != "" {
			return breach(RuleJSONSchema, detail)
		}
		if err := c.jsonSchema.Validate(doc); err != nil {
			if c.at != nil {
				return breach(RuleJSONSchema, "in "+c.at.String()+", "+describeValidation(err))
			}
			return breach(RuleJSONSchema, describeValidation(err))
		}
	}
	if c.graphql != nil {
		doc, jsonErr := decodeJSON(body)
		if jsonErr != nil {
			return breach(RuleGraphQLSchema, "body is not JSON: "+jsonErr.Error())
		}
		if detail := c.graphql.check(doc, request, len(body)); detail != "" {
			return breach(RuleGraphQLSchema, detail)
		}
	}
	return nil
}

// checkedJSON returns the JSON value the schema checks, decoded, or says
// why there is none: the body; or with at, the member at the pointer, in
// a streamed completion assembled first, and parsed as JSON when it is a
// string.
func (c *Contract) checkedJSON(h http.Header, body []byte) (any, string) {
	if c.at == nil {
		doc, err := decodeJSON(body)
		if err != nil {
			return nil, "body is not JSON: " + err.Error()
		}
		return doc, ""
	}
	if IsEventStream(h) {
		doc, err := AssembleStream(body)
		if err != nil {
			return nil, "stream: " + err.Error()
		}
		body = doc
	} else if !json.Valid(body) {
		_, err := decodeJSON(body)
		if err == nil { // valid after all: json.Valid and the decoder disagree
			err = errors.New("invalid JSON")
		}
		return nil, "body is not JSON: " + err.Error()
	}
	member, ok := c.at.Lookup(bytes.TrimSpace(body))
	if !ok {
		return nil, "no member at " + c.at.String()
	}
	if member[0] == '"' {
		var text string
		if err := json.Unmarshal(member, &text); err != nil {
			return nil, c.at.String() + ": " + err.Error()
		}
		doc, err := decodeJSON([]byte(text))
		if err != nil {
			return nil, c.at.String() + " is a string that is not JSON: " + err.Error()
		}
		return doc, ""
	}
	doc, err := decodeJSON(member)
	if err != nil {
		return nil, c.at.String() + ": " + err.Error()
	}
	return doc, ""
}

// decodeJSON decodes one JSON value, numbers as json.Number, as the JSON
// Schema validator expects.
func decodeJSON(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, errors.New("empty body")
		}
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the top-level value")
	}
	return v, nil
}

// compileJSONSchema reads and compiles a JSON Schema file; references to
// other local files resolve relative to it.
func compileJSONSchema(path string) (*jsonschema.Schema, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	doc, err := decodeJSON(b)
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, err
	}
	comp := jsonschema.NewCompiler()
	comp.DefaultDraft(jsonschema.Draft2020)
	if err := comp.AddResource(abs, doc); err != nil {
		return nil, err
	}
	sch, err := comp.Compile(abs)
	if err != nil {
		var sv *jsonschema.SchemaValidationError
		if errors.As(err, &sv) {
			return nil, errors.New("not a valid schema: " + describeValidation(sv.Err))
		}
		return nil, err
	}
	return sch, nil
}

var printer = message.NewPrinter(language.English)

// describeValidation names the first failing location of a validation error
// and why, on one line. The validator's causes come in map order, so the
// first is chosen by location, then message: the same input always gives
// the same text.
func describeValidation(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	loc, msg := firstFailure(ve)
	return "at " + pointer(loc) + ": " + msg
}

func firstFailure(e *jsonschema.ValidationError) (loc []string, msg string) {
	switch e.ErrorKind.(type) {
	case *kind.AnyOf, *kind.OneOf:
		// Stop here: one branch's failure alone would mislead. Say
		// briefly why each branch failed.
		msg = kindMessage(e.ErrorKind)
		var why []string
		for _, c := range e.Causes {
			_, m := firstFailure(c)
			why = append(why, m)
		}
		if len(why) > 0 {
			msg += " (" + strings.Join(why, "; ") + ")"
		}
		return e.InstanceLocation, msg
	}
	if len(e.Causes) == 0 {
		return e.InstanceLocation, kindMessage(e.ErrorKind)
	}
	for i, c := range e.Causes {
		l, m := firstFailure(c)
		if cmp := comparePointers(l, loc); i == 0 || cmp < 0 || cmp == 0 && m < msg {
			loc, msg = l, m
		}
	}
	return loc, msg
}

func kindMessage(k jsonschema.ErrorKind) string {
	switch k := k.(type) {
	case *kind.Type:
		return "expected " + strings.Join(k.Want, " or ") + ", got " + k.Got
	case *kind.AdditionalProperties:
		props := slices.Clone(k.Properties)
		slices.Sort(props)
		return (&kind.AdditionalProperties{Properties: props}).LocalizedString(printer)
	}
	return k.LocalizedString(printer)
}

// pointer renders a location as a JSON pointer; the root is "(root)".
func pointer(tokens []string) string {
	if len(tokens) == 0 {
		return "(root)"
	}
	var sb strings.Builder
	for _, t := range tokens {
		sb.WriteByte('/')
		t = strings.ReplaceAll(t, "~", "~0")
		sb.WriteString(strings.ReplaceAll(t, "/", "~1"))
	}
	return sb.String()
}

// comparePointers orders locations token by token, array indexes
// numerically.
func comparePointers(a, b []string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		x, y := a[i], b[i]
		if x == y {
			continue
		}
		if isDigits(x) && isDigits(y) && len(x) != len(y) {
			return len(x) - len(y)
		}
		return strings.Compare(x, y)
	}
	return len(a) - len(b)
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// oneLine escapes control characters and invalid UTF-8 in s and cuts it to
// at most limit bytes, marking a cut with "…".
func oneLine(s string, limit int) string {
	var sb strings.Builder
	for i, r := range s {
		var piece string
		switch {
		case r == utf8.RuneError && !strings.HasPrefix(s[i:], "\uFFFD"):
			piece = `\ufffd`
		case unicode.IsControl(r) || r == '\u2028' || r == '\u2029':
			piece = strings.Trim(strconv.QuoteRune(r), "'")
		default:
			piece = string(r)
		}
		if sb.Len()+len(piece) > limit-len("…") {
			sb.WriteString("…")
			return sb.String()
		}
		sb.WriteString(piece)
	}
	return sb.String()
}
