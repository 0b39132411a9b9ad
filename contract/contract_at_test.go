package contract

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func answerContract(t testing.TB, at string) *Contract {
	t.Helper()
	return mustCompile(t, Spec{JSONSchema: "testdata/answer.schema.json", JSONSchemaAt: at})
}

// openAIAnswer is a non-streamed chat completion whose content is text.
func openAIAnswer(content string) string {
	c, _ := json.Marshal(content)
	return `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":` + string(c) + `},"finish_reason":"stop"}]}`
}

func anthropicAnswer(text string) string {
	c, _ := json.Marshal(text)
	return `{"id":"m1","type":"message","role":"assistant","content":[{"type":"text","text":` + string(c) + `}],"stop_reason":"end_turn"}`
}

func TestContractJSONSchemaAt(t *testing.T) {
	jsonH := http.Header{"Content-Type": {"application/json"}}
	sse := http.Header{"Content-Type": {"text/event-stream; charset=utf-8"}}
	openai, anthropic := "/choices/0/message/content", "/content/0/text"
	tests := []struct {
		name, at string
		h        http.Header
		body     string
		want     string // "" passes
	}{
		{"openai", openai, jsonH, openAIAnswer(`{"answer":"42","confidence":0.9}`), ""},
		{"openai invents a key", openai, jsonH, openAIAnswer(`{"answer":"42","confidence":0.9,"source":"made up"}`),
			"contract: json_schema: in /choices/0/message/content, at (root): additional properties 'source' not allowed"},
		{"openai misses a key", openai, jsonH, openAIAnswer(`{"answer":"42"}`),
			"in /choices/0/message/content, at (root): missing property 'confidence'"},
		{"openai content is prose", openai, jsonH, openAIAnswer(`The answer is 42.`),
			"contract: json_schema: /choices/0/message/content is a string that is not JSON: invalid character 'T'"},
		{"openai content is JSON and more", openai, jsonH, openAIAnswer(`{"answer":"42","confidence":0.9} {}`),
			"is a string that is not JSON: data after the top-level value"},
		{"openai content is null", openai, jsonH, `{"choices":[{"message":{"content":null}}]}`,
			"in /choices/0/message/content, at (root): expected object, got null"},
		{"no such member", openai, jsonH, `{"choices":[]}`, "contract: json_schema: no member at /choices/0/message/content"},
		{"body not JSON", openai, jsonH, `{"choices":`, "body is not JSON"},
		{"member is an object", "/result", jsonH, `{"result":{"answer":"x","confidence":1}}`, ""},
		{"member object breaks", "/result", jsonH, `{"result":{"answer":1,"confidence":1}}`, "in /result, at /answer: expected string, got number"},
		{"anthropic", anthropic, jsonH, anthropicAnswer(`{"answer":"42","confidence":0.5}`), ""},
		{"anthropic invents a key", anthropic, jsonH, anthropicAnswer(`{"answer":"42","confidence":0.5,"extra":true}`),
			"in /content/0/text, at (root): additional properties 'extra' not allowed"},
		{"openai stream", openai, sse, openAIStream, ""},
		{"anthropic stream", anthropic, sse, anthropicStream, ""},
		{"openai stream invents a key", openai, sse,
			"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"{\\\"answer\\\":\\\"1\\\",\"}}]}\n\n" +
				"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"confidence\\\":1,\\\"x\\\":2}\"}}]}\n\ndata: [DONE]\n\n",
			"in /choices/0/message/content, at (root): additional properties 'x' not allowed"},
		{"stream second choice", "/choices/1/message/content", sse, openAIStream, "at (root): missing properties 'answer', 'confidence'"},
		{"stream with an error", openai, sse, "data: {\"error\":{\"message\":\"overloaded\"}}\n\n", "contract: json_schema: stream: event 1 reports an error"},
		{"stream of another kind", openai, sse, "data: {\"hello\":1}\n\n", "stream: the stream holds no completion chunk"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := checkErr(t, answerContract(t, tt.at), 200, tt.h, tt.body, "")
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
	// Without at, a stream is not JSON: the body is what the schema checks.
	whole := mustCompile(t, Spec{JSONSchema: "testdata/answer.schema.json"})
	if got := checkErr(t, whole, 200, sse, openAIStream, ""); !strings.Contains(got, "body is not JSON") {
		t.Errorf("stream without at: %q", got)
	}
}

func TestCompileJSONSchemaAt(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		want string
	}{
		{Spec{JSONSchemaAt: "/a"}, "a pointer needs a schema file"},
		{Spec{JSONSchema: "testdata/answer.schema.json", JSONSchemaAt: "a"}, `contract: json_schema at: JSON pointer "a" must start with /`},
		{Spec{JSONSchema: "testdata/answer.schema.json", JSONSchemaAt: "/a~2"}, `"~" must be followed by 0 or 1`},
	} {
		if _, err := Compile(tc.spec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.spec, err, tc.want)
		}
	}
}

// FuzzJSONSchemaAt: the JSON-in-a-string path never panics and is
// deterministic, whatever the model wrote; a body that is the content
// itself breaks the contract exactly when the content in an envelope
// does (the envelope changes nothing but where the member is).
func FuzzJSONSchemaAt(f *testing.F) {
	for _, s := range []string{`{"answer":"42","confidence":0.9}`, `{"answer":"42","confidence":0.9,"x":1}`,
		`The answer is 42.`, `"{\"answer\":\"1\"}"`, `{"answer":"\ud800","confidence":1e400}`, ``, `[`, `{"answer":"a"}{}`} {
		f.Add(s)
	}
	at := answerContract(f, "/choices/0/message/content")
	whole := mustCompile(f, Spec{JSONSchema: "testdata/answer.schema.json"})
	h := http.Header{"Content-Type": {"application/json"}}
	f.Fuzz(func(t *testing.T, content string) {
		enveloped := openAIAnswer(content)
		got := checkErr(t, at, 200, h, enveloped, "")
		if again := checkErr(t, at, 200, h, enveloped, ""); again != got {
			t.Fatalf("not deterministic: %q / %q", got, again)
		}
		direct := checkErr(t, whole, 200, h, content, "")
		if (got == "") != (direct == "") {
			t.Fatalf("content %q: in the envelope %q, alone %q", content, got, direct)
		}
	})
}
