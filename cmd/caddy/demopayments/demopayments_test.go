package demopayments

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
)

func TestUnmarshalCaddyfile(t *testing.T) {
	var p Payments
	if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser("demo_payments {\n\tbreak_first\n\tslow 8s\n}")); err != nil {
		t.Fatal(err)
	}
	if !p.BreakFirst || p.Slow != caddy.Duration(8*time.Second) {
		t.Errorf("parsed %+v", p)
	}
	if err := new(Payments).UnmarshalCaddyfile(caddyfile.NewTestDispenser("demo_payments")); err != nil {
		t.Errorf("no options: %v", err)
	}
	for _, tc := range []struct{ in, want string }{
		{"demo_payments card", "wrong argument count"},
		{"demo_payments {\n\tbreak_first always\n}", "wrong argument count or unexpected line ending after 'always', at Testfile:2"},
		{"demo_payments {\n\tslow\n}", "wrong argument count or unexpected line ending after 'slow', at Testfile:2"},
		{"demo_payments {\n\tslow 1s 2s\n}", "wrong argument count"},
		{"demo_payments {\n\tslow soon\n}", `demo_payments: slow "soon": `},
		{"demo_payments {\n\tslow 0s\n}", `demo_payments: slow must be longer than 0, not "0s": leave it out to answer at once, at Testfile:2`},
		{"demo_payments {\n\tbreak_first\n\tbreak_first\n}", `demo_payments: duplicate "break_first", at Testfile:3`},
		{"demo_payments {\n\tcurrency eur\n}", `demo_payments: unknown option "currency" (want break_first or slow), at Testfile:2`},
	} {
		var p Payments
		if err := p.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.in, err, tc.want)
		}
	}
}

