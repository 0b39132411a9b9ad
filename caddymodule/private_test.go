package caddymodule

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/onejob/onejob/ledger/ledgertest"
)

func newKey(t *testing.T) string {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return base64.StdEncoding.EncodeToString(b)
}

func TestUnmarshalPrivacy(t *testing.T) {
	k1, k2 := newKey(t), newKey(t)
	in := "idempotency {\n\tnever_store X-Csrf-Token x-signature\n\tencryption {\n\t\tkey k2 " + k2 +
		"\n\t\tkey k1 {env.ONEJOB_KEY}\n\t}\n}"
	var h Handler
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"never_store":["X-Csrf-Token","x-signature"],"encryption":{"keys":[{"id":"k2","key":"` + k2 +
		`"},{"id":"k1","key":"{env.ONEJOB_KEY}"}]}}`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}

	for _, tc := range []struct{ name, in, want string }{
		{"never_store empty", "idempotency {\n\tnever_store\n}", "wrong argument count"},
		{"never_store not a name", "idempotency {\n\tnever_store X:A\n}", `invalid header name "X:A", at Testfile:2`},
		{"never_store the gateway's", "idempotency {\n\tnever_store idempotency-job-id\n}", "Idempotency-Job-Id is the gateway's own header, never stored, at Testfile:2"},
		{"encryption argument", "idempotency {\n\tencryption on\n}", "usage: encryption { key <id> <base64 key> ... }, at Testfile:2"},
		{"encryption empty", "idempotency {\n\tencryption {\n\t}\n}", "encryption: needs at least one key"},
		{"encryption unknown", "idempotency {\n\tencryption {\n\t\tcipher aes\n\t}\n}", `encryption: unknown "cipher", want key <id> <base64 key>, at Testfile:3`},
		{"key one arg", "idempotency {\n\tencryption {\n\t\tkey k1\n\t}\n}", "usage: key <id> <base64 key>, at Testfile:3"},
		{"key short", "idempotency {\n\tencryption {\n\t\tkey k1 c2hvcnQ=\n\t}\n}", `key "k1" is 5 bytes, want 32 (openssl rand -base64 32), at Testfile:3`},
		{"key not base64", "idempotency {\n\tencryption {\n\t\tkey k1 !!!\n\t}\n}", `key "k1" is not base64: illegal base64 data at input byte 0, at Testfile:3`},
		{"key id bad", "idempotency {\n\tencryption {\n\t\tkey a:b {env.K}\n\t}\n}", `key id "a:b": want letters, digits, '-', '_' or '.', at Testfile:3`},
		{"key id twice", "idempotency {\n\tencryption {\n\t\tkey k1 " + k1 + "\n\t\tkey k1 " + k2 + "\n\t}\n}", `key id "k1" is given twice, at Testfile:4`},
		{"encryption twice", "idempotency {\n\tencryption {\n\t\tkey k1 " + k1 + "\n\t}\n\tencryption {\n\t\tkey k2 " + k2 + "\n\t}\n}", `duplicate subdirective "encryption", at Testfile:5`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// provisioned returns a handler of cfg (JSON), provisioned, and cleans it
// up at the end of the test.
func provisioned(t *testing.T, cfg string) (*Handler, error) {
	t.Helper()
	ctx, _ := configContext(t)
	h := new(Handler)
	if err := json.Unmarshal([]byte(cfg), h); err != nil {
		t.Fatal(err)
	}
	err := h.Provision(ctx)
	t.Cleanup(func() { h.Cleanup() })
	return h, err
}

func TestEncryptionKeysAtProvision(t *testing.T) {
	t.Setenv("ONEJOB_TEST_SHORT", "c2hvcnQ=")
	for _, tc := range []struct{ keys, want string }{
		{`[]`, "encryption: needs at least one key"},
		{`[{"id":"k1","key":"{env.ONEJOB_TEST_UNSET}"}]`, `encryption: key "k1" is empty (is its placeholder set?)`},
		{`[{"id":"k1","key":"{env.ONEJOB_TEST_SHORT}"}]`, `key "k1" is 5 bytes, want 32`},
		{`[{"id":"","key":"` + newKey(t) + `"}]`, `key id "": want 1 to 64 characters`},
		{`[{"id":"a","key":"` + newKey(t) + `"},{"id":"a","key":"` + newKey(t) + `"}]`, `key id "a" is given twice`},
	} {
		_, err := provisioned(t, `{"ledger":{"backend":"memory"},"encryption":{"keys":`+tc.keys+`}}`)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("keys %s: %v, want %q", tc.keys, err, tc.want)
		}
	}
	if _, err := provisioned(t, `{"ledger":{"backend":"memory"},"never_store":["Bad Name"]}`); err == nil || !strings.Contains(err.Error(), "never_store") {
		t.Errorf("never_store: %v", err)
	}
}

// TestPrivateAnswers runs a handler with a file ledger, encryption (its key
// from the environment) and never_store: the first client gets every
// header, replays are byte-identical without the private ones, the file
// holds neither the body nor the headers in clear, an operator's answer
// is sealed too, and a purge through the admin API makes the key a new
// intent.
func TestPrivateAnswers(t *testing.T) {
	t.Setenv("ONEJOB_TEST_KEY", newKey(t))
	path := filepath.Join(t.TempDir(), "ledger.db")
	h, err := provisioned(t, `{"ledger":{"backend":"file","path":"`+path+`"},"never_store":["X-Signature"],
		"encryption":{"keys":[{"id":"2026","key":"{env.ONEJOB_TEST_KEY}"}]}}`)
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
		calls++
		w.Header().Set("Set-Cookie", "session=cookie-secret")
		w.Header().Set("X-Signature", "signature-secret")
		w.Header().Set("X-Order", "header-secret")
		w.WriteHeader(http.StatusCreated)
		_, err := w.Write([]byte(`{"card":"body-secret"}`))
		return err
	})
	send := func(key string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(`{}`))
		r.Header.Set("Authorization", "Bearer alice")
		r.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		if err := h.ServeHTTP(w, r, next); err != nil {
			t.Fatal(err)
		}
		return w
	}
	first := send("k1")
	if first.Code != http.StatusCreated || first.Header().Get("Set-Cookie") != "session=cookie-secret" ||
		first.Header().Get("X-Signature") != "signature-secret" {
		t.Fatalf("first answer %d %v", first.Code, first.Header())
	}
	for range 2 {
		retry := send("k1")
		if retry.Header().Get("Idempotent-Replayed") != "true" || !bytes.Equal(retry.Body.Bytes(), first.Body.Bytes()) ||
			retry.Code != first.Code || retry.Header().Get("X-Order") != "header-secret" {
			t.Fatalf("replay %d %v %q", retry.Code, retry.Header(), retry.Body)
		}
		if v := retry.Header().Values("Set-Cookie"); v != nil {
			t.Errorf("Set-Cookie replayed: %q", v)
		}
		if v := retry.Header().Values("X-Signature"); v != nil {
			t.Errorf("X-Signature replayed: %q", v)
		}
	}
	if calls != 1 {
		t.Fatalf("provider called %d times", calls)
	}

	// An operator completes an unknown job: its answer is sealed too.
	l := h.mw.Config().Ledger
	r, err := l.Reserve(context.Background(), params("op", "primary").WithNewIDs())
	if err != nil {
		t.Fatal(err)
	}
	if err := l.MarkUnknown(context.Background(), r.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	mux := adminMux(t)
	body := base64.StdEncoding.EncodeToString([]byte("operator-secret"))
	if w := do(t, mux, http.MethodPost, adminJobsPath+"/"+r.Job.ID+"/resolve",
		`{"outcome":"complete","response":{"status":200,"headers":{"X-Op":["op-header-secret"]},"body":"`+body+`"}}`); w.Code != http.StatusOK {
		t.Fatalf("resolve: %d %s", w.Code, w.Body)
	}
	if j, err := l.Job(context.Background(), r.Job.ID); err != nil || string(j.Response.Body) != "operator-secret" ||
		j.Response.Header["X-Op"][0] != "op-header-secret" || j.Response.Size != int64(len("operator-secret")) {
		t.Fatalf("operator's answer read back: %v %+v", err, j)
	}

	raw := ledgertest.DirBytes(t, path)
	for _, s := range []string{"body-secret", "header-secret", "cookie-secret", "signature-secret", "operator-secret", "op-header-secret"} {
		if bytes.Contains(raw, []byte(s)) {
			t.Errorf("the ledger file holds %q in clear", s)
		}
	}
	if !bytes.Contains(raw, []byte("onejob:sealed:1:2026:")) {
		t.Error("the ledger file holds no answer sealed with key 2026")
	}

	// A purge by owner, as the handler resolves it: the key is new again.
	w := do(t, mux, http.MethodPost, adminPurgePath, `{"owner":"authorization:Bearer alice"}`)
	out := decode[purgeJSON](t, w, http.StatusOK)
	if out.Removed != 1 || out.Kept != 0 || out.Ledgers != 1 {
		t.Errorf("purge: %+v", out)
	}
	if again := send("k1"); again.Header().Get("Idempotent-Replayed") != "" || calls != 2 {
		t.Errorf("after the purge: replayed %q, provider called %d times", again.Header().Get("Idempotent-Replayed"), calls)
	}
	for _, tc := range []struct{ body, want string }{
		{`{}`, `"owner" is required`},
		{`{"owner":"a","x":1}`, "unknown field"},
		{`{"owner":"a"} {}`, "trailing data"},
	} {
		w := do(t, mux, http.MethodPost, adminPurgePath, tc.body)
		if p := wantProblem(t, w, http.StatusBadRequest, problemInvalidRequest); !strings.Contains(p.Detail, tc.want) {
			t.Errorf("%s: %q, want %q", tc.body, p.Detail, tc.want)
		}
	}
	if w := do(t, mux, http.MethodGet, adminPurgePath, ""); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET purge: %d", w.Code)
	}
}
