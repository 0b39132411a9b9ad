package caddymodule

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

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
	caddyfileName := map[string]string{"providers": "provider", "in_flight_wait": ""}
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
