//go:build integration

package postgres

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
)

// oldGateway connects as a gateway of the previous release does: its
// search_path is the ledger's schema alone, where migrations 0001 and 0002
// put the functions it calls.
func oldGateway(t *testing.T, schema string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.RuntimeParams["search_path"] = schema
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// TestFunctionsBesideOldOnes: the current functions live in their own
// schema; the tables' version and the previous release's functions are
// untouched, and both releases share jobs and notifications.
func TestFunctionsBesideOldOnes(t *testing.T) {
	schema := newSchema(t)
	l := open(t, schema)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	db := l.Pool()

	var version int
	if err := db.QueryRow(ctx, "SELECT max(version) FROM schema_migrations").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != 2 {
		t.Errorf("schema_migrations is at %d: a gateway of the previous release (2) would refuse to start", version)
	}
	var fn, sum string
	if err := db.QueryRow(ctx, "SELECT schema_name, checksum FROM schema_functions WHERE version = $1", functionsVersion).Scan(&fn, &sum); err != nil {
		t.Fatal(err)
	}
	if fn != l.FunctionsSchema() || fn != schema+"_fn"+strconv.Itoa(functionsVersion) || sum != functionsChecksum {
		t.Errorf("schema_functions records %s %s", fn, sum)
	}
	count := func(ns, name string) int {
		var n int
		if err := db.QueryRow(ctx, "SELECT count(*) FROM pg_proc WHERE pronamespace = $1::regnamespace AND proname = $2", ns, name).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, name := range []string{"reserve", "complete", "fail", "mark_unknown", "resolve", "sweep", "refresh_lease", "notify_job", "lock_job"} {
		if count(schema, name) != 1 || count(fn, name) != 1 {
			t.Errorf("%s: %d in %s, %d in %s; want one each", name, count(schema, name), schema, count(fn, name), fn)
		}
	}
	// Functions this release added, or that replaced the previous
	// release's (start_attempt does hedge's work and re-sends): in the
	// functions' schema alone; the previous release's stay for its gateways.
	for _, name := range []string{"unsent", "start_attempt", "after_failure", "claim_lookup", "settle_lookup", "announce"} {
		if count(fn, name) != 1 || count(schema, name) != 0 {
			t.Errorf("%s is not in the functions' schema alone", name)
		}
	}
	if count(schema, "hedge") != 1 {
		t.Errorf("the previous release's hedge is gone from %s", schema)
	}

	// A job the old functions create is the new ledger's, and a waiter of
	// the new ledger is woken by the old functions' notification.
	if l.channel != schema+".jobs" {
		t.Errorf("the ledger listens on %q, not on the channel of the previous release", l.channel)
	}
	old := oldGateway(t, schema)
	p := ledger.ReserveParams{
		OwnerHash: []byte("owner"), KeyHash: []byte("old"), Fingerprint: []byte("fp"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NewAttempt("p", time.Minute),
	}
	var (
		outcome, jobID, attemptID string
		jobVersion                int64
	)
	if err := old.QueryRow(ctx, `SELECT outcome, job_id::text, attempt_id::text, job_version
		FROM reserve(gen_random_uuid(), gen_random_uuid(), $1, $2, $3, $4, 'p', 60000000, 3600000000)`,
		p.OwnerHash, p.KeyHash, p.Fingerprint, p.FingerprintVersion).Scan(&outcome, &jobID, &attemptID, &jobVersion); err != nil {
		t.Fatal(err)
	}
	if outcome != "created" {
		t.Fatalf("old reserve: %s", outcome)
	}
	if r, err := l.Reserve(ctx, p.WithNewIDs()); err != nil || r.Outcome != ledger.InFlight || r.Job.ID != jobID || r.Attempt.ID != attemptID {
		t.Fatalf("new reserve of the old job: %+v %v", r, err)
	}
	woken := make(chan *ledger.Job, 1)
	go func() {
		j, err := l.Wait(ctx, jobID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		woken <- j
	}()
	waitListening(t, l)
	if err := old.QueryRow(ctx, `SELECT outcome FROM complete($1, $2, $3, 200, $4, 'old answer', 10, true)`,
		jobID, attemptID, jobVersion, []byte(`{"Content-Type":["text/plain"]}`)).Scan(&outcome); err != nil || outcome != "won" {
		t.Fatalf("old complete: %s %v", outcome, err)
	}
	select {
	case j := <-woken:
		if j == nil || j.State != ledger.JobCompleted || string(j.Response.Body) != "old answer" {
			t.Errorf("new waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("the old functions' notification did not wake the new ledger's waiter")
	}
	if r, err := l.Reserve(ctx, p.WithNewIDs()); err != nil || r.Outcome != ledger.Done || string(r.Job.Response.Body) != "old answer" {
		t.Errorf("new replay of the old job: %+v %v", r, err)
	}

	// And the other way: the new functions notify the old listeners' channel.
	if _, err := old.Exec(ctx, "LISTEN "+pgx.Identifier{schema + ".jobs"}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	q := p.WithNewIDs()
	q.KeyHash = []byte("new")
	r, err := l.Reserve(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 201, Body: []byte("new answer"), Size: 10, Stored: true}); err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithTimeout(ctx, 5*time.Second)
	defer ncancel()
	n, err := old.WaitForNotification(nctx)
	if err != nil || n.Payload != r.Job.ID {
		t.Fatalf("old listener: %+v %v", n, err)
	}
	var body []byte
	if err := old.QueryRow(ctx, `SELECT outcome, response_body FROM reserve(gen_random_uuid(), gen_random_uuid(), $1, $2, $3, $4, 'p', 60000000, 3600000000)`,
		q.OwnerHash, q.KeyHash, q.Fingerprint, q.FingerprintVersion).Scan(&outcome, &body); err != nil || outcome != "done" || string(body) != "new answer" {
		t.Errorf("old replay of the new job: %s %q %v", outcome, body, err)
	}
}

// waitListening returns once the ledger's listener is connected.
func waitListening(t *testing.T, l *Ledger) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, unsubscribe, err := l.listen.Subscribe(ctx, "")
	if err != nil {
		t.Fatalf("the listener did not connect: %v", err)
	}
	unsubscribe()
}

// TestFunctionsApplied: the functions are created once per version; a
// leftover functions' schema of a dropped ledger is replaced, another
// schema of that name is refused, and so is another text under the same
// version.
func TestFunctionsApplied(t *testing.T) {
	ctx := context.Background()
	schema := newSchema(t)
	l := open(t, schema)
	open(t, schema) // already there: nothing to do
	if _, err := l.Pool().Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
		t.Fatal(err)
	}
	again := open(t, schema)
	p := oneKey(time.Minute)
	r, err := again.Reserve(ctx, p)
	if err != nil || r.Outcome != ledger.Created {
		t.Fatalf("reserve on the schema made again: %+v %v", r, err)
	}
	if c, err := again.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200}); err != nil || !c.Won {
		t.Fatalf("complete on the schema made again: %+v %v", c, err)
	}

	if _, err := again.Pool().Exec(ctx, "UPDATE schema_functions SET checksum = 'another text' WHERE version = $1", functionsVersion); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, dsn(t), Options{Schema: schema}); err == nil || !strings.Contains(err.Error(), "without a new version") {
		t.Errorf("Open with another text recorded under the version: %v", err)
	}

	other := newSchema(t)
	if _, err := again.Pool().Exec(ctx, "CREATE SCHEMA "+functionsSchema(other)); err != nil {
		t.Fatal(err)
	}
	_, err = Open(ctx, dsn(t), Options{Schema: other})
	if err == nil || !strings.Contains(err.Error(), "does not hold") {
		t.Errorf("Open beside a foreign schema named like its functions': %v", err)
	}
}
