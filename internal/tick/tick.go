// Package tick runs a function at a steady interval until its context
// ends: the loop the gateway's background work (sweeping, lookups) shares.
package tick

import (
	"context"
	"time"
)

// Every calls fn every d, the first time d from now, until ctx ends.
func Every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}
