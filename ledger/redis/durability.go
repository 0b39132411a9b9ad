package redis

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// CheckDurability reports, in words for an operator, each setting of the
// server (of every master, on a cluster) that can lose an acknowledged
// reservation and so break the promise that a key is executed once:
// persistence off or lax, eviction, and asynchronous replication; on a
// cluster also masters whose clocks differ by more than a second (each job
// is judged by its master's clock). It returns nil when it found none.
func (l *Ledger) CheckDurability(ctx context.Context) []string {
	if l.cluster == nil {
		return checkServer(ctx, l.client, l.replicas)
	}
	var (
		mu         sync.Mutex
		warn       []string
		first, end time.Time
	)
	err := l.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		addr := c.Options().Addr
		w := checkServer(ctx, c, l.replicas)
		now, terr := c.Time(ctx).Result()
		mu.Lock()
		defer mu.Unlock()
		for _, s := range w {
			warn = append(warn, strings.Replace(s, "redis ledger: ", "redis ledger: master "+addr+": ", 1))
		}
		switch {
		case terr != nil:
			warn = append(warn, fmt.Sprintf("redis ledger: master %s: could not read its clock: %v", addr, terr))
		case first.IsZero():
			first, end = now, now
		default:
			first, end = minTime(first, now), maxTime(end, now)
		}
		return nil
	})
	if err != nil {
		warn = append(warn, fmt.Sprintf("redis ledger: could not reach every master of the cluster to check its settings: %v", err))
	}
	if d := end.Sub(first); d > time.Second {
		warn = append(warn, fmt.Sprintf("redis ledger: the cluster's masters' clocks differ by %v: each job's deadlines and retention "+
			"are judged by its own master's clock, so they stretch or shrink by as much from one job to another; synchronize them (NTP)", d.Round(time.Millisecond)))
	}
	slices.Sort(warn)
	return warn
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// checkServer checks the settings of one server, whose writes the ledger
// has acknowledged by wait replicas (Options.Replicas).
func checkServer(ctx context.Context, client redis.Cmdable, wait int) []string {
	var warn []string
	get := func(name string) (string, error) {
		m, err := client.ConfigGet(ctx, name).Result()
		if err != nil {
			return "", err
		}
		v, ok := m[name]
		if !ok {
			return "", fmt.Errorf("CONFIG GET %s returned nothing", name)
		}
		return v, nil
	}
	if v, err := get("appendonly"); err != nil {
		warn = append(warn, fmt.Sprintf("redis ledger: could not check the server's persistence and eviction settings (%v): "+
			"make sure it runs with appendonly yes, appendfsync always (or everysec) and maxmemory-policy noeviction, "+
			"or a reservation can be lost and its key executed twice", err))
	} else {
		if v != "yes" {
			warn = append(warn, fmt.Sprintf("redis ledger: appendonly is %q: a restart loses reservations written since the last snapshot, "+
				"and their keys can be executed again; set appendonly yes", v))
		}
		switch fsync, err := get("appendfsync"); {
		case v != "yes":
			// appendfsync matters only with the append-only file on.
		case err != nil:
			warn = append(warn, fmt.Sprintf("redis ledger: could not check appendfsync: %v", err))
		case fsync == "everysec":
			warn = append(warn, "redis ledger: appendfsync is \"everysec\": a crash of the server can lose the last second of reservations; "+
				"set appendfsync always for none")
		case fsync != "always":
			warn = append(warn, fmt.Sprintf("redis ledger: appendfsync is %q: a crash of the server can lose reservations the ledger acknowledged; "+
				"set appendfsync always (or everysec)", fsync))
		}
		switch policy, err := get("maxmemory-policy"); {
		case err != nil:
			warn = append(warn, fmt.Sprintf("redis ledger: could not check maxmemory-policy: %v", err))
		case policy != "noeviction":
			warn = append(warn, fmt.Sprintf("redis ledger: maxmemory-policy is %q: under memory pressure the server can evict jobs "+
				"and their keys be executed again; set maxmemory-policy noeviction", policy))
		}
	}
	info, err := client.Info(ctx, "replication").Result()
	if err != nil {
		return append(warn, fmt.Sprintf("redis ledger: could not check replication (%v): asynchronous replication "+
			"can lose acknowledged reservations on a failover", err))
	}
	role, replicas, found := "", 0, false
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "role":
			role, found = v, true
		case "connected_slaves":
			replicas, _ = strconv.Atoi(v)
		}
	}
	switch {
	case !found:
		warn = append(warn, "redis ledger: could not check replication (INFO replication shows no role): asynchronous replication "+
			"can lose acknowledged reservations on a failover")
	case role != "master":
		warn = append(warn, fmt.Sprintf("redis ledger: the server is a replica (role %s): writes to it are refused or lost, "+
			"and a replica promoted after a failover can lack reservations its primary acknowledged", role))
	case replicas < wait:
		warn = append(warn, fmt.Sprintf("redis ledger: the server has %d connected replica(s) and replicas is %d: "+
			"every transition fails (requests get 503) until %d replica(s) acknowledge its writes", replicas, wait, wait))
	case wait > 0 && replicas > wait:
		warn = append(warn, fmt.Sprintf("redis ledger: the server has %d connected replica(s) and replicas is %d: "+
			"a failover to a replica that had not acknowledged a reservation yet can lose it, and its key be executed again; "+
			"Redis does not promise to promote one that did", replicas, wait))
	case wait == 0 && replicas > 0:
		warn = append(warn, fmt.Sprintf("redis ledger: the server has %d connected replica(s): replication is asynchronous, "+
			"so a failover can lose reservations the primary acknowledged and their keys be executed again (replicas %d closes that window)", replicas, replicas))
	}
	return warn
}
