package redis

import (
	"bytes"
	"context"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

func miniHarness(m *miniredis.Miniredis) ledgertest.Harness {
	return ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger { return openMini(t, m, "t:"+ledger.NewID()+":") },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return openMini(t, m, l.(*Ledger).Prefix())
		},
	}
}

func TestMiniredisPurge(t *testing.T) {
	ledgertest.RunPurge(t, miniHarness(miniredis.RunT(t)))
}

// A purge walks the index in steps: the owner's jobs in every step go.
func TestMiniredisPurgeInSteps(t *testing.T) {
	defer func(n int) { purgeBatch = n }(purgeBatch)
	purgeBatch = 2
	ledgertest.RunPurge(t, miniHarness(miniredis.RunT(t)))
}

func TestMiniredisSealed(t *testing.T) {
	ledgertest.RunSealed(t, miniHarness(miniredis.RunT(t)), dumpKeys)
}

// dumpKeys is the operator's view of a Redis ledger: every key of its
// prefix (the job hashes above all) and what it holds.
func dumpKeys(t *testing.T, l ledger.Ledger) []byte {
	r := l.(*Ledger)
	ctx := context.Background()
	c := r.Client()
	var b bytes.Buffer
	iter := c.Scan(ctx, 0, r.Prefix()+"*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		b.WriteString(k + "\n")
		switch typ := c.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range c.HGetAll(ctx, k).Val() {
				b.WriteString(f + "=" + v + "\n")
			}
		case "string":
			b.WriteString(c.Get(ctx, k).Val() + "\n")
		case "zset":
			for _, m := range c.ZRange(ctx, k, 0, -1).Val() {
				b.WriteString(m + "\n")
			}
		default:
			t.Fatalf("key %s of type %s", k, typ)
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
