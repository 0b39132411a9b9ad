package caddymodule

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A gateway with one P stops while the file ledger's flush blocks in
// fdatasync (docs/performance-history.md, "One CPU"), but the number of Ps is
// the process's, not a module's: opening a file ledger leaves GOMAXPROCS
// as it found it, whether or not the environment set it.
func TestFileLedgerKeepsProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, env := range []string{"", "1"} {
		t.Setenv("GOMAXPROCS", env)
		runtime.GOMAXPROCS(1)
		ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
		f := &FileLedger{Path: t.TempDir()}
		if err := f.Provision(ctx); err != nil {
			cancel()
			t.Fatal(err)
		}
		n := runtime.GOMAXPROCS(0)
		f.Cleanup()
		cancel()
		if n != 1 {
			t.Errorf("GOMAXPROCS after opening a file ledger with one (environment %q): %d, want 1", env, n)
		}
	}
}

// With one P the file ledger warns, once, and says what to set; with two
// or more it says nothing.
func TestWarnOneProc(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		procs  int
		logged int // warnings on GOMAXPROCS
	}{
		{procs: 1, logged: 1},
		{procs: 2},
		{procs: 3},
	} {
		runtime.GOMAXPROCS(tc.procs)
		core, logs := observer.New(zap.DebugLevel)
		warnOneProc(zap.New(core))
		if n := runtime.GOMAXPROCS(0); n != tc.procs {
			t.Errorf("GOMAXPROCS %d became %d", tc.procs, n)
		}
		if len(logs.All()) != tc.logged {
			t.Errorf("GOMAXPROCS %d: logged %v, want %d warnings", tc.procs, logs.All(), tc.logged)
			continue
		}
		for _, e := range logs.All() {
			if e.Level != zapcore.WarnLevel || !strings.Contains(e.Message, "set GOMAXPROCS=2") {
				t.Errorf("GOMAXPROCS %d: logged %q at %v, want a warning that says to set GOMAXPROCS=2", tc.procs, e.Message, e.Level)
			}
		}
	}
}
