package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/onejob/onejob/ledger/memory"
)

// The middleware's own cost per request, in process, on the memory ledger,
// next to the same handler without it: go test -bench . -benchmem ./proxy
const (
	benchBody   = `{"amount":4200,"currency":"eur","customer":{"id":"cus_42","email":"a@example.com"},"items":[1,2,3]}`
	benchAnswer = `{"id":"ch_123","status":"succeeded","amount":4200,"currency":"eur"}`
)

var benchNext = HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	io.WriteString(w, benchAnswer)
	return nil
})

func benchMiddleware(b *testing.B) *Middleware {
	m, err := New(Config{Ledger: memory.New()})
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func benchRequest(key string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/charges", strings.NewReader(benchBody))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Authorization", "Bearer sk_test_bench")
	if key != "" {
		r.Header.Set("Idempotency-Key", key)
	}
	return r
}

// discard is a ResponseWriter that keeps nothing, cheaper than a recorder.
type discard struct {
	h      http.Header
	status int
}

func (d *discard) Header() http.Header {
	if d.h == nil {
		d.h = make(http.Header)
	}
	return d.h
}
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(code int)        { d.status = code }

func serveBench(b *testing.B, h func(w http.ResponseWriter, r *http.Request) error, key func() string) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			w := &discard{}
			if err := h(w, benchRequest(key())); err != nil {
				b.Error(err)
				return
			}
			if w.status != http.StatusOK {
				b.Errorf("status %d", w.status)
				return
			}
		}
	})
}

func BenchmarkPlain(b *testing.B) {
	serveBench(b, benchNext.ServeHTTP, func() string { return "" })
}

func BenchmarkFresh(b *testing.B) {
	m := benchMiddleware(b)
	var n atomic.Int64
	serveBench(b, func(w http.ResponseWriter, r *http.Request) error { return m.ServeHTTP(w, r, benchNext) },
		func() string { return "fresh-" + strconv.FormatInt(n.Add(1), 10) })
}

func BenchmarkReplay(b *testing.B) {
	m := benchMiddleware(b)
	var n atomic.Int64
	serveBench(b, func(w http.ResponseWriter, r *http.Request) error { return m.ServeHTTP(w, r, benchNext) },
		func() string { return "replay-" + strconv.FormatInt(n.Add(1)%64, 10) })
}
