package proxy

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onejob/onejob/contract"
	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/ledger"
)

// answerSchema is a model's structured output: exactly answer and
// confidence.
const answerSchema = `{"type":"object","properties":{"answer":{"type":"string"},"confidence":{"type":"number"}},
"required":["answer","confidence"],"additionalProperties":false}`

func modelContract(t *testing.T, at string) *contract.Contract {
	t.Helper()
	path := filepath.Join(t.TempDir(), "answer.schema.json")
	if err := os.WriteFile(path, []byte(answerSchema), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := contract.Compile(contract.Spec{JSONSchema: path, JSONSchemaAt: at})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// streaming answers with the events of a streamed chat completion whose
// content deltas are parts, flushing after each, as a model server does.
func streaming(parts ...string) (upstreamFunc, string) {
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(`data: {"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":` + p + `}}]}` + "\n\n")
	}
	b.WriteString("data: [DONE]\n\n")
	stream := b.String()
	return func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/event-stream")
		for _, ev := range strings.SplitAfter(stream, "\n\n") {
			if _, err := w.Write([]byte(ev)); err != nil {
				return err
			}
			w.(http.Flusher).Flush()
		}
		return nil
	}, stream
}

// TestStreamedCompletionCheckedAt: a streamed completion is assembled from
// its deltas and checked at the pointer; the one that invents a key fails
// over, the other reaches the client, and every replay, as the provider's
// own event stream, byte for byte.
func TestStreamedCompletionCheckedAt(t *testing.T) {
	fo, _ := fallback.ParseFailoverOn([]string{"contract", "503"})
	invents, _ := streaming(`"{\"answer\": \"Paris\", "`, `"\"confidence\": 0.9, \"source\": \"made up\"}"`)
	keeps, stream := streaming(`"{\"answer\": "`, `"\"Paris\", \"confidence\": 0.9}"`)
	h, p, f := newProviders(t, Config{Contract: modelContract(t, "/choices/0/message/content"), FailoverOn: fo, AttemptTimeout: patience},
		invents, keeps)
	rec := h.do(post("k", `{"stream":true}`))
	if rec.Code != http.StatusOK || rec.Body.String() != stream || rec.Header().Get("Content-Type") != "text/event-stream" {
		t.Fatalf("answer %d %q %q, want the fallback's stream", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	id := jobID(t, rec)
	h.waitRun()
	j := h.job(id)
	wantJob(t, j, ledger.JobCompleted, "primary/failed fallback/succeeded")
	if !strings.Contains(j.Attempts[0].Error, "in /choices/0/message/content, at (root): additional properties 'source' not allowed") {
		t.Errorf("breach recorded: %q", j.Attempts[0].Error)
	}
	replay := h.do(post("k", `{"stream":true}`))
	if replay.Body.String() != stream || replay.Header().Get(HeaderReplayed) != "true" || replay.Header().Get("Content-Type") != "text/event-stream" {
		t.Errorf("replay %d %q %q", replay.Code, replay.Header(), replay.Body)
	}
	if p.calls() != 1 || f.calls() != 1 {
		t.Errorf("calls %d %d", p.calls(), f.calls())
	}
}

// TestCompletionContentNotJSON: a model that answers prose where the
// schema wants JSON breaks the contract; without contract in failover_on
// the job is unknown and the client gets 502 naming the rule.
func TestCompletionContentNotJSON(t *testing.T) {
	prose := func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "application/json")
		_, err := w.Write([]byte(`{"choices":[{"index":0,"message":{"role":"assistant","content":"The capital is Paris."}}]}`))
		return err
	}
	h, _, f := newProviders(t, Config{Contract: modelContract(t, "/choices/0/message/content"), AttemptTimeout: patience},
		prose, respond(http.StatusOK, "x"))
	rec := h.do(post("k", `{}`))
	prob := wantProblem(t, rec, http.StatusBadGateway, ProblemContract)
	if !strings.Contains(prob.Detail, "json_schema: /choices/0/message/content is a string that is not JSON") {
		t.Errorf("detail %q", prob.Detail)
	}
	h.waitRun()
	wantJob(t, h.job(prob.JobID), ledger.JobUnknown, "primary/unknown")
	if f.calls() != 0 {
		t.Errorf("fallback called %d times", f.calls())
	}
}
