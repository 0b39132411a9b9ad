#!/usr/bin/env bash
# Runs every onejob test: gofmt, go vet, the unit tests with -race, the
# integration-tagged tests (the built binary, headless Chromium) against
# throwaway PostgreSQL and Redis servers (see services.sh), which are
# stopped on success, failure or interrupt; then every fuzz target briefly
# (fuzz.sh) and short chaos soaks (chaos/run.sh --short): on PostgreSQL, on
# Redis, and on Redis Cluster with replicas 1.
#
# Usage: ./integration/test.sh [go test flags for the integration run, e.g. -run Postgres]
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

# --- tests -------------------------------------------------------------------

stage "gofmt"
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || { echo "not gofmt'ed: $unformatted" >&2; exit 1; }

stage "go vet"
go vet ./...
go vet -tags integration ./...

stage "unit tests (go test -race ./...)"
go test -race -count=1 ./...

stage "integration tests (PostgreSQL, Redis, the built binary)"
set +e
go test -race -count=1 -tags integration -v "$@" ./... 2>&1 | tee "$WORK/integration.log" |
	grep --line-buffered -E '^\s*(--- (PASS|FAIL|SKIP)|FAIL|ok |panic:)'
status=${PIPESTATUS[0]}
set -e
if [ "$status" -ne 0 ]; then
	# The end of the output first, then what each failed test said (the
	# lines go test -v printed while it ran, up to its "--- FAIL"), last,
	# so that a log cut to its end still shows them.
	log "integration tests failed; the end of their output:"
	grep -v -E '^\s*=== (RUN|PAUSE|CONT|NAME)' "$WORK/integration.log" | tail -n 100 >&2
	log "each failed test with what it said:"
	awk -f integration/failures.awk "$WORK/integration.log" >&2
	exit "$status"
fi
if grep -q -- '--- SKIP' "$WORK/integration.log"; then
	echo "integration tests skipped, which the harness forbids:" >&2
	grep -- '--- SKIP' "$WORK/integration.log" >&2
	exit 1
fi
passed=$(grep -c -- '--- PASS' "$WORK/integration.log" || true)
failed=$(grep -c -- '--- FAIL' "$WORK/integration.log" || true)
echo "integration: $passed passed, $failed failed"

stage "fuzzing (every target briefly, from its checked-in corpus)"
./integration/fuzz.sh "${FUZZTIME:-10s}"

stage "chaos soak, short (its own PostgreSQL and Redis, restarted mid-run)"
./integration/chaos/run.sh --short
stage "chaos soak on Redis Cluster, short (a master killed, a slot migrated; writes acknowledged by a replica)"
./integration/chaos/run.sh --short --ledger redis-cluster -replicas 1
stage done
log "all tests passed in $(((SECONDS - started) / 60)) min $(((SECONDS - started) % 60)) s"
