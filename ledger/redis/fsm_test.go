package redis

import (
	"testing"

	"github.com/onejob/onejob/ledger/internal/near"
	"github.com/onejob/onejob/ledger/ledgertest/differential"
)

// TestScriptsFollowFSM holds the Lua scripts, on miniredis, to
// ledger/internal/fsm (differential.Run): the Lua rules are the
// fsm's rules.
func TestScriptsFollowFSM(t *testing.T) {
	seeds, steps := 60, 50
	if testing.Short() {
		seeds = 10
	}
	differential.Run(t, func(t *testing.T) differential.Subject {
		m := newMini(t)
		l := openMini(t, m, "diff:")
		l.replays = near.New(0, 0)
		return differential.Subject{Name: "scripts", Ledger: l, SetClock: m.SetTime}
	}, seeds, steps)
}
