#!/usr/bin/env bash
# Measures the gateway against plain reverse_proxy to the same upstream, in
# one run on loopback (throwaway PostgreSQL as in test.sh), and prints each
# series' requests/s and its ratio to plain reverse_proxy.
#
# Usage: ./integration/bench.sh [benchtime, default 3s] [count, default 3]
set -euo pipefail
cd "$(dirname "$0")/.."
. integration/services.sh

benchtime=${1:-3s}
count=${2:-3}
log "benchmarks (benchtime $benchtime, count $count; medians)"
go test -tags integration -run '^$' -bench '^BenchmarkGateway$' -benchtime "$benchtime" -count "$count" ./integration/ |
	tee "$WORK/bench.txt"
awk '
	/^BenchmarkGateway\// {
		split($1, parts, "/"); name = parts[2]; sub(/-[0-9]+$/, "", name)
		ns[name, ++n[name]] = $3
		if (!(name in seen)) { seen[name] = 1; order[++k] = name }
	}
	function median(name,   i, j, t, m, a) {
		m = n[name]
		for (i = 1; i <= m; i++) a[i] = ns[name, i]
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((m + 1) / 2)]
	}
	END {
		base = median("plain_reverse_proxy")
		printf "\n%-22s %12s %10s %14s\n", "series", "ns/request", "req/s", "vs plain rp"
		for (i = 1; i <= k; i++) {
			m = median(order[i])
			printf "%-22s %12.0f %10.0f %13.2fx\n", order[i], m, 1e9 / m, base / m
		}
	}' "$WORK/bench.txt"
