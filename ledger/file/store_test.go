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
// each job's key names it (or a newer job of the same key), it is listed
// by its expiry when it has one and as not at rest when it is not, no
// index entry names a job that is not there, and the count of jobs is
// the number of records. It returns that number.
func checkStore(t *testing.T, l *Ledger, check func(t *testing.T, rec []byte)) int {
	t.Helper()
	it, err := l.db.NewIter(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	jobs := map[string]*ledger.Job{}
	named := map[string]string{} // identity key → id
	expiry := map[string]bool{}  // expiry keys
	open := map[string]bool{}
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		switch k[0] {
		case prefixJob:
			check(t, v)
			j, err := record.Decode(bytes.Clone(v))
			if err != nil {
				continue // check said so
			}
			if j.ID != string(k[1:]) {
				t.Errorf("the record under %q is job %s", k, j.ID)
			}
			jobs[j.ID] = j
		case prefixKey:
			named[string(k)] = string(v)
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
		if got := named[string(identityKey(j.OwnerHash, j.KeyHash))]; got != id && (got == "" || got < id) {
			t.Errorf("job %s: its key names %q", id, got)
		}
		if !j.ExpiresAt.IsZero() && !expiry[string(expiryKey(j.ExpiresAt, id))] {
			t.Errorf("job %s: not listed by its expiry %v", id, j.ExpiresAt)
		}
		delete(expiry, string(expiryKey(j.ExpiresAt, id)))
		if open[id] == fsm.AtRest(j) {
			t.Errorf("job %s: listed as not at rest: %v, at rest: %v", id, open[id], fsm.AtRest(j))
		}
		delete(open, id)
	}
	for k, id := range named {
		if jobs[id] == nil {
			t.Errorf("key %q names job %s, which is not there", k, id)
		}
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
