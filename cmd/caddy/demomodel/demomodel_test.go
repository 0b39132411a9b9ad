package demomodel

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var m Model
	if err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser("demo_model small {\n\tinvent_key source\n\toverloaded busy\n}")); err != nil {
		t.Fatal(err)
	}
	if m.Name != "small" || m.InventKey != "source" || m.Overloaded != "busy" {
		t.Errorf("parsed %+v", m)
	}
	for _, tc := range []struct{ in, want string }{
		{"demo_model", "wrong argument count"},
		{"demo_model a b", "wrong argument count"},
		{"demo_model a {\n\tinvent_key\n}", "wrong argument count"},
		{"demo_model a {\n\tinvent_key x\n\tinvent_key y\n}", `demo_model: duplicate "invent_key", at Testfile:3`},
		{"demo_model a {\n\ttemperature 1\n}", `demo_model: unknown option "temperature" (want invent_key or overloaded), at Testfile:2`},
	} {
		var m Model
		if err := m.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
}

func chat(t *testing.T, m *Model, body string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	if err := m.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)), nil); err != nil {
		t.Fatal(err)
	}
	return rec
}

func TestModelAnswers(t *testing.T) {
	m := &Model{Name: "small", InventKey: "source", Overloaded: "busy", made: new(atomic.Int64)}
	rec := chat(t, m, `{"messages":[{"role":"system","content":"x"},{"role":"user","content":[{"type":"text","text":"The capital of France?"}]}]}`)
	var c struct {
		ID      string
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &c); err != nil || rec.Code != http.StatusOK || len(c.Choices) != 1 {
		t.Fatalf("%d %s %v", rec.Code, rec.Body, err)
	}
	if c.ID != "chatcmpl-small-1" || c.Choices[0].Message.Content != `{"answer":"Paris","confidence":0.98,"source":"added by small"}` {
		t.Errorf("completion %+v", c)
	}
	if rec := chat(t, m, `{"messages":[{"role":"user","content":"are you busy?"}]}`); rec.Code != http.StatusServiceUnavailable {
		t.Errorf("overloaded: %d %s", rec.Code, rec.Body)
	}
	if rec := chat(t, m, `{"messages":`); rec.Code != http.StatusBadRequest {
		t.Errorf("bad body: %d %s", rec.Code, rec.Body)
	}
}

// TestModelStreams: a streamed completion's deltas join into the content
// the model answers unstreamed, split only between characters.
func TestModelStreams(t *testing.T) {
	m := &Model{Name: "large", made: new(atomic.Int64)}
	prompt := `{"messages":[{"role":"user","content":"Ünïcödé ✓ everywhere"}]`
	plain := chat(t, m, prompt+`}`)
	var c struct {
		Choices []struct{ Message struct{ Content string } }
	}
	if err := json.Unmarshal(plain.Body.Bytes(), &c); err != nil {
		t.Fatal(err)
	}
	rec := chat(t, m, prompt+`,"stream":true}`)
	if rec.Header().Get("Content-Type") != "text/event-stream" || !strings.HasSuffix(rec.Body.String(), "data: [DONE]\n\n") {
		t.Fatalf("stream %q %s", rec.Header(), rec.Body)
	}
	var joined strings.Builder
	for _, ev := range strings.Split(strings.TrimSuffix(rec.Body.String(), "data: [DONE]\n\n"), "\n\n") {
		if ev == "" {
			continue
		}
		var chunk struct {
			Choices []struct{ Delta struct{ Content string } }
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &chunk); err != nil || len(chunk.Choices) != 1 {
			t.Fatalf("event %q: %v", ev, err)
		}
		if strings.ContainsRune(chunk.Choices[0].Delta.Content, '\uFFFD') {
			t.Errorf("a delta splits a character: %q", chunk.Choices[0].Delta.Content)
		}
		joined.WriteString(chunk.Choices[0].Delta.Content)
	}
	if joined.String() != c.Choices[0].Message.Content {
		t.Errorf("deltas join into %q, want %q", joined.String(), c.Choices[0].Message.Content)
	}
}
