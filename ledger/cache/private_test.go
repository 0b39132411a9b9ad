package cache

import (
	"bytes"
	"testing"

	"github.com/alicebob/miniredis/v2"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/memory"
)

// cacheHarness is a cache on one miniredis in front of one memory truth
// per test; a peer is another cache on the same Redis and truth.
func cacheHarness(m *miniredis.Miniredis) ledgertest.Harness {
	truths := map[*Ledger]ledger.Ledger{}
	return ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger {
			truth := memory.New()
			l := open(t, truth, m.Addr(), Options{Prefix: "t:" + ledger.NewID() + ":"})
			truths[l] = truth
			return l
		},
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			c := l.(*Ledger)
			return open(t, truths[c], m.Addr(), Options{Prefix: c.prefix})
		},
	}
}

// A purge through the cache removes the owner's replies from Redis and
// from the process: the purged keys are new intents (RunPurge replays a
// completed job first, so its reply is cached).
func TestPurgeForgetsReplies(t *testing.T) {
	m := miniredis.RunT(t)
	ledgertest.RunPurge(t, cacheHarness(m))

	l := cacheHarness(m).New(t)
	p := params()
	r := mustReserve(t, l, p, ledger.Created)
	mustComplete(t, l, r, "private")
	mustReserve(t, l, p, ledger.Done)
	if !m.Exists(l.(*Ledger).replyKey(p.OwnerHash, p.KeyHash)) {
		t.Fatal("the reply was not cached")
	}
	if _, err := l.(ledger.Purger).Purge(testCtx(t), p.OwnerHash); err != nil {
		t.Fatal(err)
	}
	if m.Exists(l.(*Ledger).replyKey(p.OwnerHash, p.KeyHash)) {
		t.Error("the purged owner's reply is still in Redis")
	}
}

// With the answers sealed in front of the cache, the replies in Redis
// hold no answer in clear, and replays from them are byte for byte.
func TestSealedCache(t *testing.T) {
	m := miniredis.RunT(t)
	ledgertest.RunSealed(t, cacheHarness(m), func(t *testing.T, l ledger.Ledger) []byte {
		written(l)
		var b bytes.Buffer
		for _, k := range m.Keys() {
			if v, err := m.Get(k); err == nil {
				b.WriteString(k + "=" + v + "\n")
			}
		}
		return b.Bytes()
	})
}
