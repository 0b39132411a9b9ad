package main

import (
	"context"
	"fmt"
	"log"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// durability is what a series asks of the PostgreSQL and Redis servers.
type durability int

const (
	// anyDurability: the series uses neither PostgreSQL nor Redis.
	anyDurability durability = iota
	// durable: as users run the servers. PostgreSQL flushes each commit
	// to disk before it answers (fsync and synchronous_commit on); Redis
	// appends every write to its append-only file and flushes that every
	// second (appendonly yes, appendfsync everysec).
	durable
	// nondurable: as integration/services.sh starts the servers for the
	// test suite: PostgreSQL without fsync, Redis without an append-only
	// file (appendfsync is then unused; it stays at Redis's default).
	nondurable
)

// postgresSettings and redisSettings are the settings the bench switches
// on each server, with their values as SHOW and CONFIG GET spell them.
type postgresSettings struct{ fsync, synchronousCommit string }
type redisSettings struct{ appendonly, appendfsync string }

// levels are the settings of each durability.
var levels = map[durability]struct {
	postgres postgresSettings
	redis    redisSettings
}{
	durable:    {postgresSettings{fsync: "on", synchronousCommit: "on"}, redisSettings{appendonly: "yes", appendfsync: "everysec"}},
	nondurable: {postgresSettings{fsync: "off", synchronousCommit: "on"}, redisSettings{appendonly: "no", appendfsync: "everysec"}},
}

func (d durability) String() string {
	l := levels[d]
	return fmt.Sprintf("PostgreSQL fsync %s, synchronous_commit %s; Redis appendonly %s, appendfsync %s",
		l.postgres.fsync, l.postgres.synchronousCommit, l.redis.appendonly, l.redis.appendfsync)
}

// settings are what the servers have: PostgreSQL's, and each Redis
// server's by address.
type settings struct {
	postgres postgresSettings
	redis    map[string]redisSettings
}

func (s settings) String() string {
	out := fmt.Sprintf("PostgreSQL fsync %s, synchronous_commit %s", s.postgres.fsync, s.postgres.synchronousCommit)
	// The Redis servers by their settings, each setting once.
	byValue := map[redisSettings][]string{}
	for addr, r := range s.redis {
		byValue[r] = append(byValue[r], addr)
	}
	for _, r := range slices.SortedFunc(maps.Keys(byValue), func(a, b redisSettings) int {
		return strings.Compare(a.appendonly+a.appendfsync, b.appendonly+b.appendfsync)
	}) {
		out += fmt.Sprintf("; Redis appendonly %s, appendfsync %s on %d servers (%s)",
			r.appendonly, r.appendfsync, len(byValue[r]), strings.Join(slices.Sorted(slices.Values(byValue[r])), " "))
	}
	return out
}

// servers are the PostgreSQL and Redis servers under the ledger series:
// PostgreSQL, the single Redis server and every node of the Redis
// Cluster (the replicas too: each keeps an append-only file of its own).
type servers struct {
	postgres *pgx.Conn
	redis    map[string]*redis.Client // by address
}

func openServers(ctx context.Context, cfg config) (*servers, error) {
	if cfg.postgres == "" {
		return nil, fmt.Errorf("no PostgreSQL (-postgres) to set the durability of")
	}
	s := &servers{redis: map[string]*redis.Client{}}
	var err error
	if s.postgres, err = pgx.Connect(ctx, cfg.postgres); err != nil {
		return nil, fmt.Errorf("PostgreSQL: %w", err)
	}
	for _, url := range []string{cfg.redis, cfg.redisCluster} {
		if url == "" {
			continue
		}
		o, err := redisOptions(url)
		if err != nil {
			s.close()
			return nil, err
		}
		nodes, err := clusterNodes(ctx, o)
		if err != nil {
			s.close()
			return nil, fmt.Errorf("Redis %s: %w", o.Addr, err)
		}
		if nodes == nil {
			nodes = []clusterNode{{addr: o.Addr}}
		}
		for _, n := range nodes {
			no := *o
			no.Addr = n.addr
			s.redis[n.addr] = redis.NewClient(&no)
		}
	}
	return s, nil
}

func (s *servers) close() {
	s.postgres.Close(context.Background())
	for _, c := range s.redis {
		c.Close()
	}
}

// at returns the settings of a durability on every server.
func (s *servers) at(d durability) settings {
	want := settings{postgres: levels[d].postgres, redis: map[string]redisSettings{}}
	for addr := range s.redis {
		want.redis[addr] = levels[d].redis
	}
	return want
}

// read returns what the servers have now.
func (s *servers) read(ctx context.Context) (settings, error) {
	have := settings{redis: map[string]redisSettings{}}
	var err error
	if have.postgres, err = readPostgres(ctx, s.postgres); err != nil {
		return have, err
	}
	for addr, c := range s.redis {
		if have.redis[addr], err = readRedis(ctx, c); err != nil {
			return have, fmt.Errorf("Redis %s: %w", addr, err)
		}
	}
	return have, nil
}

// apply gives every server its settings in want and returns once they have
// taken effect.
func (s *servers) apply(ctx context.Context, want settings) error {
	if err := setPostgres(ctx, s.postgres, want.postgres); err != nil {
		return err
	}
	for _, addr := range slices.Sorted(maps.Keys(s.redis)) {
		if err := setRedis(ctx, s.redis[addr], want.redis[addr]); err != nil {
			return fmt.Errorf("Redis %s: %w", addr, err)
		}
	}
	return nil
}

func readPostgres(ctx context.Context, c *pgx.Conn) (postgresSettings, error) {
	var have postgresSettings
	if err := c.QueryRow(ctx, "SHOW fsync").Scan(&have.fsync); err != nil {
		return have, fmt.Errorf("PostgreSQL: SHOW fsync: %w", err)
	}
	if err := c.QueryRow(ctx, "SHOW synchronous_commit").Scan(&have.synchronousCommit); err != nil {
		return have, fmt.Errorf("PostgreSQL: SHOW synchronous_commit: %w", err)
	}
	return have, nil
}

// setPostgres sets fsync and synchronous_commit with ALTER SYSTEM and
// reloads the configuration (neither needs a restart), then waits until
// SHOW reports them: the reload is asynchronous (the postmaster rereads
// the configuration and signals every process, this connection's
// included, which rereads it before its next command). A setting given on
// the server's command line is out of a reload's reach: that is an error.
func setPostgres(ctx context.Context, c *pgx.Conn, want postgresSettings) error {
	have, err := readPostgres(ctx, c)
	if err != nil || have == want {
		return err
	}
	for _, set := range []struct{ name, value string }{
		{"fsync", want.fsync},
		{"synchronous_commit", want.synchronousCommit},
	} {
		if _, err := c.Exec(ctx, "ALTER SYSTEM SET "+set.name+" = '"+strings.ReplaceAll(set.value, "'", "''")+"'"); err != nil {
			return fmt.Errorf("PostgreSQL: ALTER SYSTEM SET %s: %w", set.name, err)
		}
	}
	if _, err := c.Exec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return fmt.Errorf("PostgreSQL: pg_reload_conf(): %w", err)
	}
	var readErr error
	waited := until(10*time.Second, func() bool {
		have, readErr = readPostgres(ctx, c)
		return readErr != nil || have == want
	})
	if readErr != nil {
		return readErr
	}
	if waited != nil {
		var source string
		c.QueryRow(ctx, "SELECT source FROM pg_settings WHERE name = 'fsync'").Scan(&source)
		return fmt.Errorf("PostgreSQL: after ALTER SYSTEM and pg_reload_conf(), SHOW gives fsync %s (its source: %s), synchronous_commit %s: want fsync %s, synchronous_commit %s (a setting on the server's command line, -c, is beyond a reload: run.sh restarts the server without it)",
			have.fsync, source, have.synchronousCommit, want.fsync, want.synchronousCommit)
	}
	if have.fsync != "on" {
		return nil
	}
	// What was written without fsync is flushed now, not by a checkpoint
	// under a measured run.
	if _, err := c.Exec(ctx, "CHECKPOINT"); err != nil {
		return fmt.Errorf("PostgreSQL: CHECKPOINT: %w", err)
	}
	return nil
}

