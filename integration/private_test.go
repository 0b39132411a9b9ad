//go:build integration

package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger/ledgertest"
)

// privateSite answers with a cookie, a header never_store names, an
// ordinary header and a body, each holding a value that must never be
// found in the ledger in clear.
const privateSite = `	idempotency {
		{ledger}
		never_store X-Signature
		encryption {
			key 2026-12 {env.ONEJOB_TEST_KEY}
		}
	}
	handle {
		header Set-Cookie "session=cookie-secret-value; HttpOnly"
		header X-Signature signature-secret-value
		header X-Order order-header-secret
		respond "{\"card\":\"body-secret-value\"}" 201
	}
`

var privateValues = []string{"cookie-secret-value", "signature-secret-value", "order-header-secret", "body-secret-value"}

// TestStoredAnswersPrivate: on every ledger, through the built binary,
// the first client gets Set-Cookie and the never_store header; the replay,
// read off the wire, is byte-identical in status and body, keeps the
// ordinary header and carries neither; the store, read as an operator
// would (the PostgreSQL jobs table, the Redis keys of the ledger and of
// the cache, the bbolt file), holds none of the values in clear; and a
// purge through the admin API makes the key a new intent.
func TestStoredAnswersPrivate(t *testing.T) {
	k := make([]byte, 32)
	rand.Read(k)
	t.Setenv("ONEJOB_TEST_KEY", base64.StdEncoding.EncodeToString(k))
	eachBackend(t, func(t *testing.T, b backend) {
		g := startGateway(t, b, privateSite)
		addr := strings.TrimPrefix(g.url, "http://")
		req := "POST /charges HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: " + auth +
			"\r\nIdempotency-Key: private-1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
		first, firstBody := rawExchange(t, addr, req)
		if first.StatusCode != http.StatusCreated || first.Header.Get("Set-Cookie") != "session=cookie-secret-value; HttpOnly" ||
			first.Header.Get("X-Signature") != "signature-secret-value" {
			t.Fatalf("first answer: %d %v", first.StatusCode, first.Header)
		}
		id := first.Header.Get("Idempotency-Job-Id")
		raw := rawReplay(t, addr, req)
		head, body, _ := strings.Cut(raw, "\r\n\r\n")
		if !strings.HasPrefix(head, "HTTP/1.1 201 ") || !strings.Contains(head, "Idempotent-Replayed: true") ||
			!strings.Contains(head, "X-Order: order-header-secret") || body != firstBody {
			t.Fatalf("replay:\n%s\nfirst body %q", raw, firstBody)
		}
		for _, line := range strings.Split(head, "\r\n")[1:] {
			name, _, _ := strings.Cut(line, ":")
			switch http.CanonicalHeaderKey(name) {
			case "Set-Cookie", "X-Signature":
				t.Errorf("the replay carries %s", line)
			}
		}

		if view := operatorView(t, g, b, id); view != nil {
			for _, v := range privateValues {
				if bytes.Contains(view, []byte(v)) || bytes.Contains(view, []byte(hex.EncodeToString([]byte(v)))) {
					t.Errorf("the ledger holds %q in clear", v)
				}
			}
			if !bytes.Contains(view, []byte("onejob:sealed:1:2026-12:")) && !bytes.Contains(view, []byte(hex.EncodeToString([]byte("onejob:sealed:1:2026-12:")))) {
				t.Errorf("the ledger holds no answer sealed with key 2026-12")
			}
		}

		status, out := g.adminCall(t, http.MethodPost, "/idempotency/purge", `{"owner":"authorization:`+auth+`"}`)
		var st struct{ Removed, Kept, Ledgers int }
		if err := json.Unmarshal([]byte(out), &st); status != http.StatusOK || err != nil || st.Removed != 1 || st.Kept != 0 || st.Ledgers != 1 {
			t.Fatalf("purge: %d %s", status, out)
		}
		again, _ := rawExchange(t, addr, req)
		if again.Header.Get("Idempotent-Replayed") != "" || again.Header.Get("Idempotency-Job-Id") == id ||
			again.Header.Get("Set-Cookie") == "" {
			t.Errorf("after the purge: %v", again.Header)
		}
	})
}

// operatorView returns the ledger's store as an operator reads it, or nil
// for the memory ledger (there is nothing else to read).
func operatorView(t *testing.T, g *gateway, b backend, id string) []byte {
	var view []byte
	add := func(_ string, data []byte) { view = append(view, data...) }
	switch {
	case b.name == "memory":
		return nil
	case b.schema != "":
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, postgresDSN(t))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		var row string
		if err := conn.QueryRow(ctx, "SELECT j::text FROM "+b.schema+".jobs j WHERE id = $1", id).Scan(&row); err != nil {
			t.Fatal(err)
		}
		view = []byte(row)
		if strings.Contains(b.line, "cache redis") {
			scanCache(t, b.schema+":cache:", 1, add)
		}
	case strings.HasPrefix(b.line, "ledger redis"):
		fields := strings.Fields(b.line)
		url, prefix := fields[2], fields[len(fields)-1]
		// On a cluster the job's keys carry its bucket's hash tag after
		// the prefix.
		scanRedisAt(t, url, redisGlob(prefix)+"*j:"+id, add)
	default:
		view = fileLedgerBytes(t, g)
	}
	return view
}

// fileLedgerBytes returns what the gateway's file ledger holds on disk.
func fileLedgerBytes(t *testing.T, g *gateway) []byte {
	return ledgertest.DirBytes(t, filepath.Join(g.home, "data", "caddy", "onejob", "ledger.db"))
}
