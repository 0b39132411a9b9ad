package caddymodule

import (
	"context"
	"runtime"
	"testing"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// A gateway with one P stops while the file ledger's flush blocks in
// fdatasync (docs/performance.md, "One CPU"): opening a file ledger gives
// the runtime a second P, unless the environment set GOMAXPROCS.
func TestFileLedgerGetsSecondProc(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	t.Setenv("GOMAXPROCS", "")
	runtime.GOMAXPROCS(1)
	ctx, cancel := caddy.NewContext(caddy.Context{Context: context.Background()})
	defer cancel()
	f := &FileLedger{Path: t.TempDir()}
	if err := f.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	defer f.Cleanup()
	if n := runtime.GOMAXPROCS(0); n != 2 {
		t.Errorf("GOMAXPROCS after opening a file ledger with one: %d, want 2", n)
	}
}

func TestFlushProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		name, env   string
		procs, want int
		logged      int // entries on GOMAXPROCS, at level
		level       zapcore.Level
	}{
		{name: "one", procs: 1, want: 2, logged: 1, level: zap.InfoLevel},
		{name: "one, set by the environment", env: "1", procs: 1, want: 1, logged: 1, level: zap.WarnLevel},
		{name: "more", procs: 3, want: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("GOMAXPROCS", tc.env)
			runtime.GOMAXPROCS(tc.procs)
			core, logs := observer.New(zap.DebugLevel)
			flushProcs(zap.New(core))
			if n := runtime.GOMAXPROCS(0); n != tc.want {
				t.Errorf("GOMAXPROCS %d (environment %q) became %d, want %d", tc.procs, tc.env, n, tc.want)
			}
			entries := logs.FilterMessageSnippet("GOMAXPROCS").All()
			if len(entries) != tc.logged || (tc.logged == 1 && entries[0].Level != tc.level) {
				t.Errorf("logged %v; want %d entries at %v", logs.All(), tc.logged, tc.level)
			}
		})
	}
}
