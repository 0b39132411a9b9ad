//go:build integration

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// TestOwnerCannotTouchAnotherOwnersKey: two owners send the same key
// string. Alice's attempt times out (her job is unknown) while Bob, with
// another body, gets his own job: not a 422 (which would tell him the key
// exists), not a 409 from Alice's unknown job, not her answer. Alice's late
// result completes only her job; each owner's retries replay their own
// answer. In the other order, Bob's completed job stays completed and
// replayed when Alice's attempt with the same key times out. (Bob not
// blocked while Alice's attempt is in flight: TestOwnersAreSeparate.)
func TestOwnerCannotTouchAnotherOwnersKey(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		release := map[string]chan struct{}{"owned-key": make(chan struct{}), "owned-key-2": make(chan struct{})}
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			who := r.Header.Get("Authorization")
			if who == "Bearer alice" {
				<-release[r.Header.Get("Idempotency-Key")]
			}
			fmt.Fprintf(w, `{"for":%q}`, who)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 400ms"))
		const key = "owned-key"
		alice := g.post(t, "/charges", key, "Bearer alice", `{"amount":1}`)
		if alice.status != http.StatusGatewayTimeout {
			t.Fatalf("alice: %v", alice)
		}
		aliceJob := alice.header.Get("Idempotency-Job-Id")
		if r := g.post(t, "/charges", key, "Bearer alice", `{"amount":1}`); r.status != http.StatusConflict ||
			!strings.Contains(r.body, "outcome-unknown") {
			t.Fatalf("alice's retry of her unknown job: %v", r)
		}

		bob := g.post(t, "/charges", key, "Bearer bob", `{"amount":2}`)
		bobJob := bob.header.Get("Idempotency-Job-Id")
		if bob.status != http.StatusOK || bob.body != `{"for":"Bearer bob"}` ||
			bob.header.Get("Idempotent-Replayed") != "" || bobJob == "" || bobJob == aliceJob {
			t.Fatalf("bob, while alice's job is unknown: %v", bob)
		}
		if j := g.job(t, bobJob); j.State != "completed" {
			t.Errorf("bob's job is %s", j.State)
		}
		if j := g.job(t, aliceJob); j.State != "unknown" {
			t.Errorf("alice's job is %s", j.State)
		}

		close(release[key])
		var late response
		eventually(t, "alice's late result completes her job", func() bool {
			late = g.post(t, "/charges", key, "Bearer alice", `{"amount":1}`)
			return late.status == http.StatusOK
		})
		if late.body != `{"for":"Bearer alice"}` || late.header.Get("Idempotency-Job-Id") != aliceJob {
			t.Errorf("alice's replay: %v", late)
		}
		if r := g.post(t, "/charges", key, "Bearer bob", `{"amount":2}`); r.body != bob.body ||
			r.header.Get("Idempotent-Replayed") != "true" || r.header.Get("Idempotency-Job-Id") != bobJob {
			t.Errorf("bob's replay after alice's job completed: %v", r)
		}
		// Bob with Alice's body is Bob's mismatch, never Alice's answer.
		if r := g.post(t, "/charges", key, "Bearer bob", `{"amount":1}`); r.status != http.StatusUnprocessableEntity ||
			strings.Contains(r.body, "alice") || r.header.Get("Idempotency-Job-Id") != bobJob {
			t.Errorf("bob with alice's body: %v", r)
		}
		aj, bj := g.job(t, aliceJob), g.job(t, bobJob)
		if aj.OwnerHash == bj.OwnerHash || aj.KeyHash != bj.KeyHash {
			t.Errorf("owner hashes %s / %s, key hashes %s / %s: want distinct owners, one key", aj.OwnerHash, bj.OwnerHash, aj.KeyHash, bj.KeyHash)
		}
		if c := up.count(key); c != 2 {
			t.Errorf("upstream called %d times, want 2", c)
		}

		const key2 = "owned-key-2"
		bob2 := g.post(t, "/charges", key2, "Bearer bob", `{}`)
		if bob2.status != http.StatusOK {
			t.Fatalf("bob: %v", bob2)
		}
		alice2 := g.post(t, "/charges", key2, "Bearer alice", `{}`)
		if alice2.status != http.StatusGatewayTimeout || alice2.header.Get("Idempotency-Job-Id") == bob2.header.Get("Idempotency-Job-Id") {
			t.Fatalf("alice: %v", alice2)
		}
		if j := g.job(t, bob2.header.Get("Idempotency-Job-Id")); j.State != "completed" || j.Attempts[0].State != "succeeded" {
			t.Errorf("bob's job after alice's timeout: %+v", j)
		}
		if r := g.post(t, "/charges", key2, "Bearer bob", `{}`); r.body != bob2.body || r.header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("bob's replay after alice's timeout: %v", r)
		}
		close(release[key2])
	})
}

