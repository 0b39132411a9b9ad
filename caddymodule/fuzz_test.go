package caddymodule

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/google/uuid"
	"golang.org/x/net/http/httpguts"

	"github.com/onejob/onejob/contract"
	"github.com/onejob/onejob/fallback"
	"github.com/onejob/onejob/fingerprint"
	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/proxy"
)

// caddyfileSeeds are directive blocks worth mutating: every subdirective
// with valid and invalid arguments, nested blocks, and broken nesting.
var caddyfileSeeds = []string{
	"idempotency",
	"idempotency {\n}",
	"idempotency foo",
	everyOption,
	"idempotency {\n\tcache redis redis://127.0.0.1:6379/0 p:\n\tfingerprint graphql\n\tfailover_on connect_error contract 503\n\thedge_after 250ms\n}",
	"idempotency {\n\tledger postgres {\n\t\tdsn postgres://db/x\n\t\tschema s\n\t}\n\tcache redis {\n\t\turl redis://h\n\t}\n}",
	"idempotency {\n\tledger file /var/lib/onejob.db\n}",
	"idempotency {\n\tledger redis redis://h:1/2 pre:\n}",
	"idempotency {\n\tledger memory\n\tin_flight reject\n}",
	"idempotency {\n\tledger mysql x\n}",
	"idempotency {\n\tledger\n}",
	"idempotency {\n\tretention 1h\n\tretention 2h\n}",
	"idempotency {\n\tmax_request_body 0\n}",
	"idempotency {\n\tmax_request_body 2PiB\n}",
	"idempotency {\n\tattempt_timeout -1s\n}",
	"idempotency {\n\tin_flight wait 1s 2s\n}",
	"idempotency {\n\tfailover_on 503 teapot\n}",
	"idempotency {\n\tcache memcached x\n}",
	contractAndProbe,
	"idempotency {\n\tcontract {\n\t\tstatus 7xx\n\t}\n}",
	"idempotency {\n\tcontract {\n\t\tcontract {\n\t\t}\n\t}\n}",
	"idempotency {\n\tprobe GET /h {\n\t\tevery\n\t}\n}",
	"idempotency {\n\tprobe GET health\n}",
	`idempotency {
	provider primary {
		reverse_proxy 127.0.0.1:9001
	}
	provider fallback {
		rewrite * /v2{uri}
		reverse_proxy 127.0.0.1:9002 {
			lb_retries 2
		}
	}
}`,
	"idempotency {\n\tprovider {\n\t}\n}",
	"idempotency {\n\tprovider a\n}",
	"idempotency {\n\tprovider a {\n\t\treverse_proxy 127.0.0.1:1 {\n\t\t\tlb_retry_match {\n\t\t\t\tmethod POST\n\t\t\t}\n\t\t}\n\t}\n}",
	"idempotency {\n\tprovider a {\n\t\treverse_proxy 127.0.0.1:1 {\n\t\t\trequest_buffers 1k\n\t\t}\n\t}\n}",
	"idempotency {\n\tscope api.example.com\n}",
	"idempotency {\n\trequire_key {\n\t\tx\n\t}\n}",
	"idempotency {\n\t{\n\t}\n}",
	"idempotency {\n\tmethods\n}",
	"idempotency {\n\towner \"\"\n}",
	"idempotency {\n\towner `a b`\n}",
	"idempotency {\n\tkey_header \"\"\n}",
	"idempotency {\n\tfingerprint_headers \"\"\n}",
	"idempotency {\n\tmethods \"\"\n}",
	"idempotency {\n\timplicit_key 10m\n\trequire_key\n}",
	"idempotency {\n\tcontract {\n\t\tjson_schema a.json at /choices/0/message/content\n\t}\n}",
	"idempotency {\n\tcontract {\n\t\tjson_schema a.json at\n\t}\n}",
}

