package fingerprint

import (
	"testing"
)

// benchBody is the body of the proxy's own benchmarks.
const benchBody = `{"amount":4200,"currency":"eur","customer":{"id":"cus_42","email":"a@example.com"},"items":[1,2,3]}`

func BenchmarkCanonicalJSON(b *testing.B) {
	body := []byte(benchBody)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := CanonicalJSON(body); !ok {
			b.Fatal("not canonical")
		}
	}
}
