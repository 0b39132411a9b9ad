#!/usr/bin/env bash
# Sourced by test.sh and bench.sh: installs PostgreSQL, Redis and Chromium from
# Debian packages when they are missing, starts throwaway servers on free
# loopback ports in a temporary directory, exports their addresses as
# ONEJOB_TEST_POSTGRES and ONEJOB_TEST_REDIS, and stops them when the
# calling script exits, however it exits.

log() { printf '==> %s\n' "$*" >&2; }

if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
	export PATH="$PATH:/usr/local/go/bin"
fi
command -v go >/dev/null || { echo "Go 1.26 or newer is required: https://go.dev/dl/" >&2; exit 1; }

# --- install what is missing -------------------------------------------------

pg_bindir() {
	if command -v pg_ctl >/dev/null && command -v initdb >/dev/null; then
		dirname "$(readlink -f "$(command -v pg_ctl)")"
		return
	fi
	local d
	d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
	[ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

missing=()
[ -n "$(pg_bindir)" ] || missing+=(postgresql)
command -v redis-server >/dev/null || missing+=(redis-server)
[ -x /usr/bin/chromium ] || missing+=(chromium) # the browser tests drive it headless
if [ ${#missing[@]} -gt 0 ]; then
	log "installing ${missing[*]}"
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	$sudo apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# The packages may start system-wide servers; ours are separate.
fi
PGBIN=$(pg_bindir)
[ -n "$PGBIN" ] || { echo "PostgreSQL binaries not found after install" >&2; exit 1; }

# --- throwaway servers -------------------------------------------------------

WORK=$(mktemp -d "${TMPDIR:-/tmp}/onejob-test.XXXXXX")
chmod 755 "$WORK"
PGUSER_OS=""   # the unprivileged user PostgreSQL runs as when we are root
if [ "$(id -u)" -eq 0 ]; then
	if id postgres >/dev/null 2>&1; then PGUSER_OS=postgres; else PGUSER_OS=nobody; fi
fi
as_pg() {
	if [ -n "$PGUSER_OS" ]; then
		runuser -u "$PGUSER_OS" -- "$@"
	else
		"$@"
	fi
}

cleanup() {
	local rc=$?
	trap - EXIT INT TERM
	if [ -f "$WORK/pg/postmaster.pid" ]; then
		as_pg "$PGBIN/pg_ctl" -D "$WORK/pg" -m immediate -w stop >/dev/null 2>&1 || true
	fi
	if [ -f "$WORK/redis.pid" ]; then
		kill "$(cat "$WORK/redis.pid")" 2>/dev/null || true
	fi
	rm -rf "$WORK"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port prints a TCP port on 127.0.0.1 that nothing listens on.
free_port() {
	local p
	for _ in $(seq 1 200); do
		# Below the kernel's ephemeral range (32768 and up), which outgoing
		# connections may hold.
		p=$((10000 + RANDOM % 22000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	echo "no free port found" >&2
	return 1
}

PGPORT=$(free_port)
log "starting PostgreSQL ($PGBIN) on 127.0.0.1:$PGPORT"
mkdir -p "$WORK/pg"
[ -z "$PGUSER_OS" ] || chown "$PGUSER_OS" "$WORK/pg"
as_pg "$PGBIN/initdb" -D "$WORK/pg" -U onejob --auth=trust -E UTF8 --no-sync >"$WORK/initdb.log" 2>&1 ||
	{ cat "$WORK/initdb.log" >&2; exit 1; }
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/server.log" -w -t 60 \
	-o "-p $PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off -c max_connections=300" \
	start >/dev/null || { cat "$WORK/pg/server.log" >&2; exit 1; }

REDISPORT=$(free_port)
log "starting Redis on 127.0.0.1:$REDISPORT"
mkdir -p "$WORK/redis"
redis-server --port "$REDISPORT" --bind 127.0.0.1 --save "" --appendonly no \
	--dir "$WORK/redis" --daemonize yes --pidfile "$WORK/redis.pid" \
	--logfile "$WORK/redis/redis.log"
for _ in $(seq 1 100); do
	(exec 3<>"/dev/tcp/127.0.0.1/$REDISPORT") 2>/dev/null && break
	sleep 0.1
done

export ONEJOB_TEST_POSTGRES="postgres://onejob@127.0.0.1:$PGPORT/postgres?sslmode=disable"
export ONEJOB_TEST_REDIS="redis://127.0.0.1:$REDISPORT/0"

