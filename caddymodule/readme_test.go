package caddymodule

import (
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

// TestDirectiveTable checks the directive reference of docs/caddyfile.md
// against the code: every field of the handler's JSON config has a row,
// every row names a subdirective the Caddyfile parser knows, and nothing
// else.
func TestDirectiveTable(t *testing.T) {
	raw, err := os.ReadFile("../docs/caddyfile.md")
	if err != nil {
		t.Fatal(err)
	}
	// The table's rows start with "| `<subdirective>".
	_, table, ok := strings.Cut(string(raw), "| subdirective | default | meaning |")
	if !ok {
		t.Fatal("docs/caddyfile.md has no subdirective table")
	}
	table, _, _ = strings.Cut(table, "\n\n")
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)").FindAllStringSubmatch(table, -1) {
		documented = append(documented, m[1])
	}

	// The JSON config's fields, named as the Caddyfile names them.
	caddyfileName := map[string]string{"providers": "provider", "in_flight_wait": "",
		"fingerprint_include": "fingerprint", "fingerprint_exclude": "fingerprint"}
	var fields []string
	ht := reflect.TypeFor[Handler]()
	for i := range ht.NumField() {
		name, _, _ := strings.Cut(ht.Field(i).Tag.Get("json"), ",")
		if name == "" || name == "-" {
			continue
		}
		if n, ok := caddyfileName[name]; ok {
			name = n
		}
		if name != "" {
			fields = append(fields, name)
		}
	}
	slices.Sort(documented)
	slices.Sort(fields)
	fields = slices.Compact(fields) // several JSON fields may share one subdirective
	if !slices.Equal(documented, fields) {
		t.Errorf("docs/caddyfile.md documents %v,\nthe JSON config has %v", documented, fields)
	}

	// Each documented name is a subdirective the parser knows (its
	// arguments may be missing here: any error but "unknown" will do).
	for _, name := range documented {
		var h Handler
		err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser("idempotency {\n" + name + "\n}"))
		if err != nil && strings.Contains(err.Error(), "unknown subdirective") {
			t.Errorf("docs/caddyfile.md documents %q, which the Caddyfile parser does not know: %v", name, err)
		}
	}
}

// TestDocLinks checks the links of the README, CONTRIBUTING.md and every
// file of docs/: each relative link names a file that exists, and each
// #fragment a heading of the file it points into (as GitHub makes
// anchors of headings). Links inside code are not links. The README also
// links every document of docs/, so no document is out of reach.
func TestDocLinks(t *testing.T) {
	docs, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md")
	}
	files := append([]string{"../README.md", "../CONTRIBUTING.md"}, docs...)
	anchors := map[string]map[string]bool{} // by cleaned path
	readAnchors := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		a := map[string]bool{}
		for _, h := range regexp.MustCompile(`(?m)^#{1,6} +(.+?) *$`).FindAllStringSubmatch(stripCode(string(raw), false), -1) {
			a[headingAnchor(h[1])] = true
		}
		anchors[path] = a
		return a
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	readmeLinks := map[string]bool{}
	for _, file := range files {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(stripCode(string(raw), true), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, frag, _ := strings.Cut(target, "#")
			resolved := filepath.Clean(file)
			if path != "" {
				resolved = filepath.Join(filepath.Dir(file), path)
			}
			if file == "../README.md" {
				readmeLinks[resolved] = true
			}
			if _, err := os.Stat(resolved); err != nil {
				t.Errorf("%s: link %q: %v", file, target, err)
				continue
			}
			if frag != "" && strings.HasSuffix(resolved, ".md") && !readAnchors(resolved)[frag] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", file, target, resolved, frag)
			}
		}
	}
	all, err := filepath.Glob("../docs/*")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range all {
		if st, err := os.Stat(f); err == nil && !st.IsDir() && !readmeLinks[filepath.Clean(f)] {
			t.Errorf("README.md does not link %s", f)
		}
	}
	if !readmeLinks[filepath.Clean("../CONTRIBUTING.md")] {
		t.Error("README.md does not link CONTRIBUTING.md")
	}
}

// stripCode blanks fenced code blocks and, with inline, code spans, so
// that what looks like a link or a heading inside code is not taken for
// one.
func stripCode(s string, inline bool) string {
	var b strings.Builder
	fenced := false
	for line := range strings.Lines(s) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			b.WriteString("\n")
			continue
		}
		if fenced {
			b.WriteString("\n")
			continue
		}
		if inline {
			line = regexp.MustCompile("`[^`]*`").ReplaceAllString(line, "``")
		}
		b.WriteString(line)
	}
	return b.String()
}

// headingAnchor is the anchor GitHub gives a heading: lower case, code
// marks and punctuation other than - and _ dropped, spaces made hyphens.
func headingAnchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
