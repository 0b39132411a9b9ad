//go:build integration

package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// pluginModules are the modules a Caddy with onejob has: the handler, the
// app that holds its per-config state, the admin endpoints, every ledger
// and the replay cache.
var pluginModules = []string{
	"admin.api.idempotency",
	"http.handlers.idempotency",
	"idempotency",
	"idempotency.caches.redis",
	"idempotency.ledgers.file",
	"idempotency.ledgers.memory",
	"idempotency.ledgers.postgres",
	"idempotency.ledgers.redis",
}

// xcaddyVersion is the xcaddy the plugin build is tested with.
const xcaddyVersion = "v0.4.5"

// onejobModules returns the app idempotency, the modules of its namespace,
// and those named idempotency in another namespace, that `<bin>
// list-modules` lists.
func onejobModules(t *testing.T, bin string) []string {
	t.Helper()
	out, err := exec.Command(bin, "list-modules").Output()
	if err != nil {
		t.Fatalf("%s list-modules: %v", bin, err)
	}
	var mods []string
	for _, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "idempotency" || strings.HasPrefix(line, "idempotency.") || strings.HasSuffix(line, ".idempotency") {
			mods = append(mods, line)
		}
	}
	slices.Sort(mods)
	return mods
}

// TestListModules: the Caddy that ./xcaddy.sh builds (./cmd/caddy, which
// the harness built) lists the handler, its app, the admin module, every
// ledger and the cache.
func TestListModules(t *testing.T) {
	if got := onejobModules(t, binary); !slices.Equal(got, pluginModules) {
		t.Errorf("list-modules shows %v, want %v", got, pluginModules)
	}
}

// TestXcaddyBuild: `xcaddy build v2.11.9 --with github.com/onejob/onejob@v0.0.0=.`
// builds a Caddy with onejob as every Caddy plugin is built (the root
// package registers the modules), and that Caddy lists the same modules
// as ./xcaddy.sh's. xcaddy and whatever its build module needs beyond
// this module's go.sum come from the module proxy, as they do for anyone
// who builds the plugin: an offline build (GOPROXY=off) depends on what
// the module cache happens to hold (Caddy's standard modules import
// packages this module never builds, and go resolves their imports by
// lookup), and failed on a clean machine for that alone.
func TestXcaddyBuild(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	gobin := filepath.Join(tmp, "bin")
	run := func(env []string, name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), env...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run([]string{"GOBIN=" + gobin}, "go", "install", "github.com/caddyserver/xcaddy/cmd/xcaddy@"+xcaddyVersion)
	// xcaddy's temporary module pins Caddy and takes onejob from this
	// checkout; the version it names spares go a lookup of onejob, which
	// a module proxy that does not know it may refuse (403, not 404). The
	// toolchain stays this one.
	out := filepath.Join(tmp, "caddy")
	run([]string{"GOTOOLCHAIN=local"}, filepath.Join(gobin, "xcaddy"), "build", "v2.11.9", "--with", "github.com/onejob/onejob@v0.0.0=.", "--output", out)

	if got, want := onejobModules(t, out), onejobModules(t, binary); !slices.Equal(got, pluginModules) || !slices.Equal(got, want) {
		t.Errorf("the xcaddy build lists %v; ./cmd/caddy lists %v; want %v", got, want, pluginModules)
	}
}
