package ledgertest

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/sealed"
)

// Dump returns what an operator reads of a ledger's store (its database
// rows, its keys, its file's bytes): everything that could hold an answer.
type Dump func(t *testing.T, l ledger.Ledger) []byte

// RunSealed checks the ledger's answers at rest behind package sealed:
// dump, reading the store as an operator would, finds neither the
// plaintext of a sealed header nor of a sealed body (a completed answer,
// a streamed one, an operator's), but does find an answer stored in clear
// (so the dump does read the answers); every read through sealed returns
// the answers byte for byte, on the ledger and on a peer; and keys rotate:
// an answer opens by the key id it carries, and not without that key.
func RunSealed(t *testing.T, h Harness, dump Dump) {
	k1, k2 := testKey(t, "k1"), testKey(t, "k2")
	raw := h.New(t)
	l := sealed.New(raw, ring(t, k1))
	secret := func(what string) string { return what + "-" + hex.EncodeToString(randBytes(8)) }
	answer := func() ledger.Response {
		body := secret("body")
		return ledger.Response{Status: 201, Body: []byte(body), Size: int64(len(body)), Stored: true,
			Header: map[string][]string{"X-Secret": {secret("header")}, "Content-Type": {"application/json"}}}
	}
	var secrets []string
	remember := func(r ledger.Response) {
		secrets = append(secrets, string(r.Body), r.Header["X-Secret"][0])
	}

	// A buffered answer.
	pA := params(long)
	a := reserve(t, l, pA, ledger.Created)
	ansA := answer()
	remember(ansA)
	if c, err := l.Complete(ctx(t), a.Attempt.Ref(), ansA); err != nil || !c.Won || !sameAnswer(c.Job.Response, &ansA) {
		t.Fatalf("Complete: %v, %+v", err, c)
	}
	// A streamed answer: headers first, then the body.
	pB := params(long)
	b := reserve(t, l, pB, ledger.Created)
	ansB := answer()
	remember(ansB)
	head := ansB
	head.Body, head.Size, head.Stored = nil, -1, false
	if c, err := l.Complete(ctx(t), b.Attempt.Ref(), head); err != nil || !c.Won {
		t.Fatalf("Complete headers: %v, %+v", err, c)
	}
	if err := l.SaveBody(ctx(t), b.Attempt.Ref(), ansB.Body, ansB.Size, true); err != nil {
		t.Fatal(err)
	}
	// An operator's answer.
	pC := params(long)
	c := reserve(t, l, pC, ledger.Created)
	ansC := answer()
	remember(ansC)
	if j, err := l.Resolve(ctx(t), c.Job.ID, ledger.Resolution{Response: &ansC, AttemptID: ledger.NewID()}); err != nil || !sameAnswer(j.Response, &ansC) {
		t.Fatalf("Resolve: %v, %+v", err, j)
	}
	// An answer stored in clear, as before encryption was turned on.
	pPlain := params(long)
	plain := reserve(t, raw, pPlain, ledger.Created)
	ansPlain := answer()
	if _, err := raw.Complete(ctx(t), plain.Attempt.Ref(), ansPlain); err != nil {
		t.Fatal(err)
	}

	d := dump(t, raw)
	for _, s := range []string{string(ansPlain.Body), ansPlain.Header["X-Secret"][0]} {
		if !contains(d, s) {
			t.Fatalf("the dump does not show the answer stored in clear (%q): it does not read the answers", s)
		}
	}
	for _, s := range secrets {
		if contains(d, s) {
			t.Errorf("the store holds %q in clear", s)
		}
	}

	// Every read opens the answers, byte for byte, here and on a peer.
	want := map[string]*ledger.Response{a.Job.ID: &ansA, b.Job.ID: &ansB, c.Job.ID: &ansC, plain.Job.ID: &ansPlain}
	for _, x := range []ledger.Ledger{l, sealed.New(h.Peer(t, raw), ring(t, k1))} {
		for i, p := range []ledger.ReserveParams{pA, pB, pC, pPlain} {
			r := reserve(t, x, p, ledger.Done)
			if w := want[r.Job.ID]; !sameAnswer(r.Job.Response, w) {
				t.Errorf("replay %d: %+v, want %+v", i, r.Job.Response, w)
			}
			f := find(t, x, p)
			if w := want[f.ID]; !sameAnswer(f.Response, w) {
				t.Errorf("Find %d: %+v, want %+v", i, f.Response, w)
			}
		}
		for id, w := range want {
			if j := job(t, x, id); !sameAnswer(j.Response, w) {
				t.Errorf("Job %s: %+v, want %+v", id, j.Response, w)
			}
			j, err := x.Wait(ctx(t), id)
			if err != nil || !sameAnswer(j.Response, w) {
				t.Errorf("Wait %s: %v, %+v", id, err, j)
			}
		}
		page, err := x.Jobs(ctx(t), ledger.JobQuery{Limit: ledger.MaxLimit})
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range page.Jobs {
			if w := want[j.ID]; w != nil && j.Response != nil && len(j.Response.Body) > 0 && !sameAnswer(j.Response, w) {
				t.Errorf("Jobs %s: %+v", j.ID, j.Response)
			}
		}
	}

	// Rotation: k2 seals, k1 still opens what it sealed.
	rotated := sealed.New(raw, ring(t, k2, k1))
	pD := params(long)
	dj := reserve(t, rotated, pD, ledger.Created)
	ansD := answer()
	if _, err := rotated.Complete(ctx(t), dj.Attempt.Ref(), ansD); err != nil {
		t.Fatal(err)
	}
	for p, w := range map[*ledger.ReserveParams]*ledger.Response{&pA: &ansA, &pD: &ansD} {
		if r := reserve(t, rotated, *p, ledger.Done); !sameAnswer(r.Job.Response, w) {
			t.Errorf("after rotation: %+v, want %+v", r.Job.Response, w)
		}
	}
	if _, err := l.Job(ctx(t), dj.Job.ID); !errors.Is(err, sealed.ErrUnknownKey) {
		t.Errorf("reading k2's answer with k1 alone: %v, want ErrUnknownKey", err)
	}
	if _, err := sealed.New(raw, ring(t, k2)).Job(ctx(t), a.Job.ID); !errors.Is(err, sealed.ErrUnknownKey) {
		t.Errorf("reading k1's answer once k1 is gone: %v, want ErrUnknownKey", err)
	}
	if _, err := sealed.New(raw, ring(t, sealed.Key{ID: "k1", Secret: k2.Secret})).Job(ctx(t), a.Job.ID); !errors.Is(err, sealed.ErrOpen) {
		t.Errorf("reading with another key under k1's id: %v, want ErrOpen", err)
	}
}