// FuzzUnmarshalCaddyfile feeds arbitrary Caddyfile text to the directive,
// alone (UnmarshalCaddyfile) and inside a site through the Caddyfile
// adapter (which also parses provider blocks). It must never panic. An
// error names the file and line; a success is deterministic, survives a
// JSON round trip, and holds only values the gateway accepts.
func FuzzUnmarshalCaddyfile(f *testing.F) {
	for _, s := range caddyfileSeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		tokens, err := caddyfile.Tokenize([]byte(in), "Fuzzfile")
		if err != nil {
			return // not a Caddyfile: the lexer's business
		}
		var h Handler
		err = h.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens))
		if err != nil {
			// With no token at all there is no line to name.
			if err.Error() == "" || (len(tokens) > 0 && !strings.Contains(err.Error(), "Fuzzfile:")) {
				t.Fatalf("error %q does not name the file and line", err)
			}
		} else {
			checkHandlerConfig(t, in, &h)
			var again Handler
			if err := again.UnmarshalCaddyfile(caddyfile.NewDispenser(tokens)); err != nil {
				t.Fatalf("the second parse of %q failed: %v", in, err)
			}
			a, _ := json.Marshal(h)
			b, _ := json.Marshal(again)
			if !bytes.Equal(a, b) {
				t.Fatalf("parsing %q is not deterministic:\n  %s\n  %s", in, a, b)
			}
		}

		// import reads files (the fuzzer could name /dev/zero): not what
		// is under test here.
		if len(tokens) == 0 || tokens[0].Text != "idempotency" || strings.Contains(in, "import") {
			return
		}
		site := ":8080 {\n" + in + "\n}\n"
		out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(site), map[string]any{"filename": "Fuzzfile"})
		if err != nil {
			if err.Error() == "" {
				t.Fatal("the adapter returned an empty error")
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("the adapter's output for %q is not JSON: %s", in, out)
		}
	})
}

// checkHandlerConfig checks the invariants of a parsed handler: every value
// is one the gateway accepts, and the config survives a JSON round trip.
func checkHandlerConfig(t *testing.T, in string, h *Handler) {
	t.Helper()
	for _, d := range []int64{int64(h.Retention), int64(h.AttemptTimeout), int64(h.AttemptDeadline), int64(h.InFlightWait), int64(h.HedgeAfter)} {
		if d < 0 {
			t.Fatalf("%q: negative duration in %+v", in, h)
		}
	}
	if h.MaxRequestBody < 0 || h.MaxResponseBody < 0 {
		t.Fatalf("%q: negative size in %+v", in, h)
	}
	for _, m := range h.Methods {
		if m != strings.ToUpper(m) {
			t.Fatalf("%q: method %q is not upper case", in, m)
		}
	}
	if h.Fingerprint != "" {
		if _, err := fingerprint.ParseBodyMode(h.Fingerprint); err != nil {
			t.Fatalf("%q: fingerprint %q accepted: %v", in, h.Fingerprint, err)
		}
	}
	if len(h.FailoverOn) > 0 {
		if _, err := fallback.ParseFailoverOn(h.FailoverOn); err != nil {
			t.Fatalf("%q: failover_on %q accepted: %v", in, h.FailoverOn, err)
		}
	}
	if !slices.Contains([]string{"", "wait", "reject"}, h.InFlight) {
		t.Fatalf("%q: in_flight %q accepted", in, h.InFlight)
	}
	if h.LedgerRaw != nil {
		var l struct {
			Backend string `json:"backend"`
		}
		if err := json.Unmarshal(h.LedgerRaw, &l); err != nil || !slices.Contains([]string{"file", "memory", "postgres", "redis"}, l.Backend) {
			t.Fatalf("%q: ledger %s accepted (%v)", in, h.LedgerRaw, err)
		}
	}
	if h.CacheRaw != nil {
		var c struct {
			Backend string  `json:"backend"`
			URL     *string `json:"url"`
		}
		if err := json.Unmarshal(h.CacheRaw, &c); err != nil || c.Backend != "redis" || c.URL == nil {
			t.Fatalf("%q: cache %s accepted (%v)", in, h.CacheRaw, err)
		}
	}
	if c := h.Contract; c != nil {
		if _, err := contract.Compile(contract.Spec{Statuses: c.Status}); err != nil {
			t.Fatalf("%q: contract status %q accepted: %v", in, c.Status, err)
		}
	}
	if p := h.Probe; p != nil && (p.check() != nil || p.Every < 0) {
		t.Fatalf("%q: probe %+v accepted", in, p)
	}
	if len(h.Providers) > 0 {
		t.Fatalf("%q: provider blocks were accepted without the Caddyfile adapter", in)
	}
	out, err := json.Marshal(h)
	if err != nil {
		t.Fatalf("%q: the config does not marshal: %v", in, err)
	}
	var back Handler
	if err := json.Unmarshal(out, &back); err != nil {
		t.Fatalf("%q: %s does not unmarshal: %v", in, out, err)
	}
	if again, _ := json.Marshal(back); !bytes.Equal(again, out) {
		t.Fatalf("%q: JSON round trip changed the config:\n  %s\n  %s", in, out, again)
	}
}

