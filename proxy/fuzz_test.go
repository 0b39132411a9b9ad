package proxy

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onejob/onejob/ledger"
)

// keySeeds are header values worth mutating: bare and quoted keys, every
// escape, the edges of the length and character range, and broken quoting.
var keySeeds = []string{
	"abc",
	"8e03978e-40d5-43e8-bc93-6894a57f9324",
	`"abc"`,
	`"a\"b"`,
	`"a\\b"`,
	`"\"\\"`,
	`a"b`,
	`abc"`,
	`"abc`,
	`"`,
	`""`,
	`"a\b"`,
	`"ab"c`,
	"a b",
	"a\tb",
	"a\r\nb",
	"a\x00b",
	"caf\u00e9",
	"\"caf\u00e9\"",
	"a\x7fb",
	"!",
	"~",
	strings.Repeat("k", MaxKeyLength),
	strings.Repeat("k", MaxKeyLength+1),
	`"` + strings.Repeat(`\"`, MaxKeyLength) + `"`,
	`"` + strings.Repeat(`\\`, MaxKeyLength+1) + `"`,
	"",
}

// FuzzParseKey checks ParseKey against the grammar written out again
// (referenceKey): it does not panic, accepts exactly what the grammar
// accepts with the same result, returns one of its own errors and no key
// with an error, and the RFC 8941 string of an accepted key parses back to
// that key (as does the key itself, when it does not start with a quote).
func FuzzParseKey(f *testing.F) {
	for _, s := range keySeeds {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		got, err := ParseKey(v)
		want, ok := referenceKey(v)
		if err != nil {
			if ok {
				t.Fatalf("ParseKey(%q) = %v; the grammar gives %q", v, err, want)
			}
			if got != "" {
				t.Fatalf("ParseKey(%q) returned %q with its error %v", v, got, err)
			}
			if !errors.Is(err, errKeyEmpty) && !errors.Is(err, errKeyLong) &&
				!errors.Is(err, errKeyChars) && !errors.Is(err, errKeyQuoting) {
				t.Fatalf("ParseKey(%q): error %v is none of the key errors", v, err)
			}
			return
		}
		if !ok || got != want {
			t.Fatalf("ParseKey(%q) = %q; the grammar gives %q, %v", v, got, want, ok)
		}
		if len(got) < 1 || len(got) > MaxKeyLength {
			t.Fatalf("ParseKey(%q) = %q: %d bytes", v, got, len(got))
		}
		for i := 0; i < len(got); i++ {
			if got[i] < 0x21 || got[i] > 0x7e {
				t.Fatalf("ParseKey(%q) = %q: byte %#x is not visible ASCII", v, got, got[i])
			}
		}
		if again, err := ParseKey(quoteKey(got)); err != nil || again != got {
			t.Fatalf("the quoted form %q of %q parses to %q, %v", quoteKey(got), got, again, err)
		}
		if got[0] != '"' {
			if again, err := ParseKey(got); err != nil || again != got {
				t.Fatalf("the bare key %q parses to %q, %v", got, again, err)
			}
		}
	})
}

// referenceKey is the key grammar of docs/contract.md (section 4,
// "Keys") written the long way: a
// value that starts with DQUOTE is an RFC 8941 sf-string, whose content is
// the key; anything else is the key as is; the key is 1-255 bytes of
// %x21-7E.
func referenceKey(v string) (string, bool) {
	key := v
	if strings.HasPrefix(v, `"`) {
		if len(v) < 2 || !strings.HasSuffix(v, `"`) {
			return "", false
		}
		var b strings.Builder
		escaped := false
		for _, c := range []byte(v[1 : len(v)-1]) {
			switch {
			case escaped:
				if c != '"' && c != '\\' {
					return "", false
				}
				b.WriteByte(c)
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"' || c < 0x20 || c > 0x7e:
				return "", false
			default:
				b.WriteByte(c)
			}
		}
		if escaped {
			return "", false
		}
		key = b.String()
	}
	if len(key) == 0 || len(key) > MaxKeyLength {
		return "", false
	}
	for _, c := range []byte(key) {
		if c < 0x21 || c > 0x7e {
			return "", false
		}
	}
	return key, true
}

// quoteKey returns the RFC 8941 string of a key.
func quoteKey(k string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
}

