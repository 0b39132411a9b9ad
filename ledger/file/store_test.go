package file

import (
	"bytes"
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/internal/fsm"
	"github.com/onejob/onejob/ledger/internal/record"
)

// checkStore reads every key of l's database as an operator's tool would,
// runs check on each job record, and checks the indexes against the jobs:
// each record is under its job's own key, its id names that key, it is
// listed by its expiry when it has one and as not at rest when it is
// not, no index entry names a job that is not there, and the count of
// jobs is the number of records. It returns that number.
func checkStore(t *testing.T, l *Ledger, check func(t *testing.T, rec []byte)) int {
	t.Helper()
	it, err := l.db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	jobs := map[string]*ledger.Job{}
	ids := map[string]string{}  // id → identity key
	expiry := map[string]bool{} // expiry keys
	open := map[string]bool{}
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		switch k[0] {
		case prefixKey:
			check(t, v)
			j, err := record.Decode(bytes.Clone(v))
			if err != nil {
				continue // check said so
			}
			if want := identityKey(j.OwnerHash, j.KeyHash); !bytes.Equal(k, want) {
				t.Errorf("job %s is under the key %q, not its own %q", j.ID, k, want)
			}
			jobs[j.ID] = j
		case prefixJob:
			ids[string(k[1:])] = string(v)
		case prefixExpiry:
			expiry[string(k)] = true
		case prefixOpen:
			open[string(k[1:])] = true
		case totalKey[0], formatKey[0]:
		default:
			t.Errorf("a key of no kind: %q", k)
		}
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	for id, j := range jobs {
		if got := ids[id]; got != string(identityKey(j.OwnerHash, j.KeyHash)) {
			t.Errorf("job %s: its id names the key %q", id, got)
		}
		delete(ids, id)
		if !j.ExpiresAt.IsZero() && !expiry[string(expiryKey(j.ExpiresAt, id))] {
			t.Errorf("job %s: not listed by its expiry %v", id, j.ExpiresAt)
		}
		delete(expiry, string(expiryKey(j.ExpiresAt, id)))
		if open[id] == fsm.AtRest(j) {
			t.Errorf("job %s: listed as not at rest: %v, at rest: %v", id, open[id], fsm.AtRest(j))
		}
		delete(open, id)
	}
	for id, k := range ids {
		t.Errorf("the id %s names the key %q, which holds no such job", id, k)
	}
	for k := range expiry {
		t.Errorf("an expiry entry of no job: %q", k)
	}
	for id := range open {
		t.Errorf("job %s is listed as not at rest, and is not there", id)
	}
	if n, err := l.total(); err != nil || n != int64(len(jobs)) {
		t.Errorf("the count of jobs says %d (%v), the records %d", n, err, len(jobs))
	}
	return len(jobs)
}
