package memory

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

var harness = ledgertest.Harness{
	New: func(t *testing.T) ledger.Ledger {
		l := New()
		t.Cleanup(func() { l.Close() })
		return l
	},
	Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
}

func TestMemoryPurge(t *testing.T) { ledgertest.RunPurge(t, harness) }

// The memory ledger's store is its jobs: the dump is every job's answer
// as it holds it, and the record of every settled job.
func TestMemorySealed(t *testing.T) {
	ledgertest.RunSealed(t, harness, func(t *testing.T, l ledger.Ledger) []byte {
		m := l.(*Ledger)
		var b bytes.Buffer
		m.mu.Lock()
		defer m.mu.Unlock()
		for e := range m.byID.all(&m.slab) {
			b.Write(e.packed)
			if e.job == nil {
				continue
			}
			if r := e.job.Response; r != nil {
				h, _ := json.Marshal(r.Header)
				b.Write(h)
				b.Write(r.Body)
			}
		}
		return b.Bytes()
	})
}
