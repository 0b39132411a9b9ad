//go:build integration

package integration

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func testdata(t *testing.T, name string) string {
	t.Helper()
	p, err := filepath.Abs(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// contractSite is a gateway with a JSON Schema contract, a primary and a
// fallback.
func contractSite(t *testing.T, primary, fallback string, extra ...string) string {
	extra = append(extra, "attempt_timeout 5s", fmt.Sprintf("contract {\n\t\t\tstatus 2xx\n\t\t\tcontent_type application/json\n\t\t\tjson_schema %s\n\t\t}", testdata(t, "charge.schema.json")))
	return providers(primary, fallback, extra...)
}

const hallucinated = `{"id":"ch_1","status":"succeeded","refund_policy":"made up"}`

func TestContractBreachFailsOver(t *testing.T) {
	b := pgBackend(t)
	primary := newUpstream(t, answering(hallucinated))
	fallback := newUpstream(t, answering(`{"id":"ch_2","status":"succeeded"}`))
	g := startGateway(t, b, contractSite(t, primary.addr(), fallback.addr(), "failover_on contract connect_error 503"))
	r := g.post(t, "/charges", "ct-1", auth, `{}`)
	if r.status != http.StatusOK || r.body != `{"id":"ch_2","status":"succeeded"}` {
		t.Fatalf("answer: %v", r)
	}
	jobID := r.header.Get("Idempotency-Job-Id")
	if st, atts := jobState(t, b, jobID); st != "completed" || len(atts) != 2 || atts[0] != "failed" || atts[1] != "succeeded" {
		t.Errorf("ledger: job %s attempts %v", st, atts)
	}
	j := g.job(t, jobID)
	if j.Attempts[0].Error == nil || !strings.Contains(*j.Attempts[0].Error, "json_schema") {
		t.Errorf("the breach is not recorded on the attempt: %+v", j.Attempts[0])
	}
	if again := g.post(t, "/charges", "ct-1", auth, `{}`); again.body != r.body || primary.count("ct-1") != 1 {
		t.Errorf("retry: %v", again)
	}
}

func TestContractBreachWithoutFailoverIsUnknown(t *testing.T) {
	b := pgBackend(t)
	primary := newUpstream(t, answering(hallucinated))
	fallback := newUpstream(t, answering(`{"id":"ch_2","status":"succeeded"}`))
	g := startGateway(t, b, contractSite(t, primary.addr(), fallback.addr()))
	r := g.post(t, "/charges", "ct-2", auth, `{}`)
	if r.status != http.StatusBadGateway || !strings.Contains(r.body, "urn:onejob:problem:contract-violation") ||
		!strings.Contains(r.body, "json_schema") || strings.Contains(r.body, "made up") {
		t.Fatalf("breach: %v", r)
	}
	if st, atts := jobState(t, b, r.header.Get("Idempotency-Job-Id")); st != "unknown" || len(atts) != 1 || atts[0] != "unknown" {
		t.Errorf("ledger: job %s attempts %v", st, atts)
	}
	if retry := g.post(t, "/charges", "ct-2", auth, `{}`); retry.status != http.StatusConflict {
		t.Errorf("retry: %v", retry)
	}
	if fallback.count("ct-2") != 0 || primary.count("ct-2") != 1 {
		t.Errorf("calls: primary %d fallback %d", primary.count("ct-2"), fallback.count("ct-2"))
	}
}

// TestFailedProbeBlocksFailover: the fallback answers its probe with a
// broken contract, so it is never used for failover; the primary still
// serves.
func TestFailedProbeBlocksFailover(t *testing.T) {
	b := pgBackend(t)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/busy" {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"id":"x","status":"pending"}`)
			return
		}
		io.WriteString(w, `{"id":"ch_1","status":"succeeded"}`)
	})
	fallback := newUpstream(t, answering(hallucinated))
	g := startGateway(t, b, contractSite(t, primary.addr(), fallback.addr(),
		"probe POST /probe {\n\t\t\tevery 1h\n\t\t}"))
	var providers string
	eventually(t, "both probes ran", func() bool {
		_, providers = g.adminCall(t, http.MethodGet, "/idempotency/providers", "")
		return strings.Count(providers, `"ok"`) == 2
	})
	if !strings.Contains(providers, `"name":"primary","probe":{"ok":true`) || !strings.Contains(providers, `"name":"fallback","probe":{"ok":false`) {
		t.Fatalf("providers: %s", providers)
	}
	r := g.post(t, "/busy", "pr-1", auth, `{}`)
	if r.status != http.StatusServiceUnavailable {
		t.Errorf("no failover to a provider whose probe failed: %v", r)
	}
	if c := fallback.count("pr-1"); c != 0 {
		t.Errorf("fallback got %d attempts", c)
	}
	if ok := g.post(t, "/charges", "pr-2", auth, `{}`); ok.status != http.StatusOK {
		t.Errorf("the primary still serves: %v", ok)
	}
	_, metrics := g.adminCall(t, http.MethodGet, "/metrics", "")
	if !strings.Contains(metrics, `caddy_idempotency_probe_ok{provider="fallback",scope="srv0"} 0`) || !strings.Contains(metrics, `caddy_idempotency_probe_ok{provider="primary",scope="srv0"} 1`) {
		t.Errorf("probe metrics missing")
	}
	if !strings.Contains(g.out.String(), "probe failed") {
		t.Errorf("the failed probe is not logged")
	}
}
