#!/usr/bin/env bash
# The integration package's shards, which test.sh runs one after another:
# one line each, "area timeout files...". The timeout is at least three
# times what the shard takes on a quiet two-core machine with a warm build
# cache (operators: twice with a cold one, where TestXcaddyBuild compiles
# Caddy afresh, about 5 minutes). Every test file of the
# package with a test in it must be in exactly one shard: a file in none,
# or in two, fails here, so that a new file is not left out of the run.
set -euo pipefail
cd "$(dirname "$0")"

shards=(
	# Ledgers across processes: instances sharing one, restarts, reloads,
	# upgrades, what is stored and who may read it.
	"ledgers 5m instances_test.go lifecycle_test.go upgrade_test.go private_test.go security_test.go"
	# The request's flow through the gateway: keys, replays, providers,
	# failover, lookups, re-sends, clients' preferences, contracts.
	"flow 10m gateway_test.go selection_test.go implicit_test.go jsonexample_test.go providers_test.go lookup_test.go resend_test.go scopes_test.go clientprefs_test.go contract_test.go modeloutput_test.go graphql_test.go sdk_test.go"
	# What operators use: the admin API, the CLI, the jobs page in a
	# browser, the demo, the module as a plugin, traces.
	"operators 15m admin_test.go cli_test.go browser_test.go demo_test.go plugin_test.go tracing_test.go"
	# Faults on real sockets: ledgers down or slow, replies lost, upstreams
	# dying, reloads under load.
	"faults 5m faults_test.go replylost_test.go"
)

declare -A seen
for line in "${shards[@]}"; do
	read -r area _ files <<<"$line"
	for f in $files; do
		[ -f "$f" ] || { echo "shards.sh: $area names $f, which does not exist" >&2; exit 1; }
		[ -z "${seen[$f]:-}" ] || { echo "shards.sh: $f is in $area and in ${seen[$f]}" >&2; exit 1; }
		seen[$f]=$area
	done
done
for f in *_test.go; do
	grep -q '^func Test[A-Z]' "$f" || continue
	[ "$f" != harness_test.go ] || continue # TestMain only
	[ -n "${seen[$f]:-}" ] || { echo "shards.sh: $f is in no shard; add it to one" >&2; exit 1; }
done
printf '%s\n' "${shards[@]}"
