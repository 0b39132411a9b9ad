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
		i = ++n[name]
		ns[name, i] = $3
		for (f = 4; f < NF; f++) {
			if ($(f + 1) == "cpu-us/op") cpu[name, i] = $f
			if ($(f + 1) == "peak-rss-MiB") rss[name, i] = $f
		}
		if (!(name in seen)) { seen[name] = 1; order[++k] = name }
	}
	function median(arr, name,   i, j, t, m, a) {
		m = n[name]
		for (i = 1; i <= m; i++) a[i] = arr[name, i] + 0
		for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		return a[int((m + 1) / 2)]
	}
	END {
		rp = median(ns, "plain_reverse_proxy"); rs = median(ns, "plain_respond")
		printf "\n%-24s %10s %8s %10s %9s %10s %10s\n", "series", "us/request", "req/s", "cpu-us/req", "peak-MiB", "vs rp", "vs respond"
		for (i = 1; i <= k; i++) {
			m = median(ns, order[i])
			printf "%-24s %10.0f %8.0f %10.1f %9.1f %9.2fx %9.2fx\n", order[i], m / 1000, 1e9 / m, median(cpu, order[i]), median(rss, order[i]), rp / m, rs / m
		}
	}' "$WORK/bench.txt"