func readRedis(ctx context.Context, c *redis.Client) (redisSettings, error) {
	var have redisSettings
	for _, get := range []struct {
		name  string
		value *string
	}{{"appendonly", &have.appendonly}, {"appendfsync", &have.appendfsync}} {
		m, err := c.ConfigGet(ctx, get.name).Result()
		if err != nil {
			return have, fmt.Errorf("CONFIG GET %s: %w", get.name, err)
		}
		v, ok := m[get.name]
		if !ok {
			return have, fmt.Errorf("CONFIG GET %s: no such setting", get.name)
		}
		*get.value = v
	}
	return have, nil
}

// setRedis sets appendonly, then appendfsync, and waits until the rewrite
// of the append-only file that turning it on starts (or schedules, when a
// child is at work) is over: until then Redis is not appending.
func setRedis(ctx context.Context, c *redis.Client, want redisSettings) error {
	have, err := readRedis(ctx, c)
	if err != nil || have == want {
		return err
	}
	for _, set := range []struct{ name, value string }{
		{"appendonly", want.appendonly},
		{"appendfsync", want.appendfsync},
	} {
		if err := c.ConfigSet(ctx, set.name, set.value).Err(); err != nil {
			return fmt.Errorf("CONFIG SET %s %s: %w", set.name, set.value, err)
		}
	}
	var info map[string]string
	var infoErr error
	waited := until(2*time.Minute, func() bool {
		var raw string
		if raw, infoErr = c.Info(ctx, "persistence").Result(); infoErr != nil {
			return true
		}
		info = parseInfo(raw)
		return info["aof_rewrite_in_progress"] == "0" && info["aof_rewrite_scheduled"] == "0"
	})
	switch {
	case infoErr != nil:
		return fmt.Errorf("INFO persistence: %w", infoErr)
	case waited != nil:
		return fmt.Errorf("waiting for the append-only file's rewrite: %w", waited)
	case want.appendonly == "yes" && info["aof_last_bgrewrite_status"] != "ok":
		return fmt.Errorf("the append-only file's rewrite failed (aof_last_bgrewrite_status %s)", info["aof_last_bgrewrite_status"])
	}
	if have, err = readRedis(ctx, c); err == nil && have != want {
		err = fmt.Errorf("CONFIG GET gives appendonly %s, appendfsync %s after CONFIG SET", have.appendonly, have.appendfsync)
	}
	return err
}

