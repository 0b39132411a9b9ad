//go:build integration

// Package integration drives the built caddy binary over HTTP against real
// upstreams and a real PostgreSQL, started by ./integration/test.sh.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/onejob/onejob/integration/ports"
)

// binary is the caddy the tests run: ONEJOB_TEST_CADDY when test.sh built
// it once for all its shards, else built here for this run.
var binary = os.Getenv("ONEJOB_TEST_CADDY")

func TestMain(m *testing.M) {
	if binary != "" {
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "onejob-integration")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binary = filepath.Join(dir, "caddy")
	build := exec.Command("go", "build", "-o", binary, "./cmd/caddy")
	build.Dir = ".."
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building caddy:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// postgresDSN is the test PostgreSQL server's DSN.
func postgresDSN(t testing.TB) string {
	return testEnv(t, "ONEJOB_TEST_POSTGRES", "PostgreSQL")
}

// freePort returns a loopback port for a gateway to listen on (see package
// ports for why not the kernel's choice).
func freePort(t testing.TB) int {
	t.Helper()
	p, err := ports.Free()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// backend is a ledger configuration for the gateway under test.
type backend struct {
	name   string
	line   string // the ledger subdirective
	schema string // PostgreSQL schema, "" for memory
}

var schemaSeq struct {
	sync.Mutex
	n int
}

// backends returns the ledgers every scenario runs on: memory, the default
// file ledger, a fresh PostgreSQL schema, a fresh Redis prefix on one
// server and on a Redis Cluster, and PostgreSQL with a Redis replay cache.
func backends(t *testing.T) []func(t *testing.T) backend {
	return []func(t *testing.T) backend{
		func(*testing.T) backend { return backend{name: "memory", line: "ledger memory"} },
		// No ledger line: the default, the file ledger in Caddy's data
		// directory (each gateway's own home).
		func(*testing.T) backend { return backend{name: "file", line: ""} },
		func(t *testing.T) backend { return pgBackend(t) },
		func(t *testing.T) backend { return redisBackend(t) },
		func(t *testing.T) backend { return redisClusterBackend(t) },
		func(t *testing.T) backend {
			b := pgBackend(t)
			b.name = "postgres+cache"
			b.line += "\n\t\tcache redis " + redisURL(t) + " " + b.schema + ":cache:"
			return b
		},
	}
}

// redisURL is the test Redis server's URL.
func redisURL(t testing.TB) string {
	return testEnv(t, "ONEJOB_TEST_REDIS", "Redis")
}

// redisClusterURL is the test Redis Cluster's URL.
func redisClusterURL(t testing.TB) string {
	return testEnv(t, "ONEJOB_TEST_REDIS_CLUSTER", "a Redis Cluster")
}

// testEnv returns the address services.sh exported in name.
func testEnv(t testing.TB, name, what string) string {
	t.Helper()
	u := os.Getenv(name)
	if u == "" {
		t.Fatalf("%s is not set: run ./integration/test.sh, which starts %s", name, what)
	}
	return u
}

// redisBackend is a Redis ledger under a key prefix no other test uses.
func redisBackend(t testing.TB) backend {
	return redisBackendAt("redis", redisURL(t))
}

// redisClusterBackend is a Redis ledger on the test cluster, under a key
// prefix no other test uses.
func redisClusterBackend(t testing.TB) backend {
	return redisBackendAt("redis-cluster", redisClusterURL(t))
}

// redisBackendAt is a Redis ledger at url under a fresh key prefix.
func redisBackendAt(name, url string) backend {
	schemaSeq.Lock()
	schemaSeq.n++
	prefix := fmt.Sprintf("it%d_%d:", os.Getpid(), schemaSeq.n)
	schemaSeq.Unlock()
	return backend{name: name, line: "ledger redis " + url + " " + prefix}
}

func pgBackend(t testing.TB) backend {
	dsn := postgresDSN(t)
	schemaSeq.Lock()
	schemaSeq.n++
	schema := fmt.Sprintf("it_%d_%d", os.Getpid(), schemaSeq.n)
	schemaSeq.Unlock()
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	})
	return backend{name: "postgres", line: "ledger postgres " + dsn + " " + schema, schema: schema}
}

// eachBackend runs fn as a subtest on every ledger.
func eachBackend(t *testing.T, fn func(t *testing.T, b backend)) {
	for _, mk := range backends(t) {
		b := mk(t)
		t.Run(b.name, func(t *testing.T) { fn(t, b) })
	}
}