// FuzzParseResolution feeds arbitrary bodies to the resolve endpoint's
// parser. It must never panic; invalid JSON is always refused; an error is
// a 400 or 413 with a message; an accepted answer is well-formed (status
// 100-599, canonical valid header names, no hop-by-hop header, no CR, LF
// or NUL in a value, Content-Length equal to the body's length) and
// parses again to itself when written back as a request.
func FuzzParseResolution(f *testing.F) {
	for _, s := range []string{
		`{"outcome":"cancel"}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Content-Type":["application/json"]},"body":"eyJvayI6dHJ1ZX0="}}`,
		`{"outcome":"complete","response":{"status":201,"headers":{"content-length":["2"],"x-a":["1","2"]},"body":"b2s="}}`,
		`{"outcome":"complete","response":{"status":204}}`,
		`{"outcome":"complete","response":{"status":99,"body":""}}`,
		`{"outcome":"complete","response":{"status":600,"body":""}}`,
		`{"outcome":"complete","response":{"status":200,"body":"!!"}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Connection":["close"]}}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"X-A":["a\r\nb"]}}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Bad Name":["a"]}}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"X-A":["1"],"x-a":["2"]}}}`,
		`{"outcome":"complete","response":{"status":200,"headers":{"Content-Length":["1","1"]},"body":"YQ=="}}`,
		`{"outcome":"complete"}`,
		`{"outcome":"cancel","response":{"status":200}}`,
		`{"outcome":"maybe"}`,
		`{"outcome":"cancel","extra":1}`,
		`{"outcome":"cancel"} {"outcome":"cancel"}`,
		`{"outcome":"cancel"}  `,
		`{"outcome":"cancel"`,
		`{"outcome":"complete","response":null}`,
		`{"outcome":"complete","response":{"status":"200"}}`,
		`{"outcome":"complete","response":{"status":2e2}}`,
		`[]`,
		`null`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		res, status, err := resolve(body)
		if err != nil {
			if (status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge) || err.Error() == "" {
				t.Fatalf("%q: error %q with status %d", body, err, status)
			}
			if !reflect.DeepEqual(res, ledger.Resolution{}) {
				t.Fatalf("%q: resolution %+v returned with its error", body, res)
			}
			return
		}
		if status != 0 {
			t.Fatalf("%q: status %d without an error", body, status)
		}
		if !json.Valid(bytes.TrimSpace(body)) {
			t.Fatalf("invalid JSON %q was accepted", body)
		}
		if res.Cancel {
			if res.Response != nil {
				t.Fatalf("%q: a cancel with a response", body)
			}
			return
		}
		r := res.Response
		if r == nil {
			t.Fatalf("%q: neither cancel nor a response", body)
		}
		if r.Status < 100 || r.Status > 599 || !r.Stored || r.Size != int64(len(r.Body)) {
			t.Fatalf("%q: response %+v", body, r)
		}
		for name, values := range r.Header {
			if !httpguts.ValidHeaderFieldName(name) || name != http.CanonicalHeaderKey(name) {
				t.Fatalf("%q: header name %q", body, name)
			}
			if proxy.NeverStored(name) {
				t.Fatalf("%q: hop-by-hop header %s accepted", body, name)
			}
			for _, v := range values {
				if strings.ContainsAny(v, "\r\n\x00") {
					t.Fatalf("%q: header %s value %q", body, name, v)
				}
			}
			if name == "Content-Length" && (len(values) != 1 || values[0] != strconv.Itoa(len(r.Body))) {
				t.Fatalf("%q: Content-Length %q for %d bytes", body, values, len(r.Body))
			}
		}
		// Written back, the answer means the same.
		var back resolveRequest
		back.Outcome = "complete"
		back.Response = &struct {
			Status  int                 `json:"status"`
			Headers map[string][]string `json:"headers"`
			Body    string              `json:"body"`
		}{Status: r.Status, Headers: r.Header, Body: base64.StdEncoding.EncodeToString(r.Body)}
		again, err := json.Marshal(back)
		if err != nil {
			t.Fatal(err)
		}
		res2, _, err := resolve(again)
		if err != nil || !reflect.DeepEqual(normal(res2), normal(res)) {
			t.Fatalf("%q: written back as %s, parses to %+v, %v; want %+v", body, again, res2.Response, err, r)
		}
	})
}

