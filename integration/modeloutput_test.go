//go:build integration

package integration

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// completion is a chat completion, OpenAI-style, whose message content is
// content; streamed (text/event-stream, content split into deltas) when
// the request asks for it, as model servers answer.
func completion(content string) func(w http.ResponseWriter, r *http.Request, n int) {
	return func(w http.ResponseWriter, r *http.Request, n int) {
		if !strings.Contains(r.URL.Path, "stream") {
			c, _ := json.Marshal(content)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"id":"c%d","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":%s},"finish_reason":"stop"}]}`, n, c)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		f := w.(http.Flusher)
		for _, part := range chunks(content) {
			fmt.Fprint(w, part)
			f.Flush()
		}
	}
}

// chunks is content as the events of a streamed completion, a few bytes
// per delta.
func chunks(content string) []string {
	var out []string
	for len(content) > 0 {
		k := min(7, len(content))
		c, _ := json.Marshal(content[:k])
		content = content[k:]
		out = append(out, fmt.Sprintf("data: {\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":%s}}]}\n\n", c))
	}
	return append(out, "data: [DONE]\n\n")
}

// anthropicStream is content as an Anthropic-style message stream.
func anthropicStream(content string) string {
	var b strings.Builder
	b.WriteString("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n")
	b.WriteString("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n")
	for len(content) > 0 {
		k := min(5, len(content))
		c, _ := json.Marshal(content[:k])
		content = content[k:]
		fmt.Fprintf(&b, "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":%s}}\n\n", c)
	}
	b.WriteString("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
	return b.String()
}

const (
	goodOutput     = `{"answer": "Paris", "confidence": 0.9}`
	inventedOutput = `{"answer": "Paris", "confidence": 0.9, "source": "made up"}`
)

func modelSite(t *testing.T, primary, fallback, at string, extra ...string) string {
	extra = append(extra, "attempt_timeout 5s", fmt.Sprintf("contract {\n\t\t\tjson_schema %s at %s\n\t\t}", testdata(t, "answer.schema.json"), at))
	return providers(primary, fallback, extra...)
}

// TestModelOutputContract: the schema applies to the structured output
// inside the answer, streamed or not: the model that invents a top-level
// key fails over to the one that keeps the structure, and the client and
// every replay get the winner's answer as it sent it.
func TestModelOutputContract(t *testing.T) {
	memoryAndPostgres(t, func(t *testing.T, b backend) {
		primary := newUpstream(t, completion(inventedOutput))
		fallback := newUpstream(t, completion(goodOutput))
		g := startGateway(t, b, modelSite(t, primary.addr(), fallback.addr(), "/choices/0/message/content",
			"failover_on contract 429 503 connect_error"))

		r := g.post(t, "/v1/chat/completions", "m-1", auth, `{"messages":[]}`)
		var got struct {
			Choices []struct{ Message struct{ Content string } }
		}
		if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &got) != nil || len(got.Choices) != 1 || got.Choices[0].Message.Content != goodOutput {
			t.Fatalf("completion: %v", r)
		}
		if primary.count("m-1") != 1 || fallback.count("m-1") != 1 {
			t.Errorf("calls: primary %d fallback %d", primary.count("m-1"), fallback.count("m-1"))
		}
		j := g.job(t, r.header.Get("Idempotency-Job-Id"))
		if len(j.Attempts) != 2 || j.Attempts[0].Error == nil ||
			!strings.Contains(*j.Attempts[0].Error, "json_schema: in /choices/0/message/content, at (root): additional properties 'source' not allowed") {
			t.Errorf("attempts: %+v", j.Attempts)
		}
		if b.schema != "" {
			if st, atts := jobState(t, b, j.ID); st != "completed" || len(atts) != 2 || atts[0] != "failed" || atts[1] != "succeeded" {
				t.Errorf("ledger: job %s attempts %v", st, atts)
			}
		}

		// Streamed: assembled from the deltas for the check, buffered
		// until it passed, then the provider's own event stream.
		want := strings.Join(chunks(goodOutput), "")
		s := g.post(t, "/v1/chat/completions/stream", "m-2", auth, `{"messages":[],"stream":true}`)
		if s.status != http.StatusOK || s.body != want || s.header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("stream: %v\nwant body %q", s, want)
		}
		again := g.post(t, "/v1/chat/completions/stream", "m-2", auth, `{"messages":[],"stream":true}`)
		if again.body != want || again.header.Get("Idempotent-Replayed") != "true" || again.header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("replay: %v", again)
		}
		if primary.count("m-2") != 1 || fallback.count("m-2") != 1 {
			t.Errorf("stream calls: primary %d fallback %d", primary.count("m-2"), fallback.count("m-2"))
		}
	})
}

// TestModelOutputBreachWithoutFailover: without contract in failover_on,
// an answer whose output breaks the schema is no result: 502
// contract-violation naming the rule, the job unknown, the output never
// shown.
func TestModelOutputBreachWithoutFailover(t *testing.T) {
	memoryAndPostgres(t, func(t *testing.T, b backend) {
		primary := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			w.Header().Set("Content-Type", "text/event-stream")
			if strings.HasSuffix(r.URL.Path, "/json") {
				fmt.Fprint(w, anthropicStream(goodOutput))
				return
			}
			fmt.Fprint(w, anthropicStream(`The capital is Paris.`))
		})
		fallback := newUpstream(t, answering(`{}`))
		g := startGateway(t, b, modelSite(t, primary.addr(), fallback.addr(), "/content/0/text"))
		r := g.post(t, "/v1/messages", "a-1", auth, `{"stream":true}`)
		if r.status != http.StatusBadGateway || !strings.Contains(r.body, "urn:onejob:problem:contract-violation") ||
			!strings.Contains(r.body, "/content/0/text is a string that is not JSON") || strings.Contains(r.body, "Paris") {
			t.Fatalf("breach: %v", r)
		}
		if retry := g.post(t, "/v1/messages", "a-1", auth, `{"stream":true}`); retry.status != http.StatusConflict {
			t.Errorf("retry: %v", retry)
		}
		if b.schema != "" {
			if st, atts := jobState(t, b, r.header.Get("Idempotency-Job-Id")); st != "unknown" || len(atts) != 1 {
				t.Errorf("ledger: job %s attempts %v", st, atts)
			}
		}

		// The same stream with JSON in it passes, assembled.
		ok := g.post(t, "/v1/messages/json", "a-2", auth, `{"stream":true}`)
		if ok.status != http.StatusOK || ok.body != anthropicStream(goodOutput) {
			t.Errorf("a stream that keeps the structure: %v", ok)
		}
		if fallback.total() != 0 {
			t.Errorf("fallback called %d times", fallback.total())
		}
	})
}