// TestLedgerHoldsNoSecrets drives jobs into every state with a bearer
// token as owner, then scans everything the ledger stored (PostgreSQL rows
// of every table in its schema, every Redis key and value under its
// prefix, the bytes of the file ledger) for the token, the raw key, and
// their hex and base64 forms: only hashes may be there. The gateway's log
// must not carry them either.
func TestLedgerHoldsNoSecrets(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		if b.name == "memory" {
			return // nothing stored outside the process
		}
		const token = "Bearer tok-Hq3v8Nn4Rr7Kx2Lw"
		const key = "sec-key-Zq9x7Lw2Pm5T"
		release := make(chan struct{})
		defer close(release)
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			switch r.URL.Path {
			case "/busy":
				http.Error(w, "busy", http.StatusServiceUnavailable)
			case "/slow":
				<-release
			default:
				fmt.Fprintf(w, `{"n":%d}`, n)
			}
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 300ms"))
		for _, step := range []struct {
			path, key, body string
			status          int
		}{
			{"/charges", key, "{}", http.StatusOK},                    // completed
			{"/charges", key, "{}", http.StatusOK},                    // replayed
			{"/charges", key, `{"other":1}`, 422},                     // mismatch
			{"/busy", key + "-busy", "{}", 503},                       // failed
			{"/slow", key + "-slow", "{}", http.StatusGatewayTimeout}, // unknown
			{"/slow", key + "-slow", "{}", http.StatusConflict},       // blocked
			{"/charges", `"` + key + `-quoted"`, "{}", http.StatusOK}, // a quoted key
		} {
			if r := g.post(t, step.path, step.key, token, step.body); r.status != step.status {
				t.Fatalf("%s %s: %v", step.path, step.key, r)
			}
		}
		secrets := map[string][]byte{}
		for _, s := range []string{token, key, strings.TrimPrefix(token, "Bearer ")} {
			secrets[s] = []byte(s)
			secrets["hex of "+s] = []byte(hex.EncodeToString([]byte(s)))
			secrets["base64 of "+s] = []byte(base64.StdEncoding.EncodeToString([]byte(s)))
			secrets["base64 (raw URL) of "+s] = []byte(base64.RawURLEncoding.EncodeToString([]byte(s)))
		}
		scanned := 0
		check := func(where string, data []byte) {
			scanned++
			for name, s := range secrets {
				if bytes.Contains(data, s) || bytes.Contains(bytes.ToLower(data), bytes.ToLower(s)) {
					t.Errorf("%s holds the %s", where, name)
				}
			}
		}
		switch {
		case b.schema != "":
			scanPostgres(t, b.schema, check)
			if strings.Contains(b.line, "cache redis") {
				scanCache(t, b.schema+":cache:", 2, check) // the two completed keys
			}
		case strings.HasPrefix(b.line, "ledger redis"):
			fields := strings.Fields(b.line)
			scanRedisAt(t, fields[2], redisGlob(fields[len(fields)-1])+"*", check)
		default:
			check(filepath.Join(g.home, "data", "caddy", "onejob", "ledger.db"), fileLedgerBytes(t, g))
		}
		if scanned == 0 {
			t.Fatal("nothing was scanned")
		}
		check("the gateway's log", []byte(g.out.String()))
	})
}

// scanPostgres hands every row of every table of schema to check, each
// column as the driver returns it (bytea as bytes) and as text.
func scanPostgres(t *testing.T, schema string, check func(where string, data []byte)) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT table_name FROM information_schema.tables WHERE table_schema = $1", schema)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(tables) == 0 {
		t.Fatalf("tables of %s: %v %v", schema, tables, err)
	}
	n := 0
	for _, table := range tables {
		rows, err := conn.Query(ctx, fmt.Sprintf("SELECT t::text, t.* FROM %s.%s t", pgx.Identifier{schema}.Sanitize(), pgx.Identifier{table}.Sanitize()))
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			values, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			var all bytes.Buffer
			for _, v := range values {
				switch v := v.(type) {
				case []byte:
					all.Write(v)
				case string:
					all.WriteString(v)
				default:
					fmt.Fprint(&all, v)
				}
				all.WriteByte(0)
			}
			check(fmt.Sprintf("PostgreSQL table %s.%s", schema, table), all.Bytes())
			n++
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
	}
	if n == 0 {
		t.Fatalf("no rows in schema %s", schema)
	}
}