// parseInfo returns the fields of an INFO answer.
func parseInfo(raw string) map[string]string {
	out := map[string]string{}
	for _, line := range strings.Split(raw, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// durabilitySwitch gives each series the durability it asks for,
// switching the servers only when that changes, and gives them back at
// the end the settings they had before the first switch.
type durabilitySwitch struct {
	cfg     config
	servers *servers // nil until a series asks
	start   settings
	now     durability
}

func (d *durabilitySwitch) set(ctx context.Context, want durability) error {
	if want == anyDurability || want == d.now {
		return nil
	}
	if d.servers == nil {
		s, err := openServers(ctx, d.cfg)
		if err != nil {
			return err
		}
		if d.start, err = s.read(ctx); err != nil {
			s.close()
			return err
		}
		d.servers = s
		log.Printf("durability at the start: %v", d.start)
	}
	if err := d.servers.apply(ctx, d.servers.at(want)); err != nil {
		return err
	}
	d.now = want
	have, err := d.servers.read(ctx)
	if err != nil {
		return err
	}
	log.Printf("durability for the next series: %v", have)
	return nil
}

// restore gives the servers back the settings they had at the start.
func (d *durabilitySwitch) restore(ctx context.Context) error {
	if d.servers == nil {
		return nil
	}
	defer d.servers.close()
	if err := d.servers.apply(ctx, d.start); err != nil {
		return err
	}
	have, err := d.servers.read(ctx)
	if err != nil {
		return err
	}
	log.Printf("durability restored: %v", have)
	return nil
}
