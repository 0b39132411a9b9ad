package sealed_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
	"github.com/onejob/onejob/ledger/memory"
	"github.com/onejob/onejob/ledger/sealed"
)

func key(t *testing.T, id string) sealed.Key {
	b := make([]byte, sealed.KeySize)
	rand.Read(b)
	k, err := sealed.ParseKey(id, base64.StdEncoding.EncodeToString(b))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyring(t *testing.T, keys ...sealed.Key) *sealed.Keyring {
	k, err := sealed.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// The whole conformance suite passes through the decorator.
func TestConformance(t *testing.T) {
	keys := keyring(t, key(t, "k1"))
	ledgertest.Run(t, ledgertest.Harness{
		New:  func(t *testing.T) ledger.Ledger { return sealed.New(memory.New(), keys) },
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
	ledgertest.RunPurge(t, ledgertest.Harness{
		New:  func(t *testing.T) ledger.Ledger { return sealed.New(memory.New(), keys) },
		Peer: func(_ *testing.T, l ledger.Ledger) ledger.Ledger { return l },
	})
}

func TestParseKey(t *testing.T) {
	raw := bytes.Repeat([]byte{7}, sealed.KeySize)
	for _, enc := range []string{base64.StdEncoding.EncodeToString(raw), base64.RawStdEncoding.EncodeToString(raw), " " + base64.StdEncoding.EncodeToString(raw) + "\n"} {
		if k, err := sealed.ParseKey("a.b-c_1", enc); err != nil || !bytes.Equal(k.Secret, raw) {
			t.Errorf("ParseKey(%q): %v", enc, err)
		}
	}
	for _, tc := range []struct{ id, key, want string }{
		{"", base64.StdEncoding.EncodeToString(raw), "want 1 to 64 characters"},
		{strings.Repeat("x", 65), base64.StdEncoding.EncodeToString(raw), "want 1 to 64 characters"},
		{"a b", base64.StdEncoding.EncodeToString(raw), "want letters, digits"},
		{"a:b", base64.StdEncoding.EncodeToString(raw), "want letters, digits"},
		{"k", base64.StdEncoding.EncodeToString(raw[:16]), "is 16 bytes, want 32"},
		{"k", "not base64!", "is not base64"},
	} {
		if _, err := sealed.ParseKey(tc.id, tc.key); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseKey(%q, %q): %v, want %q", tc.id, tc.key, err, tc.want)
		}
	}
	if _, err := sealed.NewKeyring(); err == nil {
		t.Error("a keyring of no key")
	}
	if _, err := sealed.NewKeyring(sealed.Key{ID: "k", Secret: raw[:8]}); err == nil {
		t.Error("a keyring of a short key")
	}
}

func TestSealOpen(t *testing.T) {
	k := keyring(t, key(t, "k1"))
	r := &ledger.Response{Status: 200, Header: map[string][]string{"A": {"1", "2"}, "B": {""}}, Body: []byte("secret"), Size: 6, Stored: true}
	s, err := k.SealResponse("job-1", r)
	if err != nil {
		t.Fatal(err)
	}
	if !sealed.Sealed(s) || bytes.Contains(s.Body, []byte("secret")) || len(s.Header) != 1 || s.Status != 200 || s.Size != 6 || !s.Stored {
		t.Fatalf("sealed: %+v", s)
	}
	if r.Header["A"][0] != "1" || string(r.Body) != "secret" {
		t.Fatal("sealing changed its argument")
	}
	o, err := k.OpenResponse("job-1", s)
	if err != nil || string(o.Body) != "secret" || len(o.Header) != 2 || o.Header["A"][1] != "2" || o.Size != 6 {
		t.Fatalf("opened: %+v, %v", o, err)
	}
	// Two seals of one answer differ (a fresh nonce each).
	s2, _ := k.SealResponse("job-1", r)
	if bytes.Equal(s.Body, s2.Body) {
		t.Error("two seals are equal")
	}
	// Bound to the job: moved to another, it does not open.
	if _, err := k.OpenResponse("job-2", s); !errors.Is(err, sealed.ErrOpen) {
		t.Errorf("opened under another job: %v", err)
	}
	// Altered, it does not open.
	bad := *s
	bad.Body = bytes.Clone(s.Body)
	bad.Body[len(bad.Body)-1] ^= 1
	if _, err := k.OpenResponse("job-1", &bad); !errors.Is(err, sealed.ErrOpen) {
		t.Errorf("altered body: %v", err)
	}
	// The header's seal does not open as the body's.
	hv := s.Header[sealed.HeaderName][0]
	swapped := &ledger.Response{Body: []byte("\x00onejob:sealed:1:" + strings.TrimPrefix(hv, "1:")), Stored: true}
	if _, err := k.OpenResponse("job-1", swapped); err == nil {
		t.Error("a header's seal opened as a body")
	}
	// Answers in clear, and empty ones, pass as they are.
	for _, plain := range []*ledger.Response{
		{Status: 204},
		{Status: 200, Header: map[string][]string{sealed.HeaderName: {"not sealed"}}, Body: []byte("x"), Stored: true},
		{Status: 200, Header: map[string][]string{sealed.HeaderName: {"1:k1:x"}, "Other": {"y"}}},
		nil,
	} {
		if o, err := k.OpenResponse("job-1", plain); err != nil || o != plain {
			t.Errorf("answer in clear %+v: %+v, %v", plain, o, err)
		}
	}
	e, _ := k.SealResponse("job-1", &ledger.Response{Status: 204})
	if sealed.Sealed(e) || e.Body != nil || e.Header != nil {
		t.Errorf("an empty answer sealed: %+v", e)
	}
}

// A compare-and-swap lost to an answer sealed with a key this instance
// lacks is still lost: the loser learns that another answer won, without
// it (it cannot open it), never an error that would let it pass its own
// answer off as the job's.
func TestLostToAnswerItCannotOpen(t *testing.T) {
	shared := memory.New()
	a := sealed.New(shared, keyring(t, key(t, "a")))
	b := sealed.New(shared, keyring(t, key(t, "b")))
	ctx := context.Background()
	p := ledger.ReserveParams{JobID: ledger.NewID(), OwnerHash: []byte("o"), KeyHash: []byte("k"), Fingerprint: []byte("f"),
		FingerprintVersion: 1, Retention: time.Hour, Attempt: ledger.NewAttempt("primary", time.Minute)}
	r, err := a.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	hedge, err := a.Hedge(ctx, r.Attempt.Ref(), ledger.NewAttempt("fallback", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	answer := func(body string) ledger.Response {
		return ledger.Response{Status: 201, Body: []byte(body), Size: int64(len(body)), Stored: true}
	}
	if c, err := a.Complete(ctx, r.Attempt.Ref(), answer("a's")); err != nil || !c.Won {
		t.Fatalf("a: won %v, %v", c.Won, err)
	}
	c, err := b.Complete(ctx, hedge.Ref(), answer("b's"))
	if err != nil || c.Won || c.Job == nil || c.Job.CompletedBy != r.Attempt.ID || c.Job.Response != nil {
		t.Fatalf("b, which cannot open a's answer: %+v, %v; want lost to %s, without the answer", c, err, r.Attempt.ID)
	}
}
