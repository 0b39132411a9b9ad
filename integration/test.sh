#!/usr/bin/env bash
# Runs every onejob test: gofmt, go vet, the unit tests with -race (with the
# ledgers' own tests against throwaway PostgreSQL and Redis servers, see
# services.sh, which are stopped on success, failure or interrupt), the
# integration-tagged tests of the built binary and headless Chromium in
# shards by area, then every fuzz target briefly (fuzz.sh) and short chaos
# soaks (chaos/run.sh --short): on PostgreSQL, on Redis, and on Redis
# Cluster with replicas 1.
#
# Every go test runs once per test (-count=1) under a -timeout of its own,
# chosen at about three times what its stage takes on a quiet two-core
# machine; testreport prints each test's result as it ends, then how many
# passed, failed, were skipped or retried (a skip or a retry fails the run),
# what each failed test printed, and after a timeout the tests that were
# running.
#
# Usage: ./integration/test.sh [go test flags for the integration package,
# e.g. -run Postgres; they replace its shards with one run]
set -euo pipefail
cd "$(dirname "$0")/.."
. integration/services.sh

# Each stage says how long the one before it took, and the whole run ends
# with its total.
started=$SECONDS
stage_start=$SECONDS
stage() {
	if [ -n "${stage_name:-}" ]; then
		log "$stage_name took $((SECONDS - stage_start)) s"
	fi
	stage_name=$1
	stage_start=$SECONDS
	log "$1"
}

go build -o "$WORK/testreport" ./integration/testreport

# gotest NAME TIMEOUT ARGS...: go test -race -count=1 -timeout TIMEOUT -json
# ARGS, reported by testreport under NAME.
gotest() {
	local name=$1 timeout=$2
	shift 2
	local status
	set +e
	go test -race -count=1 -timeout "$timeout" -json "$@" 2>&1 | "$WORK/testreport" -stage "$name"
	status=("${PIPESTATUS[@]}")
	set -e
	[ "${status[0]}" -eq 0 ] && [ "${status[1]}" -eq 0 ] || exit 1
}

# --- tests -------------------------------------------------------------------

stage "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || { echo "not gofmt'ed: $unformatted" >&2; exit 1; }

stage "go vet"
go vet ./...
go vet -tags integration ./...

# The unit tests run with the integration tag: the same tests, and the
# ledgers' own against the real servers, in one pass.
stage "unit tests and the ledgers on PostgreSQL and Redis (go test -race -tags integration, every package but ./integration)"
gotest "unit" 20m -tags integration $(go list -tags integration ./... | grep -v '/integration$')

# The integration package, in shards by area (shards.txt), each its own
# go test; every test file of the package is in one shard.
export ONEJOB_TEST_CADDY="$WORK/caddy"
go build -o "$ONEJOB_TEST_CADDY" ./cmd/caddy
if [ $# -gt 0 ]; then
	stage "integration tests ($*)"
	gotest "integration" 30m -tags integration "$@" ./integration
else
	shards=$(integration/shards.sh)
	while read -r area timeout files; do
		tests=$(cd integration && grep -h -o '^func Test[A-Za-z0-9_]*' $files | sed 's/^func //' | grep -v '^TestMain$' | paste -sd '|')
		[ -n "$tests" ] || { echo "shard $area has no tests" >&2; exit 1; }
		stage "integration: $area"
		gotest "integration: $area" "$timeout" -tags integration -run "^($tests)\$" ./integration
	done <<<"$shards"
fi

stage "fuzzing (every target briefly, from its checked-in corpus)"
./integration/fuzz.sh "${FUZZTIME:-10s}"

stage "chaos soak, short (its own PostgreSQL and Redis, restarted mid-run)"
./integration/chaos/run.sh --short
stage "chaos soak on Redis Cluster, short (a master killed, a slot migrated; writes acknowledged by a replica)"
./integration/chaos/run.sh --short --ledger redis-cluster -replicas 1
stage done
log "all tests passed in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