// gateway is a running caddy process.
type gateway struct {
	t      testing.TB
	url    string
	admin  string
	config string
	home   string
	// json: config is Caddy's JSON, not a Caddyfile.
	json bool
	// env: more of the gateway's environment, NAME=value.
	env    []string
	cmd    *exec.Cmd
	exited chan struct{}
	out    *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startGateway runs caddy with a site on a free port. site is the body of
// the site block; "{ledger}" in it is replaced by the backend's line.
func startGateway(t testing.TB, b backend, site string) *gateway {
	return startGatewayWith(t, b, "", site)
}

// startGatewayWith also takes extra global options.
func startGatewayWith(t testing.TB, b backend, global, site string) *gateway {
	t.Helper()
	g := configureGateway(t, b, global, site)
	g.start()
	t.Cleanup(g.stop)
	return g
}

// configureGateway writes the Caddyfile of startGatewayWith, for a
// gateway that starts later (start).
func configureGateway(t testing.TB, b backend, global, site string) *gateway {
	t.Helper()
	g := &gateway{t: t, home: t.TempDir()}
	port, admin := freePort(t), freePort(t)
	g.url = fmt.Sprintf("http://127.0.0.1:%d", port)
	g.admin = fmt.Sprintf("127.0.0.1:%d", admin)
	site = strings.ReplaceAll(site, "{ledger}", b.line)
	caddyfile := fmt.Sprintf("{\n\tadmin %s\n\tauto_https off\n\tpersist_config off\n%s}\n\nhttp://127.0.0.1:%d {\n%s\n}\n\nhttp://%s:%d {\n\trespond \"%s0\"\n}\n",
		g.admin, global, port, site, generationHost, port, generationPrefix)
	g.config = filepath.Join(g.home, "Caddyfile")
	if err := os.WriteFile(g.config, []byte(caddyfile), 0o600); err != nil {
		t.Fatal(err)
	}
	return g
}

func (g *gateway) start() {
	t := g.t
	t.Helper()
	g.out = &syncBuffer{}
	args := []string{"run", "--config", g.config}
	if !g.json {
		args = append(args, "--adapter", "caddyfile")
	}
	g.cmd = exec.Command(binary, args...)
	g.cmd.Env = append(os.Environ(), "HOME="+g.home, "XDG_DATA_HOME="+g.home+"/data", "XDG_CONFIG_HOME="+g.home+"/config")
	g.cmd.Env = append(g.cmd.Env, g.env...)
	g.cmd.Stdout, g.cmd.Stderr = g.out, g.out
	if err := g.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	g.exited = make(chan struct{})
	go func(cmd *exec.Cmd, exited chan struct{}) { cmd.Wait(); close(exited) }(g.cmd, g.exited)
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + g.admin + "/config/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-g.exited:
			g.cmd = nil
			t.Fatalf("caddy exited at start:\n%s", g.out)
		default:
		}
		if time.Now().After(deadline) {
			g.cmd.Process.Kill()
			<-g.exited
			g.cmd = nil
			t.Fatalf("caddy did not start:\n%s", g.out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends caddy gracefully (SIGTERM), or kills it after 10 s.
func (g *gateway) stop() {
	if g.cmd == nil || g.cmd.Process == nil {
		return
	}
	g.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-g.exited:
	case <-time.After(10 * time.Second):
		g.cmd.Process.Kill()
		<-g.exited
	}
	if g.t.Failed() {
		g.t.Logf("caddy output:\n%s", g.out)
	}
	g.cmd = nil
}

// response is a finished HTTP exchange.
type response struct {
	status int
	header http.Header
	body   string
}

func (r response) String() string { return fmt.Sprintf("%d %v %s", r.status, r.header, r.body) }

// post sends a POST with an optional key and Authorization header.
func (g *gateway) post(t *testing.T, path, key, auth, body string) response {
	t.Helper()
	return g.do(t, context.Background(), http.MethodPost, path, key, auth, body)
}

func (g *gateway) do(t *testing.T, ctx context.Context, method, path, key, auth, body string) response {
	t.Helper()
	return g.request(t, ctx, method, path, key, auth, body, nil)
}

// request is do with extra request headers; a GET carries no Content-Type.
func (g *gateway) request(t *testing.T, ctx context.Context, method, path, key, auth, body string, extra http.Header) response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, g.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if method != http.MethodGet {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range extra {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}
}

// eventually polls cond until it holds, for conditions the test cannot
// wait on directly (a gateway's background work).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// jobState reads a job's state from the PostgreSQL tables, as an operator
// would (the stored state, leases not applied).
func jobState(t testing.TB, b backend, jobID string) (state string, attempts []string) {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, postgresDSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if err := conn.QueryRow(ctx, "SELECT state FROM "+b.schema+".jobs WHERE id = $1", jobID).Scan(&state); err != nil {
		t.Fatalf("job %s: %v", jobID, err)
	}
	rows, err := conn.Query(ctx, "SELECT state FROM "+b.schema+".attempts WHERE job_id = $1 ORDER BY number", jobID)
	if err != nil {
		t.Fatal(err)
	}
	attempts, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return state, attempts
}
