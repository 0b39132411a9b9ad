//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

func gqlBody(query string) string {
	b, _ := json.Marshal(map[string]any{"query": query, "variables": map[string]any{"amount": 42}})
	return string(b)
}

// TestGraphQLMutationsOneJob: two mutations that differ only in white
// space and comments are one job; a query passes through untouched.
func TestGraphQLMutationsOneJob(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"data":{"createCharge":{"id":"ch_%d","amount":42,"status":"SUCCEEDED"}}}`, n)
		})
		g := startGateway(t, b, fmt.Sprintf(`	idempotency {
		{ledger}
		fingerprint graphql
		contract {
			graphql_schema %s
		}
	}
	reverse_proxy %s
`, testdata(t, "schema.graphql"), up.addr()))
		first := g.post(t, "/graphql", "gql-1", auth, gqlBody("mutation Pay($amount: Int!) { createCharge(amount: $amount) { id amount status } }"))
		second := g.post(t, "/graphql", "gql-1", auth, gqlBody(`# pay once
mutation Pay($amount: Int!) {
	createCharge(amount: $amount) {
		id,   amount
		status # settled
	}
}`))
		if first.status != http.StatusOK || second.body != first.body || second.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("reformatted mutation: %v / %v", first, second)
		}
		reordered := g.post(t, "/graphql", "gql-1", auth, gqlBody("mutation Pay($amount: Int!) { createCharge(amount: $amount) { amount id status } }"))
		if reordered.status != http.StatusUnprocessableEntity {
			t.Errorf("field order is part of the fingerprint: %v", reordered)
		}
		if c := up.count("gql-1"); c != 1 {
			t.Errorf("upstream called %d times", c)
		}
		for range 2 {
			q := g.post(t, "/graphql", "gql-q", auth, gqlBody("query { charge(id: \"ch_1\") { id } }"))
			if q.header.Get("Idempotency-Job-Id") != "" {
				t.Errorf("a query was ledgered: %v", q)
			}
		}
		if c := up.count("gql-q"); c != 2 {
			t.Errorf("queries reached the upstream %d times, want 2", c)
		}
	})
}

// TestGraphQLContract: an answer whose data does not match the mutation's
// selection set breaks the contract and fails over.
func TestGraphQLContract(t *testing.T) {
	b := pgBackend(t)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"data":{"createCharge":{"id":"ch_1","amount":"forty-two","status":"SUCCEEDED"}}}`)
	})
	fallback := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"data":{"createCharge":{"id":"ch_2","amount":42,"status":"SUCCEEDED"}}}`)
	})
	g := startGateway(t, b, providers(primary.addr(), fallback.addr(), "attempt_timeout 5s", "fingerprint graphql",
		"failover_on contract connect_error 503",
		fmt.Sprintf("contract {\n\t\t\tgraphql_schema %s\n\t\t}", testdata(t, "schema.graphql"))))
	r := g.post(t, "/graphql", "gql-c", auth, gqlBody("mutation($amount: Int!) { createCharge(amount: $amount) { id amount status } }"))
	if r.status != http.StatusOK || !strings.Contains(r.body, `"ch_2"`) {
		t.Fatalf("answer: %v", r)
	}
	j := g.job(t, r.header.Get("Idempotency-Job-Id"))
	if len(j.Attempts) != 2 || j.Attempts[0].State != "failed" || j.Attempts[0].Error == nil ||
		!strings.Contains(*j.Attempts[0].Error, "graphql_schema") {
		t.Errorf("attempts: %+v", j.Attempts)
	}
}
