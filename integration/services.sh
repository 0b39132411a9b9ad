#!/usr/bin/env bash
# Sourced by test.sh and bench.sh: installs PostgreSQL, Redis and Chromium from
# Debian packages when they are missing, starts throwaway servers on free
# loopback ports in a temporary directory, exports their addresses as
# ONEJOB_TEST_POSTGRES and ONEJOB_TEST_REDIS, starts a Redis Cluster (three
# masters, three replicas) exported as ONEJOB_TEST_REDIS_CLUSTER, and stops
# them all when the calling script exits, however it exits.

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
	local pid pids=()
	for pid in "$WORK/redis.pid" "$WORK"/cluster/*/redis.pid; do
		[ -f "$pid" ] && pids+=("$(cat "$pid")")
	done
	[ ${#pids[@]} -eq 0 ] || kill "${pids[@]}" 2>/dev/null || true
	# Until they are gone (5 s at most): a Redis server opens its log file
	# for every line, and would write one into a directory being removed.
	for _ in $(seq 1 50); do
		local alive=0
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && alive=1
		done
		[ "$alive" -eq 0 ] && break
		sleep 0.1
	done
	rm -rf "$WORK" || true
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# free_port prints a TCP port on 127.0.0.1 that nothing listens on and that
# is not in TAKEN (ports chosen but not bound yet: free_port runs in a
# subshell, so the caller adds each port it got).
TAKEN=" "
free_port() {
	local p
	for _ in $(seq 1 200); do
		# Below the kernel's ephemeral range (32768 and up), which outgoing
		# connections may hold, and below the range the harnesses hand their
		# gateways (20000 and up, integration/ports), so that a server
		# restarted on its port never finds a gateway there.
		p=$((10000 + RANDOM % 10000))
		case "$TAKEN" in *" $p "*) continue ;; esac
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return
		fi
	done
	echo "no free port found" >&2
	return 1
}

PGPORT=$(free_port)
TAKEN="$TAKEN$PGPORT "
log "starting PostgreSQL ($PGBIN) on 127.0.0.1:$PGPORT"
mkdir -p "$WORK/pg"
[ -z "$PGUSER_OS" ] || chown "$PGUSER_OS" "$WORK/pg"
as_pg "$PGBIN/initdb" -D "$WORK/pg" -U onejob --auth=trust -E UTF8 --no-sync >"$WORK/initdb.log" 2>&1 ||
	{ cat "$WORK/initdb.log" >&2; exit 1; }
as_pg "$PGBIN/pg_ctl" -D "$WORK/pg" -l "$WORK/pg/server.log" -w -t 60 \
	-o "-p $PGPORT -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=off -c max_connections=300" \
	start >/dev/null || { cat "$WORK/pg/server.log" >&2; exit 1; }

REDISPORT=$(free_port)
TAKEN="$TAKEN$REDISPORT "
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

# A Redis Cluster: three masters and a replica of each, every node with its
# cluster bus on a port of its own below the ephemeral range (cluster-port;
# by default it would be the node's port + 10000), a node timeout of two
# seconds so that a replica takes over soon after its master dies.
# ONEJOB_TEST_REDIS_CLUSTER names all three masters, as the ledger's cluster
# URLs do. Each node's settings are in $WORK/cluster/<port>/redis.conf, so
# that a node killed on purpose (the chaos soak kills masters) starts again
# as the same node, on the same ports, with its nodes.conf.
CLUSTER_PORTS=()
for i in 1 2 3 4 5 6; do
	port=$(free_port)
	TAKEN="$TAKEN$port "
	bus=$(free_port)
	TAKEN="$TAKEN$bus "
	CLUSTER_PORTS+=("$port")
	d="$WORK/cluster/$port"
	mkdir -p "$d"
	cat >"$d/redis.conf" <<-EOF
		port $port
		cluster-port $bus
		bind 127.0.0.1
		cluster-enabled yes
		cluster-config-file $d/nodes.conf
		cluster-node-timeout 2000
		save ""
		appendonly no
		dir $d
		daemonize yes
		pidfile $d/redis.pid
		logfile $d/redis.log
	EOF
	redis-server "$d/redis.conf"
done
for port in "${CLUSTER_PORTS[@]}"; do
	for _ in $(seq 1 100); do
		redis-cli -p "$port" ping >/dev/null 2>&1 && break
		sleep 0.1
	done
done
log "starting a Redis Cluster on 127.0.0.1 ports ${CLUSTER_PORTS[*]}"
redis-cli --cluster create $(printf '127.0.0.1:%s ' "${CLUSTER_PORTS[@]}") \
	--cluster-replicas 1 --cluster-yes >"$WORK/cluster/create.log" 2>&1 ||
	{ cat "$WORK/cluster/create.log" >&2; exit 1; }
for port in "${CLUSTER_PORTS[@]}"; do
	for _ in $(seq 1 200); do
		redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
		sleep 0.1
	done
	redis-cli -p "$port" cluster info | grep -q '^cluster_state:ok' ||
		{ echo "Redis Cluster node $port is not ready" >&2; exit 1; }
done
# Until every node knows the three masters (with their slots) and the three
# replicas: replicas attach after the create, by gossip.
cluster_roles() {
	redis-cli -p "$1" cluster nodes | awk '$3 ~ /master/ && NF >= 9 {m++} $3 ~ /slave/ {r++} END {print m + 0, r + 0}'
}
for port in "${CLUSTER_PORTS[@]}"; do
	for _ in $(seq 1 200); do
		[ "$(cluster_roles "$port")" = "3 3" ] && break
		sleep 0.1
	done
	[ "$(cluster_roles "$port")" = "3 3" ] ||
		{ echo "Redis Cluster node $port sees masters and replicas $(cluster_roles "$port")" >&2; exit 1; }
done
CLUSTER_MASTERS=($(redis-cli -p "${CLUSTER_PORTS[0]}" cluster nodes | awk '$3 ~ /master/ && NF >= 9 {split($2, a, "@"); print a[1]}'))
export ONEJOB_TEST_REDIS_CLUSTER="redis://${CLUSTER_MASTERS[0]}?addr=${CLUSTER_MASTERS[1]}&addr=${CLUSTER_MASTERS[2]}"
