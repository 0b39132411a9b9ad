// Package demomodel is a deterministic stand-in for an OpenAI-compatible
// model server, for the demo in Caddyfile.example: the Caddy handler
// http.handlers.demo_model answers POST /v1/chat/completions with a chat
// completion whose content is a JSON object, streamed as server-sent
// events when the request says "stream": true. It is built only into
// ./cmd/caddy, never into the plugin.
package demomodel

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"unicode/utf8"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

func init() {
	caddy.RegisterModule(Model{})
	httpcaddyfile.RegisterHandlerDirective("demo_model", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("demo_model", httpcaddyfile.Before, "respond")
}

// Model is a demo model server. Its answers are deterministic: the
// content of a completion depends only on the request's last user
// message, and the completion's id counts the completions this model made
// (so a replay, which keeps the id, is told apart from a second run).
type Model struct {
	// Name is the model's name, reported in each completion's "model".
	Name string `json:"name,omitempty"`
	// InventKey, when set, is a top-level key the model adds to every
	// structured output it writes, as a model that does not keep the
	// requested structure does: a contract whose schema says
	// "additionalProperties": false refuses it.
	InventKey string `json:"invent_key,omitempty"`
	// Overloaded, when set, is a word that makes the model answer 503
	// (an overloaded provider) when the last user message contains it.
	Overloaded string `json:"overloaded,omitempty"`

	made *atomic.Int64 // completions made, since the config loaded
}

// Provision starts the model's count of completions.
func (m *Model) Provision(caddy.Context) error {
	m.made = new(atomic.Int64)
	return nil
}

// CaddyModule returns the Caddy module information.
func (Model) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.demo_model",
		New: func() caddy.Module { return new(Model) },
	}
}

// UnmarshalCaddyfile sets up the model. Syntax:
//
//	demo_model <name> {
//		invent_key <key>
//		overloaded <word>
//	}
func (m *Model) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // the directive name
	if !d.NextArg() {
		return d.ArgErr()
	}
	m.Name = d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var dst *string
		switch d.Val() {
		case "invent_key":
			dst = &m.InventKey
		case "overloaded":
			dst = &m.Overloaded
		default:
			return d.Errf("demo_model: unknown option %q (want invent_key or overloaded)", d.Val())
		}
		if *dst != "" {
			return d.Errf("demo_model: duplicate %q", d.Val())
		}
		args := d.RemainingArgs()
		if len(args) != 1 || args[0] == "" {
			return d.ArgErr()
		}
		*dst = args[0]
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	m := new(Model)
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// request is the part of a chat completion request the demo reads.
type request struct {
	Model    string `json:"model"`
	Stream   bool   `json:"stream"`
	Messages []struct {
		Role    string `json:"role"`
		Content any    `json:"content"` // a string, or an array of parts
	} `json:"messages"`
}

// prompt is the text of the last user message.
func (r *request) prompt() string {
	for i := len(r.Messages) - 1; i >= 0; i-- {
		msg := r.Messages[i]
		if msg.Role != "user" {
			continue
		}
		switch c := msg.Content.(type) {
		case string:
			return c
		case []any:
			var b strings.Builder
			for _, part := range c {
				if p, ok := part.(map[string]any); ok {
					if s, ok := p["text"].(string); ok {
						b.WriteString(s)
					}
				}
			}
			return b.String()
		}
	}
	return ""
}

// ServeHTTP answers a chat completion request; next is never called.
func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	if r.Method != http.MethodPost {
		return problem(w, http.StatusMethodNotAllowed, "invalid_request_error", "POST a chat completion request")
	}
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20)).Decode(&req); err != nil {
		return problem(w, http.StatusBadRequest, "invalid_request_error", "the body is not a chat completion request: "+err.Error())
	}
	prompt := req.prompt()
	if m.Overloaded != "" && strings.Contains(strings.ToLower(prompt), strings.ToLower(m.Overloaded)) {
		w.Header().Set("Retry-After", "1")
		return problem(w, http.StatusServiceUnavailable, "overloaded_error", m.Name+" is overloaded")
	}
	content := m.output(prompt)
	id := fmt.Sprintf("chatcmpl-%s-%d", m.Name, m.made.Add(1))
	if req.Stream {
		return m.stream(w, id, content)
	}
	w.Header().Set("Content-Type", "application/json")
	return json.NewEncoder(w).Encode(map[string]any{
		"id": id, "object": "chat.completion", "created": created, "model": m.Name,
		"choices": []any{map[string]any{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": content},
			"finish_reason": "stop",
		}},
		"usage": map[string]int{"prompt_tokens": words(prompt), "completion_tokens": words(content), "total_tokens": words(prompt) + words(content)},
	})
}

// created is the time every demo completion says it was made: a fixed
// one, so that answers depend on nothing but the request.
const created = 1767225600 // 2026-01-01T00:00:00Z

// output is the model's structured output for a prompt: a JSON object
// with answer and confidence, and InventKey when it is set.
func (m *Model) output(prompt string) string {
	answer := "I do not know: " + strings.TrimSpace(prompt)
	confidence := 0.1
	if strings.Contains(strings.ToLower(prompt), "capital of france") {
		answer, confidence = "Paris", 0.98
	}
	out := map[string]any{"answer": answer, "confidence": confidence}
	if m.InventKey != "" {
		out[m.InventKey] = "added by " + m.Name
	}
	b, _ := json.Marshal(out) // strings and a number: cannot fail
	return string(b)
}

// stream sends the completion as OpenAI-style chunks of a few bytes of
// content each, flushed one by one.
func (m *Model) stream(w http.ResponseWriter, id, content string) error {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	rc := http.NewResponseController(w)
	send := func(delta map[string]any, finish any) error {
		b, _ := json.Marshal(map[string]any{
			"id": id, "object": "chat.completion.chunk", "created": created, "model": m.Name,
			"choices": []any{map[string]any{"index": 0, "delta": delta, "finish_reason": finish}},
		})
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return err
		}
		return rc.Flush()
	}
	if err := send(map[string]any{"role": "assistant", "content": ""}, nil); err != nil {
		return err
	}
	for rest := content; rest != ""; {
		k := min(8, len(rest))
		for k < len(rest) && !utf8.RuneStart(rest[k]) {
			k++ // whole characters in each delta
		}
		if err := send(map[string]any{"content": rest[:k]}, nil); err != nil {
			return err
		}
		rest = rest[k:]
	}
	if err := send(map[string]any{}, "stop"); err != nil {
		return err
	}
	if _, err := fmt.Fprint(w, "data: [DONE]\n\n"); err != nil {
		return err
	}
	return rc.Flush()
}

// problem answers an error as OpenAI-compatible servers do.
func problem(w http.ResponseWriter, status int, typ, message string) error {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	return json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"type": typ, "message": message}})
}

func words(s string) int { return len(strings.Fields(s)) }

// Interface guards
var (
	_ caddy.Provisioner           = (*Model)(nil)
	_ caddyhttp.MiddlewareHandler = (*Model)(nil)
	_ caddyfile.Unmarshaler       = (*Model)(nil)
)
