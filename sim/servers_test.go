//go:build integration

package sim

import (
	"context"
	"fmt"
	neturl "net/url"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	goredis "github.com/redis/go-redis/v9"

	"github.com/onejob/onejob/ledger"
	"github.com/onejob/onejob/ledger/postgres"
	"github.com/onejob/onejob/ledger/redis"
)

// serverStores are the ledgers on servers, each gateway with its own
// client (and its own replay memory), as instances are: on PostgreSQL, each schedule
// in a schema no other running schedule uses (emptied after it, and used
// again: migrating a new one costs more than a schedule); on Redis, under
// a prefix of its own, deleted after it.
var serverStores = []store{
	{"postgres", func(t *testing.T, _ int64, _ func() time.Time) (ledger.Ledger, func() (ledger.Ledger, error)) {
		addr := server(t, "ONEJOB_TEST_POSTGRES") // before a schema is taken: a failure here must not keep it
		schema := <-pgSchemas
		l, err := postgres.Open(openContext(t), addr, postgres.Options{Schema: schema})
		if err != nil {
			pgSchemas <- schema
			t.Fatal(err)
		}
		pgUsed.Store(schema, l.FunctionsSchema())
		t.Cleanup(func() {
			defer func() { pgSchemas <- schema }()
			emptySchema(t, schema)
		})
		return l, func() (ledger.Ledger, error) {
			// Every gateway's pool on one server: two connections each keep
			// the schedules running at once within its max_connections.
			url, err := neturl.Parse(addr)
			if err != nil {
				return nil, err
			}
			q := url.Query()
			q.Set("pool_max_conns", "2")
			url.RawQuery = q.Encode()
			return postgres.Open(openContext(t), url.String(), postgres.Options{Schema: schema})
		}
	}},
	{"redis", func(t *testing.T, seed int64, _ func() time.Time) (ledger.Ledger, func() (ledger.Ledger, error)) {
		url := server(t, "ONEJOB_TEST_REDIS")
		prefix := fmt.Sprintf("onejob-sim:%d:%d:", os.Getpid(), seed)
		l, err := redis.Open(openContext(t), url, redis.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			opt, err := goredis.ParseURL(url)
			if err != nil {
				t.Error(err)
				return
			}
			c := goredis.NewClient(opt)
			defer c.Close()
			ctx := context.Background()
			for it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator(); it.Next(ctx); {
				c.Del(ctx, it.Val())
			}
		})
		return l, func() (ledger.Ledger, error) { return redis.Open(openContext(t), url, redis.Options{Prefix: prefix}) }
	}},
}

// pgSchemas holds the schemas free for a schedule, one per schedule that
// may run at once; pgUsed, the schemas used (and their functions'), to
// drop when the test ends.
var (
	pgSchemas = func() chan string {
		c := make(chan string, serverParallel)
		for i := range serverParallel {
			c <- fmt.Sprintf("onejob_sim%d_%d", os.Getpid(), i)
		}
		return c
	}()
	pgUsed sync.Map
)

// emptySchema deletes the rows of every table of schema but its
// migrations' records, so that the next schedule finds it as new.
func emptySchema(t *testing.T, schema string) {
	pgExec(t, "empty the schedule's schema", `DO $$ DECLARE t text; BEGIN
		SELECT string_agg(format('%I.%I', schemaname, tablename), ', ') INTO t FROM pg_tables
			WHERE schemaname = '`+schema+`' AND tablename NOT IN ('schema_migrations', 'schema_functions');
		EXECUTE 'TRUNCATE ' || t;
	END $$`)
}

// dropSchemas drops every schema a schedule used.
func dropSchemas(t *testing.T) {
	pgUsed.Range(func(schema, fn any) bool {
		pgExec(t, "drop the schedules' schemas", fmt.Sprintf("DROP SCHEMA IF EXISTS %s, %s CASCADE", fn, schema))
		return true
	})
}

// pgExec runs sql on a connection of its own, failing t with what it did.
func pgExec(t *testing.T, what, sql string) {
	conn, err := pgx.Connect(context.Background(), server(t, "ONEJOB_TEST_POSTGRES"))
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), sql); err != nil {
		t.Errorf("%s: %v", what, err)
	}
}

// server returns the address of a test server; under the integration tag
// a missing one is a failure, never a skip.
func server(t *testing.T, env string) string {
	v := os.Getenv(env)
	if v == "" {
		t.Fatalf("%s is not set: run ./integration/test.sh, which starts the servers", env)
	}
	return v
}

func openContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// serverSchedules is how many schedules run on each server by default
// (-sim.schedules or $ONEJOB_SIM_SCHEDULES set it as for the others), and
// serverParallel how many run at once: a schedule in real time mostly
// waits.
const (
	serverSchedules = 200
	serverParallel  = 16
)

// TestExactlyOnceOnServers runs the schedules of TestExactlyOnce on the
// ledgers on PostgreSQL and Redis, in compressed real time, both servers
// and serverParallel schedules on each at once (t.Run from many
// goroutines): each is a subtest named by its seed.
func TestExactlyOnceOnServers(t *testing.T) {
	seeds := schedules(t)
	if *seedFlag == 0 && *schedulesFlag == 0 && os.Getenv("ONEJOB_SIM_SCHEDULES") == "" {
		seeds = seeds[:serverSchedules]
	}
	t.Cleanup(func() { dropSchemas(t) })
	var servers sync.WaitGroup
	for _, s := range serverStores {
		servers.Go(func() {
			t.Run(s.name, func(t *testing.T) {
				sem := make(chan struct{}, serverParallel)
				var wg sync.WaitGroup
				for _, seed := range seeds {
					sem <- struct{}{}
					wg.Go(func() {
						defer func() { <-sem }()
						t.Run(strconv.FormatInt(seed, 10), func(t *testing.T) { explore(t, compressed, s, seed) })
					})
				}
				wg.Wait()
				t.Logf("%s: %d schedules", s.name, len(seeds))
			})
		})
	}
	servers.Wait()
}