func testKey(t *testing.T, id string) sealed.Key {
	k, err := sealed.ParseKey(id, base64.StdEncoding.EncodeToString(randBytes(sealed.KeySize)))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func ring(t *testing.T, keys ...sealed.Key) *sealed.Keyring {
	r, err := sealed.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// contains reports whether d holds s as bytes, or in hex (as PostgreSQL
// shows bytea).
func contains(d []byte, s string) bool {
	return bytes.Contains(d, []byte(s)) || bytes.Contains(bytes.ToLower(d), []byte(hex.EncodeToString([]byte(s))))
}

// sameAnswer reports whether got is want, byte for byte.
func sameAnswer(got, want *ledger.Response) bool {
	if got == nil || want == nil {
		return got == want
	}
	return got.Status == want.Status && bytes.Equal(got.Body, want.Body) && got.Size == want.Size &&
		got.Stored == want.Stored && fmt.Sprint(got.Header) == fmt.Sprint(want.Header) && reflect.DeepEqual(got.Header, want.Header)
}

// DirBytes returns the bytes of every file in dir, one after another: what
// an operator with the disk sees of a file ledger.
func DirBytes(t testing.TB, dir string) []byte {
	t.Helper()
	names, err := filepath.Glob(filepath.Join(dir, "*"))
	if err != nil || len(names) == 0 {
		t.Fatalf("the files of %s: %v %v", dir, names, err)
	}
	var all []byte
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, b...)
	}
	return all
}