// serve runs p on a real server, so that a lost answer is a closed
// connection.
func serve(t *testing.T, p *Payments) string {
	t.Helper()
	p.store = newStore()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := p.ServeHTTP(w, r, nil); err != nil {
			t.Errorf("ServeHTTP: %v", err)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

type reply struct {
	status int
	body   string
	err    error
}

func call(ctx context.Context, method, url string, header map[string]string) reply {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(`{"amount":42}`))
	if err != nil {
		return reply{err: err}
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	// A fresh transport: no connection is reused, and a POST that lost
	// its answer is not sent again by the client.
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: string(b), err: err}
}

func post(url string, header map[string]string) reply {
	return call(context.Background(), http.MethodPost, url, header)
}

func get(url string) reply { return call(context.Background(), http.MethodGet, url, nil) }

func decode(t *testing.T, r reply) charge {
	t.Helper()
	var c charge
	if r.err != nil || json.Unmarshal([]byte(r.body), &c) != nil {
		t.Fatalf("not a charge: %+v", r)
	}
	return c
}

// TestChargeOncePerKey: the first POST for a key charges; the next gets the
// same charge, byte for byte; another key is another charge. Without
// Idempotency-Key the job id is the identity, and a lookup finds a charge
// by either.
func TestChargeOncePerKey(t *testing.T) {
	p := new(Payments)
	url := serve(t, p)
	first := post(url+"/payments/a", map[string]string{"Idempotency-Key": "job-1", "Idempotency-Job-Id": "job-1", "Idempotency-Attempt": "1"})
	if first.status != http.StatusCreated || first.body != `{"id":"ch_1","object":"charge","path":"/payments/a","idempotency_key":"job-1","job_id":"job-1","attempt":1}`+"\n" {
		t.Fatalf("first: %+v", first)
	}
	if again := post(url+"/payments/a", map[string]string{"Idempotency-Key": "job-1", "Idempotency-Attempt": "2"}); again != first {
		t.Errorf("again: %+v, want %+v", again, first)
	}
	other := decode(t, post(url+"/payments/a", map[string]string{"Idempotency-Key": "order-2", "Idempotency-Job-Id": "job-2"}))
	byJob := decode(t, post(url+"/other", map[string]string{"Idempotency-Job-Id": "job-3"}))
	if other.ID != "ch_2" || byJob.ID != "ch_3" || byJob.IdempotencyKey != "job-3" || byJob.Path != "/other" {
		t.Errorf("other charges: %+v %+v", other, byJob)
	}
	for id, want := range map[string]string{"job-1": "ch_1", "order-2": "ch_2", "job-2": "ch_2", "job-3": "ch_3"} {
		if c := decode(t, get(url+LookupPrefix+id)); c.ID != want {
			t.Errorf("lookup %s: %+v, want %s", id, c, want)
		}
	}
	if r := get(url + LookupPrefix + "job-4"); r.status != http.StatusNotFound || r.body != `{"error":"no charge","id":"job-4"}`+"\n" {
		t.Errorf("lookup of nothing: %+v", r)
	}
	if r := post(url+"/payments/a", nil); r.status != http.StatusBadRequest {
		t.Errorf("no identity: %+v", r)
	}
	var list struct{ Charges []charge }
	if r := get(url + "/charges"); json.Unmarshal([]byte(r.body), &list) != nil || len(list.Charges) != 3 {
		t.Errorf("charges: %+v", r)
	}
	for _, key := range []string{"job-1", "order-2", "job-3"} {
		if n := p.store.sideEffects(key); n != 1 {
			t.Errorf("%s charged %d times", key, n)
		}
	}
}

// TestBreakFirst: the first POST for a path charges and loses its
// answer; the same key again gets the charge. Only the first call for
// each path breaks.
func TestBreakFirst(t *testing.T) {
	p := &Payments{BreakFirst: true}
	url := serve(t, p)
	key := map[string]string{"Idempotency-Key": "job-1"}
	if r := post(url+"/payments/a", key); r.err == nil {
		t.Fatalf("the first call was answered: %+v", r)
	}
	if c := decode(t, post(url+"/payments/a", key)); c.ID != "ch_1" {
		t.Errorf("the same key again: %+v", c)
	}
	if c := decode(t, post(url+"/payments/a", map[string]string{"Idempotency-Key": "job-2"})); c.ID != "ch_2" {
		t.Errorf("a second key on the path: %+v", c)
	}
	if r := post(url+"/payments/b", map[string]string{"Idempotency-Key": "job-3"}); r.err == nil {
		t.Errorf("the first call for another path was answered: %+v", r)
	}
	if p.store.sideEffects("job-1") != 1 || p.store.sideEffects("job-3") != 1 {
		t.Errorf("side effects: %v", p.store.effects)
	}
}

// TestSlow: a new charge is answered after slow, but found by a lookup at
// once; the same key meanwhile is 409. A caller that leaves does not undo
// the charge, and the key then gets it.
func TestSlow(t *testing.T) {
	p := &Payments{Slow: caddy.Duration(200 * time.Millisecond)}
	url := serve(t, p)
	start := time.Now()
	if c := decode(t, post(url+"/p", map[string]string{"Idempotency-Key": "k1"})); c.ID != "ch_1" || time.Since(start) < 200*time.Millisecond {
		t.Errorf("slow charge %+v after %v", c, time.Since(start))
	}
	start = time.Now()
	if c := decode(t, post(url+"/p", map[string]string{"Idempotency-Key": "k1"})); c.ID != "ch_1" || time.Since(start) >= 200*time.Millisecond {
		t.Errorf("the stored charge %+v after %v: want it at once", c, time.Since(start))
	}

	p = &Payments{Slow: caddy.Duration(time.Minute)}
	url = serve(t, p)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan reply)
	go func() {
		done <- call(ctx, http.MethodPost, url+"/p", map[string]string{"Idempotency-Key": "k2", "Idempotency-Job-Id": "j2"})
	}()
	deadline := time.Now().Add(5 * time.Second)
	for p.store.find("j2") == nil {
		if time.Now().After(deadline) {
			t.Fatal("the charge was not made")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if c := decode(t, get(url+LookupPrefix+"j2")); c.ID != "ch_1" {
		t.Errorf("lookup while the charge runs: %+v", c)
	}
	if r := post(url+"/p", map[string]string{"Idempotency-Key": "k2"}); r.status != http.StatusConflict ||
		r.body != `{"error":"in progress","idempotency_key":"k2"}`+"\n" {
		t.Errorf("the same key while it runs: %+v", r)
	}
	cancel()
	if r := <-done; !errors.Is(r.err, context.Canceled) {
		t.Errorf("the caller that left: %+v", r)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		r := post(url+"/p", map[string]string{"Idempotency-Key": "k2"})
		if r.status == http.StatusCreated {
			if c := decode(t, r); c.ID != "ch_1" {
				t.Errorf("after the caller left: %+v", c)
			}
			break
		}
		if r.status != http.StatusConflict || time.Now().After(deadline) {
			t.Fatalf("after the caller left: %+v", r)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if p.store.sideEffects("k2") != 1 {
		t.Errorf("k2 charged %d times", p.store.sideEffects("k2"))
	}
}

func TestOtherRequests(t *testing.T) {
	url := serve(t, new(Payments))
	if r := get(url + "/nothing"); r.status != http.StatusNotFound {
		t.Errorf("GET elsewhere: %+v", r)
	}
	if r := call(context.Background(), http.MethodDelete, url+"/charges", nil); r.status != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: %+v", r)
	}
}
