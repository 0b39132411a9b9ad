package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger/memory"
)

// TestRetryFingerprintedAsItsJob: a job's retries are fingerprinted as the
// job was, after the configuration changed or the gateway was upgraded.
func TestRetryFingerprintedAsItsJob(t *testing.T) {
	l := memory.New()
	first := newHarness(t, Config{Ledger: l, FingerprintExclude: []string{"/ts"}}, nil)
	if rec := first.do(post("k", `{"amount":1,"ts":1}`)); rec.Code != http.StatusCreated {
		t.Fatalf("first: %d %s", rec.Code, rec.Body)
	}
	// The operator now fingerprints on /amount alone: the job keeps its
	// own selection, so a retry with another ts replays...
	later := newHarness(t, Config{Ledger: l, FingerprintInclude: []string{"/amount", "/currency"}}, nil)
	if rec := later.do(post("k", `{"amount":1,"ts":7}`)); rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("retry with another ts after the configuration changed: %d %s", rec.Code, rec.Body)
	}
	// ... and one with another amount is still another request.
	wantProblem(t, later.do(post("k", `{"amount":2,"ts":1}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
	// The job's selection decides, not the new one: under it a member the
	// new one ignores still counts.
	wantProblem(t, later.do(post("k", `{"amount":1,"ts":1,"note":"x"}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
	// New keys take the new selection.
	later.do(post("k2", `{"amount":1,"ts":1}`))
	if rec := later.do(post("k2", `{"amount":1,"ts":2,"note":"x"}`)); rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("new job under the new selection: %d %s", rec.Code, rec.Body)
	}
	if got := later.up.calls(); got != 1 {
		t.Errorf("upstream called %d times by the later gateway, want 1", got)
	}

	// A job of an earlier release (version 1, no scheme recorded), retried
	// through a gateway that selects members: fingerprinted by the whole
	// body, as the earlier release did.
	earlier := newHarness(t, Config{Ledger: l}, nil)
	earlier.m.fp, _ = fingerprint.New(fingerprint.BodyJSON, nil, nil).ForJob(fingerprint.VersionWhole, "") // as an earlier release: no scheme
	earlier.do(post("k3", `{"amount":1,"ts":1}`))
	if j, err := l.Find(t.Context(), earlier.m.hasher.Owner(testOwner), earlier.m.hasher.Key("k3")); err != nil ||
		j.FingerprintVersion != 1 || j.FingerprintScheme != "" {
		t.Fatalf("the earlier release's job: %+v, %v", j, err)
	}
	if rec := later.do(post("k3", `{ "ts": 1, "amount": 1 }`)); rec.Header().Get(HeaderReplayed) != "true" {
		t.Errorf("retry of an earlier release's job: %d %s", rec.Code, rec.Body)
	}
	wantProblem(t, later.do(post("k3", `{"amount":1,"ts":2}`)), http.StatusUnprocessableEntity, ProblemKeyReused)
}

func TestSelectionConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"both", Config{FingerprintInclude: []string{"/a"}, FingerprintExclude: []string{"/b"}}, "include or exclude, not both"},
		{"raw", Config{Fingerprint: fingerprint.BodyRaw, FingerprintExclude: []string{"/b"}}, "fingerprint raw cannot select members"},
		{"graphql", Config{Fingerprint: fingerprint.BodyGraphQL, FingerprintInclude: []string{"/a"}}, "fingerprint graphql cannot select members"},
		{"pointer", Config{FingerprintExclude: []string{"/ok", "ts"}}, `JSON pointer "ts" must start with /`},
		{"dash", Config{FingerprintInclude: []string{"/items/-"}}, `"-" names no element`},
	} {
		tc.cfg.Ledger = memory.New()
		tc.cfg.Providers = []Provider{{Name: "default"}}
		if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New: %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
}
