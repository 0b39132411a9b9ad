//go:build integration

package redis

import (
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

var serverHarness = ledgertest.Harness{
	New: func(t *testing.T) ledger.Ledger { return open(t, newPrefix(t)) },
	Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
		return open(t, l.(*Ledger).Prefix())
	},
}

func TestRedisPurge(t *testing.T) { ledgertest.RunPurge(t, serverHarness) }

// The job hashes, read with HGETALL as an operator would, hold no answer
// in clear.
func TestRedisSealed(t *testing.T) { ledgertest.RunSealed(t, serverHarness, dumpKeys) }
