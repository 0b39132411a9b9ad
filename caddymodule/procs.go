package caddymodule

import (
	"runtime"

	"go.uber.org/zap"
)

// warnOneProc warns when the Go runtime has a single P (processor), as on
// a machine with one CPU, under taskset, or in a container whose CPU
// quota is one. The file ledger's flush is a blocking fsync, and the
// runtime hands the P of a goroutine blocked in a system call to another
// thread only when its monitor next looks, which can be milliseconds
// later: with one P the gateway stops for every flush, and requests join
// a flush only between two of them (a third of the requests per second,
// in docs/performance-history.md, "One CPU"). GOMAXPROCS belongs to the process,
// not to a module: the operator sets it, and this only says so.
func warnOneProc(log *zap.Logger) {
	if runtime.GOMAXPROCS(0) > 1 {
		return
	}
	log.Warn("GOMAXPROCS=1: the file ledger's fsync blocks the only P, and the gateway stops while it flushes; set GOMAXPROCS=2")
}
