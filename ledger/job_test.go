package ledger

import (
	"slices"
	"testing"
)

// A clone's header values are its own: rewritten in place or appended to,
// they change neither the original nor the clone's other fields.
func TestResponseCloneHeader(t *testing.T) {
	r := &Response{Status: 201, Header: map[string][]string{
		"A": {"1", "2"}, "B": {"3"}, "Empty": {}, "Nil": nil,
	}, Body: []byte("x")}
	c := r.Clone()
	if len(c.Header) != len(r.Header) || c.Status != 201 || string(c.Body) != "x" {
		t.Fatalf("clone %+v", c)
	}
	for k, v := range r.Header {
		if !slices.Equal(c.Header[k], v) {
			t.Errorf("%s: %q, want %q", k, c.Header[k], v)
		}
	}
	c.Header["A"][0] = "rewritten"
	c.Header["A"] = append(c.Header["A"], "appended")
	c.Header["B"][0] += "+"
	if !slices.Equal(r.Header["A"], []string{"1", "2"}) || !slices.Equal(r.Header["B"], []string{"3"}) {
		t.Errorf("original changed: %v", r.Header)
	}
	if !slices.Equal(c.Header["B"], []string{"3+"}) {
		t.Errorf("appending to A changed B: %q", c.Header["B"])
	}
	if (*Response)(nil).Clone() != nil {
		t.Error("a nil response's clone is not nil")
	}
}
