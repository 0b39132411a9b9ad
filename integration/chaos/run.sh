#!/usr/bin/env bash
# The chaos soak: three gateways on one shared ledger, 200 retrying clients,
# an upstream that misbehaves on purpose, an instance killed with SIGKILL,
# the ledger's server restarted mid-run, and faults on each instance's link
# to its ledger and cache (lost replies, replies delayed past the client's
# timeout, connections reset mid-call, the ledger unreachable for a few
# seconds); then every job, attempt and answer is checked against what the
# upstream and the clients saw. On Redis Cluster, masters are killed (their
# replicas promoted) and slots migrated instead of restarting a server, and
# the links have no faults.
#
# Usage: ./integration/chaos/run.sh [--short] [--ledger postgres|redis|redis-cluster|both|all] [driver flags...]
#   --short   a CI-sized run (under a minute per ledger)
#   --ledger  which shared ledger to soak: both (the default) is postgres
#             and redis, all adds redis-cluster
# Any further flags go to the driver (go run ./integration/chaos -h), for
# every ledger of the run; -replicas and -fsync-always are for redis-cluster
# alone, e.g. ./integration/chaos/run.sh --ledger redis-cluster -replicas 1 -fsync-always
#
# It starts throwaway PostgreSQL and Redis servers and a Redis Cluster
# (integration/services.sh), which are stopped however the script exits.
# Exit status: 0 when no run found a violation.
set -euo pipefail
cd "$(dirname "$0")/../.."

short=""
ledgers=(postgres redis)
extra=()
while [ $# -gt 0 ]; do
	case "$1" in
	--short) short="-short" ;;
	--ledger)
		[ $# -ge 2 ] || { echo "--ledger needs postgres, redis, redis-cluster, both or all" >&2; exit 2; }
		case "$2" in
		postgres | redis | redis-cluster) ledgers=("$2") ;;
		both) ledgers=(postgres redis) ;;
		all) ledgers=(postgres redis redis-cluster) ;;
		*) echo "--ledger must be postgres, redis, redis-cluster, both or all, not $2" >&2; exit 2 ;;
		esac
		shift
		;;
	*) extra+=("$1") ;;
	esac
	shift
done

. integration/services.sh

log "building the gateway and the chaos driver"
go build -o "$WORK/caddy" ./cmd/caddy
go build -o "$WORK/chaos" ./integration/chaos

# What the driver needs to restart the servers services.sh started.
export WORK PGBIN PGPORT REDISPORT PGUSER_OS

status=0
for l in "${ledgers[@]}"; do
	log "chaos soak on $l"
	if ! "$WORK/chaos" -ledger "$l" -binary "$WORK/caddy" -work "$WORK/chaos-$l" $short ${extra[@]+"${extra[@]}"}; then
		status=1
		# $WORK goes away on exit: keep the gateways' logs for a look.
		kept=$(mktemp -d "${TMPDIR:-/tmp}/onejob-chaos-$l.XXXXXX")
		cp -r "$WORK/chaos-$l/." "$kept/" 2>/dev/null || true
		cp "$WORK/pg/server.log" "$kept/postgres.log" 2>/dev/null || true
		cp "$WORK/redis/redis.log" "$kept/redis.log" 2>/dev/null || true
		for d in "$WORK"/cluster/*/; do
			[ -f "$d/redis.log" ] && cp "$d/redis.log" "$kept/cluster-$(basename "$d").log"
		done
		log "the $l run failed; its logs are in $kept"
	fi
done
exit "$status"
