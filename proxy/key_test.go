package proxy

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLength)
	tests := []struct {
		name string
		in   string
		want string
		err  error // nil: valid
	}{
		// Bare values, as Stripe sends them, are taken as is.
		{name: "bare", in: "abc", want: "abc"},
		{name: "bare uuid", in: "8e03978e-40d5-43e8-bc93-6894a57f9324", want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{name: "bare lowest visible", in: "!", want: "!"},
		{name: "bare highest visible", in: "~", want: "~"},
		{name: "bare with inner quote", in: `a"b`, want: `a"b`},
		{name: "bare with trailing quote", in: `abc"`, want: `abc"`},
		{name: "bare with backslash", in: `a\b`, want: `a\b`},
		{name: "bare 255 bytes", in: long, want: long},

		// RFC 8941 strings mean their unescaped content.
		{name: "quoted", in: `"abc"`, want: "abc"},
		{name: "quoted escaped quote", in: `"a\"b"`, want: `a"b`},
		{name: "quoted escaped backslash", in: `"a\\b"`, want: `a\b`},
		{name: "quoted only escapes", in: `"\"\\"`, want: `"\`},
		{name: "quoted 255 bytes", in: `"` + long + `"`, want: long},
		{name: "quoted 255 escaped bytes", in: `"` + strings.Repeat(`\"`, MaxKeyLength) + `"`, want: strings.Repeat(`"`, MaxKeyLength)},

		// Quoting errors.
		{name: "invalid escape", in: `"a\b"`, err: errKeyQuoting},
		{name: "escaped letter n", in: `"a\nb"`, err: errKeyQuoting},
		{name: "unterminated", in: `"abc`, err: errKeyQuoting},
		{name: "lone quote", in: `"`, err: errKeyQuoting},
		{name: "escaped closing quote", in: `"abc\"`, err: errKeyQuoting},
		{name: "trailing backslash", in: `"abc\`, err: errKeyQuoting},
		{name: "unescaped inner quote", in: `"a"b"`, err: errKeyQuoting},
		{name: "content after closing quote", in: `"ab"c`, err: errKeyQuoting},
		{name: "quoted tab", in: "\"a\tb\"", err: errKeyQuoting},
		{name: "quoted DEL", in: "\"a\x7fb\"", err: errKeyQuoting},
		{name: "quoted non-ASCII", in: "\"caf\u00e9\"", err: errKeyQuoting},

		// Empty.
		{name: "empty", in: "", err: errKeyEmpty},
		{name: "empty quoted", in: `""`, err: errKeyEmpty},

		// Length, counted after unquoting.
		{name: "bare 256 bytes", in: long + "k", err: errKeyLong},
		{name: "quoted 256 bytes", in: `"` + long + `k"`, err: errKeyLong},
		{name: "quoted 256 escaped bytes", in: `"` + strings.Repeat(`\\`, MaxKeyLength+1) + `"`, err: errKeyLong},

		// Only visible ASCII, after unquoting.
		{name: "space", in: "a b", err: errKeyChars},
		{name: "leading space", in: " abc", err: errKeyChars},
		{name: "quoted space", in: `"a b"`, err: errKeyChars},
		{name: "quoted only space", in: `" "`, err: errKeyChars},
		{name: "tab", in: "a\tb", err: errKeyChars},
		{name: "NUL", in: "a\x00b", err: errKeyChars},
		{name: "DEL", in: "a\x7fb", err: errKeyChars},
		{name: "non-ASCII", in: "caf\u00e9", err: errKeyChars},
		{name: "high byte", in: "a\xffb", err: errKeyChars},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseKey(tt.in)
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("ParseKey(%q) = %q, %v; want error %v", tt.in, got, err, tt.err)
				}
				if got != "" {
					t.Errorf("ParseKey(%q) returned %q with its error", tt.in, got)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseKey(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
			}
		})
	}
}

// A bare key and the RFC 8941 string of the same key are one key, so they
// hash alike and name one job.
func TestParseKeyBareAndQuotedAreOneKey(t *testing.T) {
	h := NewHasher(nil)
	for _, pair := range [][2]string{{"abc", `"abc"`}, {`a"b`, `"a\"b"`}, {`a\b`, `"a\\b"`}} {
		bare, err1 := ParseKey(pair[0])
		quoted, err2 := ParseKey(pair[1])
		if err1 != nil || err2 != nil {
			t.Fatalf("%q, %q: %v, %v", pair[0], pair[1], err1, err2)
		}
		if !bytes.Equal(h.Key(bare), h.Key(quoted)) {
			t.Errorf("%q and %q hash differently", pair[0], pair[1])
		}
	}
}

func TestHasherWithoutSecretIsSHA256(t *testing.T) {
	h := NewHasher(nil)
	wantOwner := sha256.Sum256([]byte("onejob-owner\x00alice"))
	wantKey := sha256.Sum256([]byte("onejob-key\x00k-1"))
	if got := h.Owner("alice"); !bytes.Equal(got, wantOwner[:]) {
		t.Errorf("Owner = %x, want %x", got, wantOwner)
	}
	if got := h.Key("k-1"); !bytes.Equal(got, wantKey[:]) {
		t.Errorf("Key = %x, want %x", got, wantKey)
	}
	// An empty secret is no secret.
	if !bytes.Equal(NewHasher([]byte{}).Owner("alice"), wantOwner[:]) {
		t.Error("an empty secret changed the hash")
	}
}

func TestHasherWithSecretIsHMAC(t *testing.T) {
	secret := []byte("s3cret")
	h := NewHasher(secret)
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("onejob-owner\x00alice"))
	if got, want := h.Owner("alice"), mac.Sum(nil); !bytes.Equal(got, want) {
		t.Errorf("Owner = %x, want HMAC %x", got, want)
	}
	mac = hmac.New(sha256.New, secret)
	mac.Write([]byte("onejob-key\x00k-1"))
	if got, want := h.Key("k-1"), mac.Sum(nil); !bytes.Equal(got, want) {
		t.Errorf("Key = %x, want HMAC %x", got, want)
	}
}

func TestHasherSeparation(t *testing.T) {
	plain, a, b := NewHasher(nil), NewHasher([]byte("a")), NewHasher([]byte("b"))
	if bytes.Equal(plain.Owner("x"), a.Owner("x")) {
		t.Error("a secret does not change the owner hash")
	}
	if bytes.Equal(a.Owner("x"), b.Owner("x")) || bytes.Equal(a.Key("x"), b.Key("x")) {
		t.Error("two secrets give the same hash")
	}
	if bytes.Equal(plain.Owner("x"), plain.Key("x")) || bytes.Equal(a.Owner("x"), a.Key("x")) {
		t.Error("an owner and a key with the same text hash alike")
	}
	if bytes.Equal(plain.Owner("x"), plain.Owner("y")) {
		t.Error("two owners hash alike")
	}
	if !bytes.Equal(a.Owner("x"), NewHasher([]byte("a")).Owner("x")) {
		t.Error("the same secret gives different hashes: instances would disagree")
	}
	if got := plain.Owner("Bearer token"); bytes.Contains(got, []byte("token")) || len(got) != sha256.Size {
		t.Errorf("owner hash %q is not a SHA-256 digest", got)
	}
}