// FuzzOwner checks how owners separate jobs, through the middleware: a
// request with no owner is refused (401) and nothing runs; two requests
// with one key and one body name one job when their owners are equal, and
// two jobs, each executed, when they differ; neither owner's retry sees
// the other's answer. The stored owner hashes are fixed-size digests that
// never equal a key's hash and never carry the owner in clear.
func FuzzOwner(f *testing.F) {
	for _, s := range [][2]string{
		{"Bearer alice", "Bearer bob"},
		{"Bearer alice", "Bearer alice"},
		{"Bearer alice", "bearer alice"},
		{"Bearer alice", "Bearer alice "},
		{"", "Bearer bob"},
		{"Bearer alice", ""},
		{"user:1", "authorization:1"},
		{"a\x00b", "a"},
		{"caf\u00e9", "cafe\u0301"},
		{"\xff\xfe", "\xfe\xff"},
		{strings.Repeat("x", 4096), strings.Repeat("x", 4095)},
	} {
		f.Add(s[0], s[1], "shared-key", []byte(nil))
		f.Add(s[0], s[1], `"shared-key"`, []byte("s3cret"))
	}
	f.Add("Bearer alice", "Bearer bob", "bad key", []byte(nil))
	f.Add("Bearer alice", "Bearer bob", "", []byte("s"))

	f.Fuzz(func(t *testing.T, ownerA, ownerB, key string, secret []byte) {
		hs := NewHasher(secret)
		for _, o := range []string{ownerA, ownerB} {
			h := hs.Owner(o)
			if len(h) != 32 || !bytes.Equal(h, NewHasher(secret).Owner(o)) {
				t.Fatalf("owner hash of %q: %x, not a deterministic SHA-256 size digest", o, h)
			}
			if bytes.Equal(h, hs.Key(o)) {
				t.Fatalf("owner %q and key %q hash alike", o, o)
			}
			if len(o) >= 8 && bytes.Contains(h, []byte(o)) {
				t.Fatalf("owner hash %x holds the owner %q", h, o)
			}
		}
		if (ownerA == ownerB) != bytes.Equal(hs.Owner(ownerA), hs.Owner(ownerB)) {
			t.Fatalf("owners %q and %q: equal %v, hashes equal %v", ownerA, ownerB, ownerA == ownerB, !(ownerA == ownerB))
		}

		h := newHarness(t, Config{OwnerSecret: secret}, nil)
		send := func(owner string) *httptest.ResponseRecorder {
			r := post("", `{"amount":1}`)
			r.Header[DefaultKeyHeader] = []string{key}
			if owner == "" {
				delete(r.Header, "Authorization")
			} else {
				r.Header["Authorization"] = []string{owner}
			}
			return h.do(r)
		}
		if _, err := ParseKey(key); err != nil {
			rec := send(ownerA)
			if ownerA != "" || rec.Code != http.StatusUnauthorized {
				wantProblem(t, rec, http.StatusBadRequest, ProblemKeyInvalid)
			}
			if h.up.calls() != 0 {
				t.Fatalf("a request with the invalid key %q was forwarded", key)
			}
			return
		}
		a := send(ownerA)
		if ownerA == "" {
			wantProblem(t, a, http.StatusUnauthorized, ProblemOwnerMissing)
			if h.up.calls() != 0 {
				t.Fatal("a request with no owner was forwarded")
			}
			if page, err := h.l.Jobs(context.Background(), ledger.JobQuery{}); err != nil || len(page.Jobs) != 0 {
				t.Fatalf("a request with no owner left jobs %v, %v", page.Jobs, err)
			}
			return
		}
		h.waitRun()
		if a.Code != http.StatusCreated || a.Header().Get(HeaderReplayed) != "" {
			t.Fatalf("owner %q: status %d, replayed %q", ownerA, a.Code, a.Header().Get(HeaderReplayed))
		}
		b := send(ownerB)
		switch {
		case ownerB == "":
			wantProblem(t, b, http.StatusUnauthorized, ProblemOwnerMissing)
		case ownerB == ownerA:
			if b.Header().Get(HeaderReplayed) != "true" || b.Body.String() != a.Body.String() || jobID(t, a) != jobID(t, b) {
				t.Fatalf("one owner %q: the retry is not a replay of the first answer: %d %s", ownerA, b.Code, b.Body)
			}
		default:
			h.waitRun()
			if b.Code != http.StatusCreated || b.Header().Get(HeaderReplayed) != "" ||
				b.Body.String() == a.Body.String() || jobID(t, a) == jobID(t, b) {
				t.Fatalf("owners %q and %q share a job: %d %s / %s", ownerA, ownerB, b.Code, b.Body, a.Body)
			}
			if again := send(ownerB); again.Body.String() != b.Body.String() || again.Header().Get(HeaderReplayed) != "true" {
				t.Fatalf("owner %q's retry got %d %s", ownerB, again.Code, again.Body)
			}
		}
		if again := send(ownerA); again.Body.String() != a.Body.String() || again.Header().Get(HeaderReplayed) != "true" {
			t.Fatalf("owner %q's retry got %d %s", ownerA, again.Code, again.Body)
		}
		want := 1
		if ownerB != "" && ownerB != ownerA {
			want = 2
		}
		if h.up.calls() != want {
			t.Fatalf("upstream called %d times, want %d", h.up.calls(), want)
		}
		page, err := h.l.Jobs(context.Background(), ledger.JobQuery{})
		if err != nil || len(page.Jobs) != want {
			t.Fatalf("%d jobs (%v), want %d", len(page.Jobs), err, want)
		}
		for _, j := range page.Jobs {
			if !bytes.Equal(j.OwnerHash, hs.Owner(ownerA)) && !bytes.Equal(j.OwnerHash, hs.Owner(ownerB)) {
				t.Fatalf("job %s has owner hash %x, neither owner's", j.ID, j.OwnerHash)
			}
		}
	})
}
