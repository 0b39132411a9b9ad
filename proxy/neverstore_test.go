package proxy

import (
	"io"
	"net/http"
	"slices"
	"testing"
)

// private answers with the headers that belong to the first client alone:
// two cookies and a configured token, beside an ordinary header.
func private(contentType string) upstreamFunc {
	return func(w http.ResponseWriter, r *http.Request, n int) error {
		h := w.Header()
		h.Set("Content-Type", contentType)
		h.Add("Set-Cookie", "session=s3cr3t; HttpOnly")
		h.Add("Set-Cookie", "csrf=abc")
		h.Set("X-Csrf-Token", "t0k3n")
		h.Set("X-Kept", "yes")
		w.WriteHeader(http.StatusCreated)
		if contentType == "text/event-stream" {
			io.WriteString(w, "data: 1\n\n")
			http.NewResponseController(w).Flush()
		}
		_, err := io.WriteString(w, "data: 2\n\n")
		return err
	}
}

// Set-Cookie, and the names never_store adds (in any case), reach the first
// client as the provider sent them, and neither the ledger nor a replay;
// the other headers are stored and replayed. Buffered and streamed answers
// alike.
func TestNeverStoredHeaders(t *testing.T) {
	for _, ct := range []string{"application/json", "text/event-stream"} {
		t.Run(ct, func(t *testing.T) {
			h := newHarness(t, Config{NeverStore: []string{"x-csrf-token"}}, private(ct))
			first := h.do(post("k", `{}`))
			id := jobID(t, first)
			h.waitRun()
			if got := first.Header().Values("Set-Cookie"); !slices.Equal(got, []string{"session=s3cr3t; HttpOnly", "csrf=abc"}) {
				t.Errorf("first client's Set-Cookie %q", got)
			}
			if got := first.Header().Get("X-Csrf-Token"); got != "t0k3n" {
				t.Errorf("first client's X-Csrf-Token %q", got)
			}
			j := h.job(id)
			if j.Response == nil || !j.Response.Stored {
				t.Fatalf("response %+v, want stored", j.Response)
			}
			for _, name := range []string{"Set-Cookie", "X-Csrf-Token"} {
				if v, ok := j.Response.Header[name]; ok {
					t.Errorf("%s stored: %q", name, v)
				}
			}
			if got := j.Response.Header["X-Kept"]; !slices.Equal(got, []string{"yes"}) {
				t.Errorf("X-Kept stored as %q", got)
			}
			retry := h.do(post("k", `{}`))
			if retry.Header().Get(HeaderReplayed) != "true" || retry.Body.String() != first.Body.String() {
				t.Fatalf("retry: %d %q, headers %v", retry.Code, retry.Body, retry.Header())
			}
			for _, name := range []string{"Set-Cookie", "X-Csrf-Token"} {
				if v := retry.Header().Values(name); v != nil {
					t.Errorf("%s replayed: %q", name, v)
				}
			}
			if retry.Header().Get("X-Kept") != "yes" {
				t.Errorf("X-Kept not replayed: %v", retry.Header())
			}
		})
	}
}

// An answer stored while a header was still stored (before never_store
// named it) is replayed without it.
func TestNeverStoredHeadersOfOlderAnswers(t *testing.T) {
	before := newHarness(t, Config{}, private("application/json"))
	first := before.do(post("k", `{}`))
	before.waitRun()
	if j := before.job(jobID(t, first)); j.Response.Header["X-Csrf-Token"] == nil {
		t.Fatalf("X-Csrf-Token not stored without never_store: %v", j.Response.Header)
	}
	after := newHarness(t, Config{Ledger: before.l, NeverStore: []string{"X-CSRF-Token"}}, private("application/json"))
	retry := after.do(post("k", `{}`))
	if retry.Header().Get(HeaderReplayed) != "true" {
		t.Fatalf("retry: %d %q", retry.Code, retry.Body)
	}
	if v := retry.Header().Values("X-Csrf-Token"); v != nil {
		t.Errorf("X-Csrf-Token replayed: %q", v)
	}
	if after.up.calls() != 0 {
		t.Errorf("provider called %d times on a replay", after.up.calls())
	}
}

func TestNeverStoredRule(t *testing.T) {
	m, err := New(Config{Ledger: newHarness(t, Config{}, nil).l, NeverStore: []string{"x-private"}})
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{
		"set-cookie": true, "Set-Cookie": true, "Connection": true, "date": true,
		"X-Private": true, "x-private": true, "Content-Type": false, "Set-Cookie2": false,
		"idempotency-expires": true, HeaderJobID: true, HeaderReplayed: true, HeaderReconciled: false,
	} {
		if got := m.NeverStored(name); got != want {
			t.Errorf("NeverStored(%q) = %v, want %v", name, got, want)
		}
	}
	if NeverStored("X-Private") {
		t.Error("the package rule names a handler's header")
	}
	h := map[string][]string{"Content-Type": {"a"}}
	if got := m.storable(h); len(got) != 1 {
		t.Errorf("storable dropped %v", got)
	}
}