// scanRedis hands every key under prefix on the test's Redis server, with
// its value whatever its type, to check.
func scanRedis(t *testing.T, prefix string, check func(where string, data []byte)) {
	t.Helper()
	scanRedisAt(t, redisURL(t), redisGlob(prefix)+"*", check)
}

// scanCache is scanRedis over a replay cache's keys once it holds at least
// want replies: the cache is written after the answer, in the background.
func scanCache(t *testing.T, prefix string, want int, check func(where string, data []byte)) {
	t.Helper()
	eventually(t, fmt.Sprintf("the cache holds %d replies", want), func() bool {
		n := 0
		scanRedis(t, prefix, func(string, []byte) { n++ })
		return n >= want
	})
	scanRedis(t, prefix, check)
}

// scanRedisAt hands every key that matches pattern on the Redis server at
// url, or on every master of the cluster it names with addr=, with its
// value whatever its type, to check.
func scanRedisAt(t *testing.T, url, pattern string, check func(where string, data []byte)) {
	t.Helper()
	ctx := context.Background()
	var nodes []*redis.Client
	if strings.Contains(url, "addr=") {
		o, err := redis.ParseClusterURL(url)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClusterClient(o)
		defer c.Close()
		var mu sync.Mutex
		if err := c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
			mu.Lock()
			defer mu.Unlock()
			nodes = append(nodes, n)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	} else {
		opt, err := redis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		nodes = append(nodes, rdb)
	}
	found := 0
	for _, rdb := range nodes {
		found += scanNode(t, ctx, rdb, pattern, check)
	}
	if found == 0 {
		t.Fatalf("no Redis keys match %q", pattern)
	}
}

// scanNode checks the keys of one server that match pattern, and returns
// how many matched.
func scanNode(t *testing.T, ctx context.Context, rdb *redis.Client, pattern string, check func(where string, data []byte)) int {
	t.Helper()
	keys, err := rdb.Keys(ctx, pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		typ, err := rdb.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "string":
			v, err = rdb.Get(ctx, k).Result()
		case "hash":
			v, err = rdb.HGetAll(ctx, k).Result()
		case "zset":
			v, err = rdb.ZRangeWithScores(ctx, k, 0, -1).Result()
		case "set":
			v, err = rdb.SMembers(ctx, k).Result()
		case "list":
			v, err = rdb.LRange(ctx, k, 0, -1).Result()
		case "stream":
			v, err = rdb.XRange(ctx, k, "-", "+").Result()
		case "none":
			continue // expired meanwhile
		default:
			t.Fatalf("Redis key %s of type %s", k, typ)
		}
		if err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		check("Redis key "+k, []byte(fmt.Sprintf("%s\x00%v", k, v)))
	}
	return len(keys)
}

