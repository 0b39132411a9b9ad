package proxy

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// steps streams one event per gate: it sends event i, flushes, signals
// sent, and waits for gates[i] before the next; after the last gate it
// ends, or breaks its connection when cut.
func steps(events []string, gates []*gate, sent chan<- int, cut bool) upstreamFunc {
	return func(w http.ResponseWriter, _ *http.Request, _ int) error {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for i, e := range events {
			if _, err := io.WriteString(w, e); err != nil {
				return err
			}
			w.(http.Flusher).Flush()
			sent <- i
			<-gates[i].ch
		}
		if cut {
			panic(http.ErrAbortHandler)
		}
		return nil
	}
}

// Three duplicates join a streamed answer at different moments: each gets
// exactly the first client's bytes, in order, marked replayed.
func TestDuplicatesJoinALiveStream(t *testing.T) {
	events := []string{"data: 1\n\n", "data: 2\n\n", "data: 3\n\n"}
	const whole = "data: 1\n\ndata: 2\n\ndata: 3\n\n"
	gates := []*gate{newGate(t), newGate(t), newGate(t)}
	sent := make(chan int, len(events))
	h, p, _ := newProviders(t, Config{AttemptTimeout: patience}, steps(events, gates, sent, false), respond(http.StatusCreated, "fallback"))
	srv := serveHarness(t, h, gates...)

	first := postTo(t, srv, "k")
	defer first.Body.Close()
	id := first.Header.Get(HeaderJobID)
	joined := make(chan string, len(events))
	for i := range events {
		recv(t, sent, "an event")
		go func() {
			resp := postTo(t, srv, "k")
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusOK || resp.Header.Get(HeaderReplayed) != "true" ||
				resp.Header.Get(HeaderJobID) != id || resp.Header.Get("Content-Type") != "text/event-stream" || err != nil {
				t.Errorf("joiner %d: %d %v, %v", i, resp.StatusCode, resp.Header, err)
			}
			joined <- string(body)
		}()
		// Let the joiner read what was sent so far before the next event.
		if i < len(events)-1 {
			readN(t, first.Body, len(events[i]))
		}
		gates[i].open()
	}
	rest, err := io.ReadAll(first.Body)
	if err != nil || string(rest) != events[len(events)-1] {
		t.Fatalf("first client's last event %q, %v", rest, err)
	}
	for range events {
		if got := recv(t, joined, "a joiner's answer"); got != whole {
			t.Errorf("a joiner got %q, want %q", got, whole)
		}
	}
	h.waitRun()
	wantJob(t, h.job(id), ledger.JobCompleted, "primary/succeeded")
	if p.calls() != 1 {
		t.Errorf("primary called %d times", p.calls())
	}
}

// A stream cut short after a duplicate joined aborts the joiner's
// connection after the same bytes: never a gateway error written into it.
func TestJoinedStreamCutShort(t *testing.T) {
	events := []string{"data: 1\n\n", "data: 2\n\n"}
	gates := []*gate{newGate(t), newGate(t)}
	sent := make(chan int, len(events))
	h, _, _ := newProviders(t, Config{AttemptTimeout: patience}, steps(events, gates, sent, true), respond(http.StatusCreated, "fallback"))
	srv := serveHarness(t, h, gates...)

	first := postTo(t, srv, "k")
	defer first.Body.Close()
	recv(t, sent, "the first event")
	joiner := postTo(t, srv, "k")
	defer joiner.Body.Close()
	jr := bufio.NewReader(joiner.Body)
	if got := readN(t, jr, len(events[0])); got != events[0] || joiner.Header.Get(HeaderReplayed) != "true" {
		t.Fatalf("joiner's first event %q, headers %v", got, joiner.Header)
	}
	gates[0].open()
	recv(t, sent, "the second event")
	gates[1].open()
	rest, err := io.ReadAll(jr)
	if string(rest) != events[1] || err == nil || errors.Is(err, io.EOF) {
		t.Errorf("joiner after the cut: %q, %v; want the second event, then a broken connection", rest, err)
	}
	h.waitRun()
}

// A stream's first client and a duplicate that joins it each have the
// answer's headers to themselves: a handler in front that rewrites them in
// place (rewriting) changes neither the other's nor the stored answer.
func TestStreamHeadersAreEachClients(t *testing.T) {
	const event = "data: 1\n\n"
	gates := []*gate{newGate(t)}
	sent := make(chan int, 1)
	h, _, _ := newProviders(t, Config{AttemptTimeout: patience}, steps([]string{event}, gates, sent, false), respond(http.StatusCreated, "fallback"))
	wrapped := h.m.Wrap(http.NotFoundHandler())
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wrapped.ServeHTTP(rewriting{w, "Content-Type"}, r)
	}))
	t.Cleanup(func() { gates[0].open(); srv.Close() })

	const once = "text/event-stream+rewritten"
	first := postTo(t, srv, "k")
	defer first.Body.Close()
	recv(t, sent, "the event")
	joiner := make(chan *http.Response, 1)
	go func() { joiner <- postTo(t, srv, "k") }()
	j := recv(t, joiner, "the joiner's answer")
	defer j.Body.Close()
	gates[0].open()
	for name, resp := range map[string]*http.Response{"first": first, "joiner": j} {
		if got := resp.Header.Get("Content-Type"); got != once {
			t.Errorf("%s: Content-Type %q, want %q", name, got, once)
		}
		if body, err := io.ReadAll(resp.Body); err != nil || string(body) != event {
			t.Errorf("%s: body %q, %v", name, body, err)
		}
	}
	h.waitRun()
	if got := http.Header(h.job(first.Header.Get(HeaderJobID)).Response.Header).Get("Content-Type"); got != "text/event-stream" {
		t.Errorf("stored Content-Type %q", got)
	}
	replay := postTo(t, srv, "k")
	defer replay.Body.Close()
	if got := replay.Header.Get("Content-Type"); got != once || replay.Header.Get(HeaderReplayed) != "true" {
		t.Errorf("replay: Content-Type %q, replayed %q", got, replay.Header.Get(HeaderReplayed))
	}
}

// A streamed answer's first client, a duplicate that joins it and a replay
// carry the gateway's own headers, never the provider's.
func TestStreamCarriesOwnHeaders(t *testing.T) {
	const event = "data: 1\n\n"
	gates := []*gate{newGate(t)}
	sent := make(chan int, 1)
	stream := steps([]string{event}, gates, sent, false)
	h, _, _ := newProviders(t, Config{AttemptTimeout: patience}, func(w http.ResponseWriter, r *http.Request, n int) error {
		forgeOwnHeaders(w.Header())
		return stream(w, r, n)
	}, respond(http.StatusCreated, "fallback"))
	srv := serveHarness(t, h, gates...)

	first := postTo(t, srv, "k")
	defer first.Body.Close()
	recv(t, sent, "the event")
	joiner := make(chan *http.Response, 1)
	go func() { joiner <- postTo(t, srv, "k") }()
	dup := recv(t, joiner, "the joiner's answer")
	defer dup.Body.Close()
	gates[0].open()
	io.ReadAll(first.Body)
	io.ReadAll(dup.Body)
	h.waitRun()
	j := h.job(first.Header.Get(HeaderJobID))
	if j == nil {
		t.Fatalf("first answer's job id %q", first.Header.Values(HeaderJobID))
	}
	wantOwnHeaders(t, "first client", first.Header, j, false)
	wantOwnHeaders(t, "joiner", dup.Header, j, true)
	replay := postTo(t, srv, "k")
	defer replay.Body.Close()
	wantOwnHeaders(t, "replay", replay.Header, j, true)
}
