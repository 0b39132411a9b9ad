package proxy

import (
	"os"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
)

// TestSpansDocumented: every span and attribute the gateway records is in
// the operations doc's table of traces, where an operator looks it up.
func TestSpansDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, traces, _ := strings.Cut(string(doc), "\n## Traces\n")
	traces, _, _ = strings.Cut(traces, "\n## ")
	for _, name := range []string{spanReserve, spanAttempt, spanComplete, spanWait, spanJoin, spanReplay,
		causeFirst, causeFailover, causeHedge, causeResend} {
		if !strings.Contains(traces, name) {
			t.Errorf("docs/operations.md, Traces: %q is missing", name)
		}
	}
	for _, k := range []attribute.Key{attrJobID, attrJobState, attrOwnerHash, attrKeyHash, attrOutcome, attrAttemptID,
		attrAttempt, attrCause, attrProvider, attrVerdict, attrReason, attrWon, attrTier, attrStatus} {
		if !strings.Contains(traces, "`"+string(k)+"`") {
			t.Errorf("docs/operations.md, Traces: attribute %q is missing", k)
		}
	}
}