// redisGlob escapes the glob characters of a key prefix.
func redisGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// rawExchange sends one raw HTTP/1.1 request (written as given, so that it
// may hold bytes Go's client refuses to send) and reads the answer.
func rawExchange(t *testing.T, addr, request string) (*http.Response, string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the answer to %q: %v", request, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// TestMalformedKeysRefused sends keys with CR, LF, NUL, other control
// bytes, non-ASCII bytes, 10 KB, broken quoting, and two key fields, over
// raw TCP (Go's client would refuse some of them). Each is a 400 and none
// reaches the provider: either Go's server refuses the header line itself,
// or the gateway answers key-invalid.
func TestMalformedKeysRefused(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			io.WriteString(w, `{"ok":true}`)
		})
		g := startGateway(t, b, site(up.addr()))
		addr := strings.TrimPrefix(g.url, "http://")
		request := func(keyLines string) string {
			return "POST /charges HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: " + auth +
				"\r\nContent-Type: application/json\r\nContent-Length: 2\r\n" + keyLines + "\r\n{}"
		}
		for _, tc := range []struct {
			name, lines string
			problem     bool // the gateway (not Go's server) refuses it
		}{
			{"CR inside", "Idempotency-Key: a\rb\r\n", false},
			{"LF inside", "Idempotency-Key: a\nb\r\n", false},
			{"CRLF then a header", "Idempotency-Key: a\r\nX-Injected: 1\r\n", true}, // the key is "a": valid
			{"NUL", "Idempotency-Key: a\x00b\r\n", false},
			{"vertical tab", "Idempotency-Key: a\vb\r\n", false},
			{"DEL", "Idempotency-Key: a\x7fb\r\n", false},
			{"inner space", "Idempotency-Key: a b\r\n", true},
			{"inner tab", "Idempotency-Key: a\tb\r\n", true},
			{"non-ASCII UTF-8", "Idempotency-Key: caf\u00e9\r\n", true},
			{"non-ASCII byte", "Idempotency-Key: a\xffb\r\n", true},
			{"10 KB", "Idempotency-Key: " + strings.Repeat("k", 10<<10) + "\r\n", true},
			{"256 bytes", "Idempotency-Key: " + strings.Repeat("k", 256) + "\r\n", true},
			{"quoted 10 KB", `Idempotency-Key: "` + strings.Repeat("k", 10<<10) + "\"\r\n", true},
			{"bad escape", `Idempotency-Key: "a\nb"` + "\r\n", true},
			{"unterminated quote", `Idempotency-Key: "abc` + "\r\n", true},
			{"empty quoted", `Idempotency-Key: ""` + "\r\n", true},
			{"two fields", "Idempotency-Key: a\r\nIdempotency-Key: b\r\n", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				calls := up.total()
				resp, body := rawExchange(t, addr, request(tc.lines))
				if tc.name == "CRLF then a header" {
					// A CRLF ends the field: this is the valid key "a"
					// and another header, not an injection into the key.
					if resp.StatusCode != http.StatusOK {
						t.Errorf("status %d %s", resp.StatusCode, body)
					}
					return
				}
				if resp.StatusCode != http.StatusBadRequest {
					t.Fatalf("status %d, body %s", resp.StatusCode, body)
				}
				if tc.problem && (resp.Header.Get("Content-Type") != "application/problem+json" ||
					!strings.Contains(body, "urn:onejob:problem:key-invalid")) {
					t.Errorf("not a key-invalid problem: %v %s", resp.Header, body)
				}
				if strings.Contains(body, "kkkkkkkk") || strings.Contains(body, "caf") {
					t.Errorf("the answer echoes the key: %s", body)
				}
				if up.total() != calls {
					t.Errorf("the request reached the provider")
				}
			})
		}
		up.mu.Lock()
		defer up.mu.Unlock()
		for _, c := range up.calls {
			if c.key != "a" {
				t.Errorf("the provider was sent key %q", c.key)
			}
		}
	})
}

// TestAdminAPIOnlyOnAdminEndpoint: the job API answers on Caddy's admin
// endpoint and nowhere on a site. On the site, its paths are ordinary
// requests that go to the provider: a listing or a job is never served
// there, and a resolve there resolves nothing.
func TestAdminAPIOnlyOnAdminEndpoint(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		release := make(chan struct{})
		defer close(release)
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
			if r.URL.Path == "/slow" {
				<-release
			}
			fmt.Fprintf(w, `{"site":%q}`, r.URL.Path)
		})
		g := startGateway(t, b, site(up.addr(), "attempt_timeout 300ms"))
		r := g.post(t, "/slow", "adm-1", auth, "{}")
		id := r.header.Get("Idempotency-Job-Id")
		if r.status != http.StatusGatewayTimeout || id == "" {
			t.Fatalf("setup: %v", r)
		}
		status, body := g.adminCall(t, http.MethodGet, "/idempotency/jobs", "")
		if status != http.StatusOK || !strings.Contains(body, id) {
			t.Fatalf("the admin endpoint's listing: %d %s", status, body)
		}

		for _, path := range []string{"/idempotency/jobs", "/idempotency/jobs/" + id, "/idempotency/providers"} {
			r := g.do(t, context.Background(), http.MethodGet, path, "", auth, "")
			if r.status != http.StatusOK || r.body != fmt.Sprintf(`{"site":%q}`, path) {
				t.Errorf("GET %s on the site: %v", path, r)
			}
		}
		for _, key := range []string{"", "adm-resolve"} {
			r := g.post(t, "/idempotency/jobs/"+id+"/resolve", key, auth, `{"outcome":"cancel"}`)
			if r.status != http.StatusOK || r.body != fmt.Sprintf(`{"site":%q}`, "/idempotency/jobs/"+id+"/resolve") {
				t.Errorf("resolve on the site (key %q): %v", key, r)
			}
		}
		if j := g.job(t, id); j.State != "unknown" || j.Attempts[0].State != "unknown" {
			t.Errorf("a resolve sent to the site changed the job: %+v", j)
		}
		if r := g.post(t, "/slow", "adm-1", auth, "{}"); r.status != http.StatusConflict {
			t.Errorf("the job still blocks retries: %v", r)
		}
	})
}