func resolve(body []byte) (ledger.Resolution, int, error) {
	r := httptest.NewRequest(http.MethodPost, "/idempotency/jobs/x/resolve", bytes.NewReader(body))
	return parseResolution(httptest.NewRecorder(), r)
}

// normal makes empty and nil bodies and headers compare equal.
func normal(r ledger.Resolution) ledger.Resolution {
	if r.Response != nil {
		c := *r.Response
		if len(c.Body) == 0 {
			c.Body = nil
		}
		if len(c.Header) == 0 {
			c.Header = nil
		}
		r.Response = &c
	}
	return r
}

// FuzzParseJobQuery feeds arbitrary query strings to the listing's
// parser. It must never panic; an error has a message; an accepted query
// holds a valid state, a limit within bounds and a canonical job id as its
// cursor, and parses again to itself when written back as a query string.
func FuzzParseJobQuery(f *testing.F) {
	for _, s := range []string{
		"",
		"state=unknown&provider=primary&limit=20",
		"state=completed&before=01234567-89ab-7def-8123-456789abcdef",
		"before=01234567-89AB-7DEF-8123-456789ABCDEF",
		"before={01234567-89ab-7def-8123-456789abcdef}",
		"before=urn:uuid:01234567-89ab-7def-8123-456789abcdef",
		"before=0123456789ab7def8123456789abcdef",
		"state=bogus",
		"state=Completed",
		"limit=0",
		"limit=1000",
		"limit=1001",
		"limit=-1",
		"limit=+5",
		"limit=1e3",
		"limit=99999999999999999999",
		"state=&limit=&before=&provider=",
		"provider=a%00b&provider=c",
		"state=failed&state=pending",
		"%zz=1&limit=2",
		"limit=2;state=failed",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		v, _ := url.ParseQuery(raw) // what parses is what the handler sees
		q, err := parseJobQuery(v)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("%q: empty error", raw)
			}
			return
		}
		if q.State != "" && !q.State.Valid() {
			t.Fatalf("%q: state %q accepted", raw, q.State)
		}
		if q.Limit < 0 || q.Limit > ledger.MaxLimit || (q.Limit == 0 && v.Get("limit") != "") {
			t.Fatalf("%q: limit %d accepted", raw, q.Limit)
		}
		if q.Before != "" {
			id, err := uuid.Parse(q.Before)
			if err != nil || id.String() != q.Before {
				t.Fatalf("%q: cursor %q is not a canonical job id", raw, q.Before)
			}
		}
		if q.Provider != v.Get("provider") {
			t.Fatalf("%q: provider %q, the query has %q", raw, q.Provider, v.Get("provider"))
		}
		back := url.Values{}
		if q.State != "" {
			back.Set("state", string(q.State))
		}
		if q.Provider != "" {
			back.Set("provider", q.Provider)
		}
		if q.Limit != 0 {
			back.Set("limit", strconv.Itoa(q.Limit))
		}
		if q.Before != "" {
			back.Set("before", q.Before)
		}
		again, err := url.ParseQuery(back.Encode())
		if err != nil {
			t.Fatalf("%q: written back as %q: %v", raw, back.Encode(), err)
		}
		q2, err := parseJobQuery(again)
		if err != nil || q2 != q {
			t.Fatalf("%q: written back as %q, parses to %+v, %v; want %+v", raw, back.Encode(), q2, err, q)
		}
	})
}
