#!/usr/bin/env bash
# Runs every fuzz target of the module for a short while each, starting from
# its checked-in seed corpus (<package>/testdata/fuzz/<target>/). A failing
# input is written there by go test; keep it as a regression seed once the
# bug is fixed.
#
# Go 1.26's fuzz coordinator can report "context deadline exceeded" when
# -fuzztime ends while a worker is mid-call (golang/go#75804), with no
# failing input. Such a run is reported as a toolchain flake, not a failure;
# a run that wrote a failing input always fails.
#
# Usage: ./integration/fuzz.sh [fuzztime]   (default 10s per target; FUZZTIME works too)
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${1:-${FUZZTIME:-10s}}
# Each target's go test may run for its fuzztime and three minutes more
# (building, the seed corpus, the workers' start and stop); a count of
# runs ("1000x") gets ten minutes.
case "$fuzztime" in
*s) timeout=$((${fuzztime%s} + 180))s ;;
*m) timeout=$((${fuzztime%m} + 3))m ;;
*h) timeout=$((${fuzztime%h} * 60 + 3))m ;;
*) timeout=10m ;;
esac
failed=()
flaked=()
count=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

for pkg in $(go list ./...); do
	dir=$(go list -f '{{.Dir}}' "$pkg")
	if ! list=$(go test -timeout 2m -list '^Fuzz' "$pkg" 2>&1); then
		echo "$list"
		failed+=("$pkg (listing its tests failed)")
		continue
	fi
	targets=$(grep '^Fuzz' <<<"$list" || true)
	for target in $targets; do
		count=$((count + 1))
		corpus="$dir/testdata/fuzz/$target"
		before=$(ls "$corpus" 2>/dev/null || true)
		echo "== $pkg $target ($fuzztime)"
		if go test -timeout "$timeout" -run '^$' -fuzz "^${target}\$" -fuzztime "$fuzztime" "$pkg" >"$out" 2>&1; then
			grep -v '^fuzz: elapsed' "$out" || true
			continue
		fi
		after=$(ls "$corpus" 2>/dev/null || true)
		if [ "$before" = "$after" ] && grep -q 'context deadline exceeded' "$out" &&
			! grep -q -E 'panic:|Failing input written' "$out"; then
			# Shown without go test's FAIL words: no test failed, and a
			# reader (or a log scanner) looking for failures must not
			# count it as one.
			grep -v '^fuzz: elapsed' "$out" | sed -E 's/^(--- )?FAIL:?/\1ended by the deadline race:/' || true
			flaked+=("$pkg $target")
		else
			cat "$out"
			failed+=("$pkg $target")
		fi
	done
done

if [ "$count" -eq 0 ]; then
	echo "no fuzz targets found" >&2
	exit 1
fi
if [ "${#flaked[@]}" -gt 0 ]; then
	echo "ended by the fuzz coordinator's deadline race, no failing input (golang/go#75804):"
	printf '  %s\n' "${flaked[@]}"
fi
if [ "${#failed[@]}" -gt 0 ]; then
	echo "fuzzing failed:" >&2
	printf '  %s\n' "${failed[@]}" >&2
	exit 1
fi
echo "fuzz: $count targets, none failed"
