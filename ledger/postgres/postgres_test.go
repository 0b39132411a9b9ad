//go:build integration

package postgres

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/ledgertest"
)

// dsn returns the test server's address; under the integration tag a
// missing address is a failure, never a skip.
func dsn(t *testing.T) string {
	t.Helper()
	d := os.Getenv("ONEJOB_TEST_POSTGRES")
	if d == "" {
		t.Fatal("ONEJOB_TEST_POSTGRES is not set: run ./integration/test.sh, which starts PostgreSQL")
	}
	return d
}

var schemaSeq struct {
	sync.Mutex
	n int
}

// newSchema returns a schema name no other test uses, dropped at cleanup
// with its functions' schema.
func newSchema(t *testing.T) string {
	schemaSeq.Lock()
	schemaSeq.n++
	name := fmt.Sprintf("onejob_t%d_%d", os.Getpid(), schemaSeq.n)
	schemaSeq.Unlock()
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), dsn(t))
		if err != nil {
			t.Errorf("drop schema: %v", err)
			return
		}
		defer conn.Close(context.Background())
		if _, err := conn.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+functionsSchema(name)+", "+name+" CASCADE"); err != nil {
			t.Errorf("drop schema: %v", err)
		}
	})
	return name
}

func open(t *testing.T, schema string) *Ledger {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := Open(ctx, dsn(t), Options{Schema: schema})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func TestPostgresConformance(t *testing.T) {
	ledgertest.Run(t, ledgertest.Harness{
		New: func(t *testing.T) ledger.Ledger { return open(t, newSchema(t)) },
		Peer: func(t *testing.T, l ledger.Ledger) ledger.Ledger {
			return open(t, l.(*Ledger).Schema())
		},
	})
}

// countingTracer counts the queries and batches sent to the server: one
// per round trip for these calls, whose statements are prepared already.
type countingTracer struct {
	mu sync.Mutex
	n  int
}

func (c *countingTracer) count(ctx context.Context) context.Context {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return ctx
}

func (c *countingTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return c.count(ctx)
}

func (c *countingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *countingTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return c.count(ctx)
}

func (c *countingTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (c *countingTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (c *countingTracer) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = 0
	return n
}

// oneKey returns reservation params for the one key a test uses, its
// first attempt leased for lease.
func oneKey(lease time.Duration) ledger.ReserveParams {
	return ledger.ReserveParams{
		OwnerHash: []byte("owner"), KeyHash: []byte("key"), Fingerprint: []byte("fp"), FingerprintVersion: 1,
		Retention: time.Hour, Attempt: ledger.NewAttempt("p", lease),
	}.WithNewIDs()
}

func TestRoundTrips(t *testing.T) {
	tr := &countingTracer{}
	l, err := Open(context.Background(), dsn(t), Options{Schema: newSchema(t), Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ledgertest.KeepsReplays(t, l.replays)
	ctx := context.Background()
	// A listener of the ledger's channel, to see complete's announcement.
	listener, err := pgx.Connect(ctx, dsn(t))
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close(ctx)
	if _, err := listener.Exec(ctx, "LISTEN "+pgx.Identifier{l.channel}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	p := oneKey(time.Minute)
	tr.take()
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.take(); n != 1 {
		t.Errorf("fresh reserve took %d queries, want 1", n)
	}
	if _, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true}); err != nil {
		t.Fatal(err)
	}
	if n := tr.take(); n != 1 {
		t.Errorf("complete took %d round trips, want 1: complete, then announce, in one pipeline", n)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if n, err := listener.WaitForNotification(wctx); err != nil || n.Payload != r.Job.ID {
		t.Errorf("after complete: notification %+v, %v; want job %s announced", n, err, r.Job.ID)
	}
	p = p.WithNewIDs() // another request for the key
	if r, err := l.Reserve(ctx, p); err != nil || r.Outcome != ledger.Done {
		t.Fatalf("replay reserve: %v %v", r.Outcome, err)
	}
	if n := tr.take(); n != 1 {
		t.Errorf("replay reserve took %d queries, want 1", n)
	}
	// Later replays are answered from the process; another request under
	// the key is refused from there too.
	if r, err := l.Reserve(ctx, p); err != nil || r.Outcome != ledger.Done || string(r.Job.Response.Body) != "x" {
		t.Fatalf("second replay reserve: %v %v", r.Outcome, err)
	}
	other := p
	other.Fingerprint = []byte("another request")
	if r, err := l.Reserve(ctx, other); err != nil || r.Outcome != ledger.Mismatch {
		t.Fatalf("another request under the key: %v %v", r.Outcome, err)
	}
	if n := tr.take(); n != 0 {
		t.Errorf("second replay and mismatch took %d queries, want 0", n)
	}
}

// TestCompleteReportsItsCommit: a completion is reported once its
// transaction committed, not when complete's row arrives (in a pipeline
// the row comes before the commit). A deferred constraint trigger, checked
// at commit, refuses one response status: Complete says so, the job stays
// pending, and a completion that commits wins.
func TestCompleteReportsItsCommit(t *testing.T) {
	schema := newSchema(t)
	l := open(t, schema)
	ctx := context.Background()
	if _, err := l.pool.Exec(ctx, `
		CREATE FUNCTION `+schema+`.refuse_599() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF NEW.response_status = 599 THEN
				RAISE EXCEPTION 'refused at commit';
			END IF;
			RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER refuse_599 AFTER UPDATE ON `+schema+`.jobs
			DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+schema+`.refuse_599()`); err != nil {
		t.Fatal(err)
	}
	p := oneKey(time.Minute)
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 599, Body: []byte("x"), Size: 1, Stored: true}); err == nil {
		t.Fatalf("a completion whose commit failed: %+v, no error", c)
	}
	if j, err := l.Job(ctx, r.Job.ID); err != nil || j.State != ledger.JobPending || j.CompletedBy != "" {
		t.Fatalf("after the failed commit: %+v, %v; want the job pending", j, err)
	}
	c, err := l.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("x"), Size: 1, Stored: true})
	if err != nil || !c.Won {
		t.Fatalf("a completion that commits: %+v, %v", c, err)
	}
}

// TestMigrationsConcurrent opens several ledgers on a new schema at once:
// the advisory lock makes each migration run once.
func TestMigrationsConcurrent(t *testing.T) {
	schema := newSchema(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := Open(context.Background(), dsn(t), Options{Schema: schema})
			if err != nil {
				errs <- err
				return
			}
			l.Close()
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Open: %v", err)
	}
	l := open(t, schema)
	for dir, table := range map[string]string{"migrations": "schema_migrations", "expansions": "schema_expansions"} {
		var n int
		if err := l.Pool().QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n); err != nil {
			t.Fatal(err)
		}
		ms, err := loadMigrations(dir)
		if err != nil {
			t.Fatal(err)
		}
		if n != len(ms) {
			t.Errorf("%s has %d rows, want %d", table, n, len(ms))
		}
	}
}

// TestUniqueConstraint checks that (owner, key) is unique in the table
// itself, not only in the code that inserts.
func TestUniqueConstraint(t *testing.T) {
	l := open(t, newSchema(t))
	ctx := context.Background()
	insert := `INSERT INTO jobs (id, owner_hash, key_hash, fingerprint, fingerprint_version, state, version, attempt_count, retention, created_at)
		VALUES ($1, 'o', 'k', 'f', 1, 'pending', 1, 0, '1h', now())`
	if _, err := l.Pool().Exec(ctx, insert, ledger.NewID()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Pool().Exec(ctx, insert, ledger.NewID()); err == nil {
		t.Fatal("a second job with the same (owner_hash, key_hash) was accepted")
	}
}

// TestListenerReconnects kills the listening connection while a waiter
// waits: the listener reconnects, re-subscribes, and the waiter still sees
// the completion made meanwhile by another instance.
func TestListenerReconnects(t *testing.T) {
	schema := newSchema(t)
	l := open(t, schema)
	peer := open(t, schema)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := oneKey(time.Minute)
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *ledger.Job, 1)
	go func() {
		j, err := l.Wait(ctx, r.Job.ID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		got <- j
	}()
	// Wait until the listener is up, then kill it.
	var killed int
	for killed == 0 {
		if ctx.Err() != nil {
			t.Fatal("listener never connected")
		}
		err := peer.Pool().QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE application_name = 'onejob-listener' AND query LIKE '%`+schema+`%'`).Scan(&killed)
		if err != nil {
			t.Fatal(err)
		}
		if killed == 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	if _, err := peer.Complete(ctx, r.Attempt.Ref(), ledger.Response{Status: 200, Body: []byte("done"), Size: 4, Stored: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobCompleted {
			t.Fatalf("waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("waiter was not woken after the listener reconnected")
	}
	// A new waiter on the reconnected listener is woken too.
	q := p.WithNewIDs()
	q.KeyHash = []byte("key2")
	r2, err := l.Reserve(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		j, err := l.Wait(ctx, r2.Job.ID)
		if err != nil {
			t.Errorf("Wait: %v", err)
		}
		got <- j
	}()
	if err := peer.MarkUnknown(ctx, r2.Attempt.Ref(), "timeout"); err != nil {
		t.Fatal(err)
	}
	select {
	case j := <-got:
		if j == nil || j.State != ledger.JobUnknown {
			t.Fatalf("second waiter got %+v", j)
		}
	case <-ctx.Done():
		t.Fatal("second waiter was not woken")
	}
}

// TestLookupLost: a lookup that finds the provider acted after another
// result won records the attempt lost and leaves the winner's answer; each
// lookup transition is one round trip and returns the job as Job reads it.
func TestLookupLost(t *testing.T) {
	tr := &countingTracer{}
	l, err := Open(context.Background(), dsn(t), Options{Schema: newSchema(t), Tracer: tr})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := oneKey(300 * time.Millisecond)
	r, err := l.Reserve(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	ref := r.Attempt.Ref()
	if err := l.MarkUnknown(ctx, ref, "attempt_timeout"); err != nil {
		t.Fatal(err)
	}
	for {
		j, err := l.Job(ctx, r.Job.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !j.ReadAt.Before(r.Attempt.Deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Claims and settlements run their statements prepared, as after the
	// first call of each.
	if _, err := l.ClaimLookup(ctx, ref, "r1", time.Minute); err != nil {
		t.Fatal(err)
	}
	tr.take()
	j, err := l.ClaimLookup(ctx, ref, "r1", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.take(); n != 1 {
		t.Errorf("a claim took %d round trips, want 1", n)
	}
	if lk := j.Attempts[0].Lookups(); lk.Holder != "r1" || !lk.Until.After(j.ReadAt) || j.ReadAt.IsZero() {
		t.Errorf("the claimed attempt: %+v, read at %v", lk, j.ReadAt)
	}

	// A re-send wins meanwhile.
	resend, err := l.Resend(ctx, ref, ledger.NewAttempt("q", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if c, err := l.Complete(ctx, resend.Ref(), ledger.Response{Status: 200, Body: []byte("re-sent"), Size: 7, Stored: true}); err != nil || !c.Won {
		t.Fatalf("the re-send's result: %+v %v", c, err)
	}
	found := &ledger.Response{Status: 200, Body: []byte("the provider's record")}
	if _, err := l.SettleLookup(ctx, ref, "r2", ledger.LookupResult{Status: 200, Found: found}); err == nil {
		t.Fatal("settled by a holder without the lease")
	}
	tr.take()
	j, err = l.SettleLookup(ctx, ref, "r1", ledger.LookupResult{Status: 200, Found: found})
	if err != nil {
		t.Fatal(err)
	}
	if n := tr.take(); n != 1 {
		t.Errorf("a settlement took %d round trips, want 1", n)
	}
	a := j.Attempts[0]
	if a.State != ledger.AttemptLost || a.Error != ledger.ReasonLookupLost || !a.Lookup.Settled || a.Lookup.Tries != 1 ||
		a.Lookup.LastStatus != 200 || !a.Lookup.Until.IsZero() || a.Lookup.LastAt.IsZero() || a.Reconciled(j) != "lookup" {
		t.Errorf("the attempt a lookup found acted after another result won: %+v", a)
	}
	if j.State != ledger.JobCompleted || j.CompletedBy != resend.ID || string(j.Response.Body) != "re-sent" {
		t.Errorf("the job after the lookup: %s by %s, %q", j.State, j.CompletedBy, j.Response.Body)
	}
	again, err := l.SettleLookup(ctx, ref, "r1", ledger.LookupResult{Status: 200, Found: found})
	if err != nil || again.Attempts[0].Lookups() != a.Lookups() || again.Version != j.Version {
		t.Errorf("a repeat of the settlement: %+v %v", again, err)
	}
	if read, err := l.Job(ctx, r.Job.ID); err != nil || read.Attempts[0].Lookups() != a.Lookups() || read.Attempts[0].Error != a.Error {
		t.Errorf("Job reads the attempt as %+v (%v), the settlement returned %+v", read.Attempts[0], err, a)
	}
}
