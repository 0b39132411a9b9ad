package contract

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

type sseEvent struct{ event, data string }

func events(t testing.TB, stream string) []sseEvent {
	t.Helper()
	var out []sseEvent
	if err := eachEvent([]byte(stream), func(event string, data []byte) error {
		out = append(out, sseEvent{event, string(data)})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEachEvent(t *testing.T) {
	tests := []struct {
		name, stream string
		want         []sseEvent
	}{
		{"one", "data: a\n\n", []sseEvent{{"", "a"}}},
		{"typed", "event: content_block_delta\ndata: x\n\n", []sseEvent{{"content_block_delta", "x"}}},
		{"multi-line data", "data: a\ndata: b\n\n", []sseEvent{{"", "a\nb"}}},
		{"CRLF and CR", "data: a\r\n\r\ndata: b\r\rdata: c\n\n", []sseEvent{{"", "a"}, {"", "b"}, {"", "c"}}},
		{"comments and other fields", ": keep-alive\nid: 7\nretry: 10\ndata: a\n\n", []sseEvent{{"", "a"}}},
		{"no space after the colon", "data:a\ndata:  b\n\n", []sseEvent{{"", "a\n b"}}},
		{"field without a colon", "data\n\n", []sseEvent{{"", ""}}},
		{"no data, no event", "event: ping\n\ndata: a\n\n", []sseEvent{{"", "a"}}},
		{"unfinished last event", "data: a\n\ndata: b\n", []sseEvent{{"", "a"}}},
		{"unended last line", "data: a\n\ndata: b", []sseEvent{{"", "a"}}},
		{"byte order mark", "\xef\xbb\xbfdata: a\n\n", []sseEvent{{"", "a"}}},
		{"empty", "", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := events(t, tt.stream)
			if len(got) != len(tt.want) {
				t.Fatalf("events %q, want %q", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("event %d: %q, want %q", i, got[i], tt.want[i])
				}
			}
		})
	}
}

// openAIStream is a streamed chat completion as OpenAI's API sends one,
// content split into deltas, two choices interleaved.
const openAIStream = `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"{\"answer\":"},"finish_reason":null},{"index":1,"delta":{"role":"assistant","content":"{}"}}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":" \"42\", \"confidence\": 0.9}"},"finish_reason":null}]}

data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}

data: [DONE]

`

// anthropicStream is a streamed message as Anthropic's API sends one.
const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","content":[]}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}

event: ping
data: {"type": "ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"{\"answer\": \"42\","}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":" \"confidence\": 0.9}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"}}

event: message_stop
data: {"type":"message_stop"}

`

func TestAssembleStream(t *testing.T) {
	tests := []struct {
		name, stream, want string
	}{
		{"openai", openAIStream,
			`{"choices":[{"index":0,"message":{"content":"{\"answer\": \"42\", \"confidence\": 0.9}","role":"assistant"}},{"index":1,"message":{"content":"{}","role":"assistant"}}]}`},
		{"anthropic", anthropicStream,
			`{"content":[{"text":"{\"answer\": \"42\", \"confidence\": 0.9}","type":"text"}]}`},
		{"openai without content", "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n",
			`{"choices":[{"index":0,"message":{"content":null,"role":"assistant"}}]}`},
		{"openai without index", "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}},{\"delta\":{\"content\":\"b\"}}]}\n\n",
			`{"choices":[{"index":0,"message":{"content":"a"}},{"index":1,"message":{"content":"b"}}]}`},
		{"anthropic delta before its start", "data: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
			`{"content":[{},{"text":"x","type":"text"}]}`},
		{"anthropic tool input is not text", "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"tool_use\"}}\n\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{}\"}}\n\n",
			`{"content":[{"text":"","type":"tool_use"}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AssembleStream([]byte(tt.stream))
			if err != nil || string(got) != tt.want {
				t.Errorf("got %s, %v\nwant %s", got, err, tt.want)
			}
		})
	}
}

func TestAssembleStreamErrors(t *testing.T) {
	tests := []struct {
		name, stream, want string
	}{
		{"empty", "", "no completion chunk"},
		{"only done", "data: [DONE]\n\n", "no completion chunk"},
		{"not JSON", "data: hello\n\n", "event 1: data is not a completion chunk: invalid character"},
		{"not an object", "data: [1,2]\n\n", "event 1: data is not a completion chunk: not a JSON object"},
		{"wrong type", "data: {\"choices\":[{\"delta\":{\"content\":5}}]}\n\n", "event 1: data is not a completion chunk: unexpected number at choices.delta.content"},
		{"error event", "data: {\"choices\":[]}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\n\n", "event 2 reports an error"},
		{"openai error", "data: {\"error\":{\"message\":\"boom\"}}\n\n", "event 1 reports an error"},
		{"index too large", "data: {\"choices\":[{\"index\":1000000000,\"delta\":{\"content\":\"a\"}}]}\n\n", "choice index 1000000000 is out of range"},
		{"negative index", "data: {\"type\":\"content_block_delta\",\"index\":-1,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n", "content block index -1 is out of range"},
		{"block without index", "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n", "content_block_delta without an index"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AssembleStream([]byte(tt.stream))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %s, %v; want an error containing %q", got, err, tt.want)
			}
		})
	}
}

func TestIsEventStream(t *testing.T) {
	for ct, want := range map[string]bool{
		"text/event-stream": true, "Text/Event-Stream; charset=utf-8": true,
		"application/json": false, "text/event": false, "": false,
	} {
		if got := IsEventStream(http.Header{"Content-Type": {ct}}); got != want {
			t.Errorf("IsEventStream(%q) = %v", ct, got)
		}
	}
}

// FuzzAssembleStream: any stream assembles, or is refused with an error,
// never a panic; what it assembles is one JSON object of the documented
// layout, whose texts are the deltas' texts in order, and the same stream
// always assembles the same.
func FuzzAssembleStream(f *testing.F) {
	for _, s := range []string{openAIStream, anthropicStream, "data: [DONE]\n\n", "data: {}\n\n",
		"data: {\"choices\":[{\"index\":3,\"delta\":{\"content\":\"\\ud800\"}}]}\r\n\r\n",
		"event: content_block_delta\rdata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"é\"}}\r\r"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		doc, err := AssembleStream(stream)
		again, err2 := AssembleStream(stream)
		if !bytes.Equal(doc, again) || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %s %v / %s %v", doc, err, again, err2)
		}
		if err != nil {
			if !utf8.ValidString(err.Error()) && utf8.Valid(stream) {
				t.Errorf("error is not UTF-8: %q", err)
			}
			return
		}
		var v struct {
			Choices []struct {
				Index   int `json:"index"`
				Message struct {
					Content *string `json:"content"`
				} `json:"message"`
			} `json:"choices"`
			Content []map[string]string `json:"content"`
		}
		if err := json.Unmarshal(doc, &v); err != nil {
			t.Fatalf("assembled %s: %v", doc, err)
		}
		if len(v.Choices) == 0 && len(v.Content) == 0 {
			t.Fatalf("assembled nothing without an error: %s", doc)
		}
		if len(v.Choices) > maxStreamIndex+1 || len(v.Content) > maxStreamIndex+1 {
			t.Fatalf("%d choices, %d blocks", len(v.Choices), len(v.Content))
		}
		for i, c := range v.Choices {
			if c.Index != i {
				t.Fatalf("choice %d says index %d", i, c.Index)
			}
		}
	})
}
