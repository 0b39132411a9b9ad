package caddymodule

import (
	"os"
	"runtime"

	"go.uber.org/zap"
)

// flushProcs gives the Go runtime a second P (processor) when it has one,
// as on a machine with one CPU, or in a container whose CPU quota is one
// (Caddy sets GOMAXPROCS from the quota at start). The file ledger's flush
// is a blocking fdatasync, and the runtime hands the P of a goroutine
// blocked in a system call to another thread only when its monitor next
// looks, which can be milliseconds later: with one P the gateway stops for
// every flush, and requests join a flush only between two of them (a
// third of the requests per second, in docs/performance.md, "One CPU").
// A GOMAXPROCS the environment set is kept, with a warning.
func flushProcs(log *zap.Logger) {
	if runtime.GOMAXPROCS(0) > 1 {
		return
	}
	if os.Getenv("GOMAXPROCS") != "" {
		log.Warn("GOMAXPROCS=1: the gateway stops while the file ledger flushes; set GOMAXPROCS to 2 or more")
		return
	}
	runtime.GOMAXPROCS(2)
	log.Info("GOMAXPROCS raised from 1 to 2: the file ledger's flushes block a thread, and the gateway goes on beside them")
}
