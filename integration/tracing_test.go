//go:build integration

package integration

import (
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a throwaway OTLP/HTTP receiver of traces: it keeps
// every span the gateway exports.
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []span
}

// span is an exported span, its ids in hex and its attributes as text.
type span struct {
	trace, id, parent string
	name              string
	attrs             map[string]string
	failed            bool
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		b, err := io.ReadAll(body)
		var req coltracepb.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(b, &req)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.keep(&req)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.Write(out)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *otlpReceiver) keep(req *coltracepb.ExportTraceServiceRequest) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				sp := span{trace: hex.EncodeToString(s.TraceId), id: hex.EncodeToString(s.SpanId),
					parent: hex.EncodeToString(s.ParentSpanId), name: s.Name, attrs: map[string]string{},
					failed: s.Status.GetCode() == tracepb.Status_STATUS_CODE_ERROR}
				for _, kv := range s.Attributes {
					sp.attrs[kv.Key] = text(kv.Value)
				}
				rc.spans = append(rc.spans, sp)
			}
		}
	}
}

// text is an attribute's value as text.
func text(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	case *commonpb.AnyValue_BoolValue:
		return fmt.Sprint(x.BoolValue)
	case *commonpb.AnyValue_DoubleValue:
		return fmt.Sprint(x.DoubleValue)
	}
	return v.String()
}

// all returns the spans received so far.
func (rc *otlpReceiver) all() []span {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.spans)
}

// named returns the spans of trace named name, in the order they came.
func named(spans []span, trace, name string) []span {
	var out []span
	for _, s := range spans {
		if s.trace == trace && s.name == name {
			out = append(out, s)
		}
	}
	return out
}

// tracing is the Caddyfile's tracing directive, the request's span named
// gateway; the gateway exports to rc (tracedGateway).
const tracing = "\ttracing {\n\t\tspan gateway\n\t}\n"

// tracedGateway starts a gateway that exports its traces to rc, at once.
func tracedGateway(t *testing.T, b backend, site string, rc *otlpReceiver) *gateway {
	g := configureGateway(t, b, "", tracing+site)
	g.env = []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + rc.URL, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_TRACES_SAMPLER=always_on"}
	g.start()
	t.Cleanup(g.stop)
	return g
}

