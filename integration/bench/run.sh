#!/usr/bin/env bash
# Measures the gateway side by side with plain Caddy (same Caddy version)
# and with pgbench running the PostgreSQL ledger's SQL, in one run on
# loopback, and prints one table of medians of five runs with each series'
# ratio to its baseline and its target, the PostgreSQL and Redis series
# with the servers durable (fsync; Redis's append-only file) and their
# fresh series again without, the Redis series on one server and on a
# Redis Cluster with the load on each master, and the top entries of the
# gateway's CPU and allocation profiles under each fresh and replay series (the
# profiles are saved in integration/bench/out/, which git ignores); the
# sweep, rows of the same table: the file ledger and PostgreSQL with 10k,
# 100k and 1M jobs stored beforehand (about 10 minutes: 5 of measured
# runs, the rest storing a million jobs in each; -sweep "" skips it,
# -only sweep runs it alone); then 10,000 clients waiting on one key
# (memory and PostgreSQL ledgers, beside plain Caddy answering as many
# requests fired at once, and holding half as many proxied requests in
# flight), and a 5-minute memory soak. Installs wrk from
# Debian packages when missing; starts throwaway PostgreSQL, Redis and
# Redis Cluster servers (see ../services.sh). About 28 minutes.
#
# Usage: ./integration/bench/run.sh [-duration 5s] [-reps 5] [-only REGEXP] [-soak 5m] [-waiters 10000] [-sweep 10000,100000,1000000] [-sweep-answer BYTES] [-sweep-cache SIZE] [-sweep-dir DIR] [-profiles DIR] [-pin] [-rate N]
set -euo pipefail
cd "$(dirname "$0")/../.."
. integration/services.sh

# services.sh starts PostgreSQL with fsync=off on its command line, which no
# configuration reload overrides, and the bench switches fsync with ALTER
# SYSTEM and pg_reload_conf(). So the server starts again with the same
# options but that one, and fsync=off in postgresql.auto.conf instead: the
# same settings, within the bench's reach.
log "restarting PostgreSQL with fsync=off in its configuration file, where the bench can switch it"
"$PGBIN/psql" -X -q "$ONEJOB_TEST_POSTGRES" -c "ALTER SYSTEM SET fsync = off"
pg_opts=$(sed -e 's/^[^"]*//' -e 's/ *"-c" "fsync=off"//' "$WORK/pg/postmaster.opts")
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/server.log" -w -t 60 -o "$pg_opts" restart >/dev/null ||
	{ cat "$WORK/pg/server.log" >&2; exit 1; }

if ! command -v wrk >/dev/null; then
	log "installing wrk"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends wrk >/dev/null
fi

log "building the gateway and plain Caddy"
go build -o "$WORK/onejob" ./cmd/caddy
go build -o "$WORK/plain" ./integration/bench/plaincaddy
go build -o "$WORK/bench" ./integration/bench

profiles="integration/bench/out/profiles-$(date +%Y%m%d-%H%M%S)"
log "benchmarks (profiles in $profiles)"
"$WORK/bench" -gateway "$WORK/onejob" -plain "$WORK/plain" -pgbench "$PGBIN/pgbench" \
	-postgres "$ONEJOB_TEST_POSTGRES" -redis "$ONEJOB_TEST_REDIS" \
	-redis-cluster "$ONEJOB_TEST_REDIS_CLUSTER" -profiles "$profiles" "$@"
