package onejob

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocComments walks every package `go list ./...` lists and fails on
// an exported identifier without a doc comment: a type, a function, a
// method of an exported type, a constant or a variable. A constant or
// variable in a parenthesized group may rely on the group's comment or
// its own line comment, as go doc shows them. It reads every non-test Go
// file of a package's folder, whatever its build tags (the integration
// harness's included), except generated files; struct fields and
// interface methods are left to review.
func TestDocComments(t *testing.T) {
	out, err := exec.Command("go", "list", "-e", "-f", "{{.Dir}}", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	dirs := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(dirs) < 5 {
		t.Fatalf("go list found only %v", dirs)
	}
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments)
			if err != nil {
				t.Fatal(err)
			}
			if ast.IsGenerated(f) {
				continue
			}
			rel, _ := filepath.Rel(root, path)
			for _, name := range undocumented(f) {
				t.Errorf("no doc comment: %s: %s", rel, name)
			}
		}
	}
}

// TestUndocumented: the check itself, on a file with each kind of
// declaration, documented and not.
func TestUndocumented(t *testing.T) {
	const src = `package p

// A is documented.
type A int

type B int

type (
	// C is documented.
	C int
	D int
)

// String is documented.
func (A) String() string { return "" }

func (*B) String() string { return "" }

func (u) String() string { return "" }

type u int

func F() {}

// G is documented.
func G() {}

// Group doc covers its members.
const (
	E1 = 1
	E2 = 2
)

const (
	H1 = 1 // a line comment will do in a group
	H2 = 2
	_  = 3
)

var V, w = 1, 2

// Generic is documented.
type Generic[T any] struct{}

func (Generic[T]) M() {}
`
	f, err := parser.ParseFile(token.NewFileSet(), "p.go", src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(undocumented(f), ", ")
	want := "type B, type D, method B.String, func F, const H2, var V, method Generic.M"
	if got != want {
		t.Errorf("undocumented: %s\nwant          %s", got, want)
	}
}

// undocumented lists the exported identifiers of f that have no doc
// comment.
func undocumented(f *ast.File) []string {
	var out []string
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || d.Doc != nil {
				continue
			}
			if d.Recv == nil {
				out = append(out, "func "+d.Name.Name)
			} else if recv := receiverType(d.Recv.List[0].Type); ast.IsExported(recv) {
				out = append(out, "method "+recv+"."+d.Name.Name)
			}
		case *ast.GenDecl:
			grouped := d.Lparen.IsValid()
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() && s.Doc == nil && (grouped || d.Doc == nil) {
						out = append(out, "type "+s.Name.Name)
					}
				case *ast.ValueSpec:
					if s.Doc != nil || d.Doc != nil || (grouped && s.Comment != nil) {
						continue
					}
					for _, n := range s.Names {
						if n.IsExported() {
							out = append(out, d.Tok.String()+" "+n.Name)
						}
					}
				}
			}
		}
	}
	return out
}

// receiverType is the name of a method receiver's type: T for T, *T,
// T[P] and *T[P].
func receiverType(e ast.Expr) string {
	for {
		switch x := e.(type) {
		case *ast.StarExpr:
			e = x.X
		case *ast.IndexExpr:
			e = x.X
		case *ast.IndexListExpr:
			e = x.X
		case *ast.Ident:
			return x.Name
		default:
			return ""
		}
	}
}