// TestTraceOfFailover: a failover's trace holds, under the request's
// span, the reservation, attempt 1 (primary, failed 503), attempt 2
// (fallback, succeeded) and the completion; the fallback saw attempt 2's
// trace context; a replay's trace says where its answer came from; and no
// span or log line holds the key or the owner in clear.
func TestTraceOfFailover(t *testing.T) {
	b := pgBackend(t)
	rc := newOTLPReceiver(t)
	primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		http.Error(w, "overloaded", http.StatusServiceUnavailable)
	})
	fallback := newUpstream(t, answering(`{"from":"fallback"}`))
	g := tracedGateway(t, b, providers(primary.addr(), fallback.addr(), "attempt_timeout 5s"), rc)
	const key = "trace-key-4b1d"
	r := g.post(t, "/charges", key, auth, `{}`)
	if r.status != http.StatusOK || r.body != `{"from":"fallback"}` {
		t.Fatalf("failover: %v", r)
	}
	jobID := r.header.Get("Idempotency-Job-Id")
	fc := fallback.callsFor(key)
	if len(fc) != 1 {
		t.Fatalf("the fallback got %d calls, want 1", len(fc))
	}
	// traceparent: 00-<trace id>-<parent span id>-<flags>
	tp := strings.Split(fc[0].traceparent, "-")
	if len(tp) != 4 || len(tp[1]) != 32 || len(tp[2]) != 16 {
		t.Fatalf("the fallback got traceparent %q", fc[0].traceparent)
	}
	trace := tp[1]
	var spans []span
	eventually(t, "the failover's spans exported", func() bool {
		spans = rc.all()
		return len(named(spans, trace, "gateway")) == 1 && len(named(spans, trace, "onejob.attempt")) == 2 &&
			len(named(spans, trace, "onejob.complete")) == 1
	})
	root := named(spans, trace, "gateway")[0]
	under := func(name string) []span {
		out := named(spans, trace, name)
		for _, s := range out {
			if s.parent != root.id {
				t.Errorf("%s span's parent is %s, want the request's span %s", name, s.parent, root.id)
			}
		}
		return out
	}
	res := under("onejob.reserve")
	if len(res) != 1 || res[0].attrs["onejob.reservation.outcome"] != "created" || res[0].attrs["onejob.job.id"] != jobID ||
		len(res[0].attrs["onejob.owner.hash"]) == 0 || len(res[0].attrs["onejob.key.hash"]) == 0 {
		t.Errorf("reservation spans %+v, want one that created job %s, with the owner's and the key's hashes", res, jobID)
	}
	atts := under("onejob.attempt")
	want := []map[string]string{
		{"onejob.attempt.number": "1", "onejob.provider": "primary", "onejob.attempt.cause": "first",
			"onejob.attempt.verdict": "failed", "http.response.status_code": "503", "onejob.job.id": jobID},
		{"onejob.attempt.number": "2", "onejob.provider": "fallback", "onejob.attempt.cause": "failover",
			"onejob.attempt.verdict": "result", "http.response.status_code": "200", "onejob.job.id": jobID},
	}
	slices.SortFunc(atts, func(a, b span) int {
		return strings.Compare(a.attrs["onejob.attempt.number"], b.attrs["onejob.attempt.number"])
	})
	for i, a := range atts {
		for k, v := range want[i] {
			if a.attrs[k] != v {
				t.Errorf("attempt span %d: %s = %q, want %q (%v)", i+1, k, a.attrs[k], v, a.attrs)
			}
		}
	}
	if atts[1].id != tp[2] {
		t.Errorf("the fallback's traceparent names span %s, want attempt 2's %s", tp[2], atts[1].id)
	}
	if !atts[0].failed || atts[1].failed {
		t.Errorf("attempt spans failed: %v, %v; want the first only", atts[0].failed, atts[1].failed)
	}
	if c := under("onejob.complete"); c[0].attrs["onejob.complete.won"] != "true" {
		t.Errorf("completion span %v, want won", c[0].attrs)
	}
	// The failover's log line joins the trace.
	failover := ""
	for line := range strings.Lines(g.out.String()) {
		if strings.Contains(line, `"msg":"failover"`) {
			failover = line
		}
	}
	if !strings.Contains(failover, `"job_id":"`+jobID+`"`) || !strings.Contains(failover, `"trace_id":"`+trace+`"`) {
		t.Errorf("the failover's log line %q, want job id %s and trace id %s", failover, jobID, trace)
	}

	// A replay: its trace says which tier answered.
	again := g.post(t, "/charges", key, auth, `{}`)
	if again.body != r.body || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %v", again)
	}
	var replay span
	eventually(t, "the replay's span exported", func() bool {
		for _, s := range rc.all() {
			if s.name == "onejob.replay" && s.attrs["onejob.job.id"] == jobID {
				replay = s
				return true
			}
		}
		return false
	})
	if tier := replay.attrs["onejob.replay.tier"]; tier != "ledger" && tier != "process" {
		t.Errorf("the replay's tier is %q, want ledger or process", tier)
	}
	if replay.trace == trace {
		t.Errorf("the replay is in the first request's trace")
	}

	// The key and the owner in clear: in no span, in no log line.
	for _, s := range rc.all() {
		for k, v := range s.attrs {
			if strings.Contains(v, key) || strings.Contains(v, "alice") {
				t.Errorf("span %s attribute %s = %q holds the key or the owner", s.name, k, v)
			}
		}
	}
	if out := g.out.String(); strings.Contains(out, key) || strings.Contains(out, "alice") {
		t.Errorf("the gateway's log holds the key or the owner:\n%s", out)
	}
}
