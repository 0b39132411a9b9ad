package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// IsEventStream reports whether h says the answer is a server-sent event
// stream (Content-Type text/event-stream, parameters allowed).
func IsEventStream(h http.Header) bool {
	ct := h.Get("Content-Type")
	return len(ct) >= 17 && strings.EqualFold(ct[:17], "text/event-stream")
}

// eachEvent calls fn with the type and data of each event of a
// server-sent event stream, as the WHATWG HTML standard reads one: lines
// end in CRLF, LF or CR; a line starting with ":" is a comment; "field:
// value" loses one space after the colon; data lines of one event are
// joined by "\n"; a blank line dispatches the event, unless it has no
// data; an event the stream ends in the middle of is never dispatched.
// It stops at fn's first error and returns it.
func eachEvent(stream []byte, fn func(event string, data []byte) error) error {
	stream = bytes.TrimPrefix(stream, []byte("\xef\xbb\xbf"))
	var (
		event   string
		data    []byte
		hasData bool
	)
	for len(stream) > 0 {
		end := bytes.IndexAny(stream, "\r\n")
		if end < 0 {
			return nil // the last line never ended: its event is not dispatched
		}
		line := stream[:end]
		next := end + 1
		if stream[end] == '\r' && next < len(stream) && stream[next] == '\n' {
			next++
		}
		stream = stream[next:]

		if len(line) == 0 {
			if hasData {
				if err := fn(event, data); err != nil {
					return err
				}
			}
			event, data, hasData = "", data[:0], false
			continue
		}
		if line[0] == ':' {
			continue
		}
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "data":
			if hasData {
				data = append(data, '\n')
			}
			data, hasData = append(data, value...), true
		case "event":
			event = string(value)
		}
	}
	return nil
}

// maxStreamIndex bounds the choice and content block indexes a streamed
// completion may name, so that an index cannot make the assembled answer
// larger than the stream.
const maxStreamIndex = 1023

// streamPart is what the events of a completion stream say, OpenAI-style
// (choices[].delta) and Anthropic-style (content_block_start and
// content_block_delta with index and delta) alike: the fields of one
// event's data that assembling reads.
type streamPart struct {
	Type    string `json:"type"`
	Index   *int   `json:"index"`
	Choices []struct {
		Index *int `json:"index"`
		Delta struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	ContentBlock *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content_block"`
	Delta *struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"delta"`
	Error json.RawMessage `json:"error"`
}

// assembled is a completion being put together from its deltas.
type assembled struct {
	choices []*assembledChoice // OpenAI-style, by index; nil where none came
	blocks  []*assembledBlock  // Anthropic-style, by index
}

type assembledChoice struct {
	role    *string
	content *strings.Builder // nil while no content delta came
}

type assembledBlock struct {
	typ  string
	text strings.Builder
}

// grow returns s long enough to hold index i, or an error for an index
// out of bounds.
func grow[T any](s []*T, i *int, what string) ([]*T, *T, error) {
	if *i < 0 || *i > maxStreamIndex {
		return s, nil, fmt.Errorf("%s index %d is out of range (0 to %d)", what, *i, maxStreamIndex)
	}
	for len(s) <= *i {
		s = append(s, nil)
	}
	if s[*i] == nil {
		s[*i] = new(T)
	}
	return s, s[*i], nil
}

// AssembleStream puts a streamed completion together into the layout of
// the answer the provider gives when it does not stream, so that a JSON
// Pointer written for that answer finds the same member: OpenAI-style
// chunks (each choice's delta.content joined) become
// {"choices":[{"index":i,"message":{"role":...,"content":...}}]}, and
// Anthropic-style events (each content block's text_delta texts joined
// after its content_block_start text) become
// {"content":[{"type":...,"text":...}]}. The event [DONE] ends nothing
// and is skipped; an event whose data is not a JSON object, or one that
// reports an error, is an error.
func AssembleStream(stream []byte) ([]byte, error) {
	var a assembled
	n := 0
	err := eachEvent(stream, func(event string, data []byte) error {
		n++
		if string(bytes.TrimSpace(data)) == "[DONE]" {
			return nil
		}
		var p streamPart
		if err := json.Unmarshal(data, &p); err != nil {
			return fmt.Errorf("event %d: data is not a completion chunk: %s", n, jsonError(err))
		}
		if event == "error" || p.Type == "error" || (len(p.Error) > 0 && string(p.Error) != "null") {
			return fmt.Errorf("event %d reports an error", n)
		}
		return a.add(&p)
	})
	if err != nil {
		return nil, err
	}
	return a.document()
}

// jsonError is a decoding error without the Go type names
// encoding/json puts in some.
func jsonError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) && te.Field != "" {
		return "unexpected " + te.Value + " at " + te.Field
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return se.Error()
	}
	return "not a JSON object"
}

func (a *assembled) add(p *streamPart) error {
	var err error
	for j := range p.Choices {
		c := &p.Choices[j]
		i := c.Index
		if i == nil {
			i = &j
		}
		var ch *assembledChoice
		if a.choices, ch, err = grow(a.choices, i, "choice"); err != nil {
			return err
		}
		if c.Delta.Role != nil {
			ch.role = c.Delta.Role
		}
		if c.Delta.Content != nil {
			if ch.content == nil {
				ch.content = new(strings.Builder)
			}
			ch.content.WriteString(*c.Delta.Content)
		}
	}
	switch p.Type {
	case "content_block_start", "content_block_delta":
		i := p.Index
		if i == nil {
			return fmt.Errorf("%s without an index", p.Type)
		}
		var b *assembledBlock
		if a.blocks, b, err = grow(a.blocks, i, "content block"); err != nil {
			return err
		}
		if p.Type == "content_block_start" && p.ContentBlock != nil {
			b.typ = p.ContentBlock.Type
			b.text.WriteString(p.ContentBlock.Text)
		}
		if p.Type == "content_block_delta" && p.Delta != nil && p.Delta.Type == "text_delta" {
			if b.typ == "" {
				b.typ = "text"
			}
			b.text.WriteString(p.Delta.Text)
		}
	}
	return nil
}

// document encodes the assembled completion.
func (a *assembled) document() ([]byte, error) {
	doc := map[string]any{}
	if a.choices != nil {
		choices := make([]any, len(a.choices))
		for i, c := range a.choices {
			msg := map[string]any{"content": nil}
			if c != nil && c.role != nil {
				msg["role"] = *c.role
			}
			if c != nil && c.content != nil {
				msg["content"] = c.content.String()
			}
			choices[i] = map[string]any{"index": i, "message": msg}
		}
		doc["choices"] = choices
	}
	if a.blocks != nil {
		blocks := make([]any, len(a.blocks))
		for i, b := range a.blocks {
			block := map[string]any{}
			if b != nil {
				block["type"], block["text"] = b.typ, b.text.String()
			}
			blocks[i] = block
		}
		doc["content"] = blocks
	}
	if len(doc) == 0 {
		return nil, errors.New("the stream holds no completion chunk")
	}
	return json.Marshal(doc)
}