// hopSite answers from a handler inside the route (not reverse_proxy, which
// strips hop-by-hop headers itself), so that every hop-by-hop header, and a
// header that Connection names, reaches the gateway's capture.
const hopSite = `	idempotency {
		{ledger}
	}
	handle {
		header Connection "X-Private-Hop, close-later"
		header X-Private-Hop secret-hop-value
		header Close-Later secret-close-value
		header Keep-Alive "timeout=5, secret-keepalive"
		header Proxy-Authenticate "Basic realm=secret-proxy-realm"
		header Proxy-Connection secret-proxy-connection
		header Te secret-te-value
		header Trailer X-Secret-Trailer
		header Upgrade secret-upgrade-proto
		header X-End-To-End kept-value
		respond "{\"ok\":true}" 201
	}
`

// hopValues are the values of the headers that must never be stored or
// replayed (Transfer-Encoding is checked on the replay's wire form).
var hopValues = []string{"secret-hop-value", "secret-close-value", "secret-keepalive", "secret-proxy-realm",
	"secret-proxy-connection", "secret-te-value", "X-Secret-Trailer", "secret-upgrade-proto"}

// TestHopByHopHeadersNeverStored: the first answer carries every
// hop-by-hop header (Connection, Keep-Alive, Proxy-*, TE, Trailer,
// Upgrade) and headers that Connection names. The replay, read off the
// wire, carries the end-to-end header and none of them; the ledger's
// stored answer holds none of their values either.
func TestHopByHopHeadersNeverStored(t *testing.T) {
	eachBackend(t, func(t *testing.T, b backend) {
		g := startGateway(t, b, hopSite)
		addr := strings.TrimPrefix(g.url, "http://")
		req := "POST /charges HTTP/1.1\r\nHost: " + addr + "\r\nAuthorization: " + auth +
			"\r\nIdempotency-Key: hop-1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
		first, _ := rawExchange(t, addr, req)
		if first.StatusCode != http.StatusCreated {
			t.Fatalf("first answer: %d", first.StatusCode)
		}
		raw := rawReplay(t, addr, req)
		head, body, _ := strings.Cut(raw, "\r\n\r\n")
		if !strings.Contains(head, "Idempotent-Replayed: true") || !strings.Contains(head, "X-End-To-End: kept-value") ||
			body != `{"ok":true}` {
			t.Fatalf("replay:\n%s", raw)
		}
		for _, v := range hopValues {
			if strings.Contains(head, v) {
				t.Errorf("the replay carries %q:\n%s", v, head)
			}
		}
		for _, line := range strings.Split(head, "\r\n")[1:] {
			name, _, _ := strings.Cut(line, ":")
			switch http.CanonicalHeaderKey(name) {
			case "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Connection", "Te", "Trailer", "Upgrade",
				"Transfer-Encoding", "X-Private-Hop", "Close-Later":
				t.Errorf("the replay carries %s", line)
			}
		}

		var stored []byte
		switch {
		case b.name == "memory":
			return // the replay is all there is to see
		case b.schema != "":
			ctx := context.Background()
			conn, err := pgx.Connect(ctx, postgresDSN(t))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			if err := conn.QueryRow(ctx, "SELECT response_header FROM "+b.schema+".jobs WHERE id = $1",
				first.Header.Get("Idempotency-Job-Id")).Scan(&stored); err != nil {
				t.Fatal(err)
			}
		case strings.HasPrefix(b.line, "ledger redis"):
			fields := strings.Fields(b.line)
			prefix := fields[len(fields)-1]
			// On a cluster the job's key has its bucket's hash tag after
			// the prefix.
			scanRedisAt(t, fields[2], redisGlob(prefix)+"*j:"+first.Header.Get("Idempotency-Job-Id"),
				func(_ string, data []byte) { stored = append(stored, data...) })
		default:
			stored = fileLedgerBytes(t, g)
		}
		if !bytes.Contains(stored, []byte("kept-value")) {
			t.Fatalf("the stored answer lacks its end-to-end header: %q", stored)
		}
		for _, v := range hopValues {
			if bytes.Contains(stored, []byte(v)) {
				t.Errorf("the ledger stored %q", v)
			}
		}
	})
}

// rawReplay sends req and returns the answer as it came over the wire.
func rawReplay(t *testing.T, addr, req string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		out.WriteString(line)
		if err != nil {
			t.Fatalf("reading the replay: %v\n%s", err, out.String())
		}
		if line == "\r\n" {
			break
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(out.String())), nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.ContentLength < 0 {
		t.Fatalf("the replay has no Content-Length:\n%s", out.String())
	}
	body := make([]byte, resp.ContentLength)
	if _, err := io.ReadFull(br, body); err != nil {
		t.Fatal(err)
	}
	return out.String() + string(body)
}

// total is how many requests the upstream got.
func (u *upstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.calls)
}
