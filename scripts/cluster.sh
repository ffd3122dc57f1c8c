#!/usr/bin/env bash
# A local pg_shard cluster of real PostgreSQL 15 servers on 127.0.0.1:
# one metadata node and N workers, each in its own data directory.
#
#   scripts/cluster.sh start   create (if needed) and start every node
#   scripts/cluster.sh restart stop, then start (picks up a newly installed pg_shard,
#                              which every server preloads)
#   scripts/cluster.sh stop    stop every node
#   scripts/cluster.sh status  show which nodes run
#   scripts/cluster.sh destroy stop and remove the data
#   scripts/cluster.sh conf PORT SOCKET_DIR
#                              print a node's settings (for a server to compare with)
#
# Settings (environment):
#   PGSHARD_CLUSTER_DIR  data folder          (default: <repo>/.cluster)
#   PGSHARD_BASE_PORT    metadata node port   (default: 54320; workers follow)
#   PGSHARD_WORKERS      number of workers    (default: 2)
#   PGSHARD_DATABASE     database created on every node (default: pg_shard_demo)
#   PGSHARD_COORDINATOR_PORT     coordinator port (default: 6432; for another
#                                PGSHARD_BASE_PORT, that port + 100)
#   PGSHARD_COORDINATOR_METRICS  its /metrics address (default: 127.0.0.1:9932;
#                                for another base port, 127.0.0.1:<base + 101>)
#   PGSHARD_COORDINATOR_BIN      its binary (default: the release build); the
#                                coordinator is started when the binary exists
# As root, the servers run as the postgres OS user (PostgreSQL refuses root).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cluster_link=${PGSHARD_CLUSTER_DIR:-$repo/.cluster}
cluster_dir=$cluster_link
base_port=${PGSHARD_BASE_PORT:-54320}
workers=${PGSHARD_WORKERS:-2}
database=${PGSHARD_DATABASE:-pg_shard_demo}
bindir=$(pg_config --bindir)
# The standard ports for the standard cluster; a cluster on other ports (tests,
# benchmarks) gets its coordinator 100 ports above its metadata node.
if [ "$base_port" = 54320 ]; then
    coordinator_port=${PGSHARD_COORDINATOR_PORT:-6432}
    coordinator_metrics=${PGSHARD_COORDINATOR_METRICS:-127.0.0.1:9932}
else
    coordinator_port=${PGSHARD_COORDINATOR_PORT:-$((base_port + 100))}
    coordinator_metrics=${PGSHARD_COORDINATOR_METRICS:-127.0.0.1:$((base_port + 101))}
fi
coordinator_bin=${PGSHARD_COORDINATOR_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/pg_shard_coordinator}

as_server_user() {
    if [ "$(id -u)" -eq 0 ]; then
        # from /, since the postgres user may not be able to enter the current folder
        (cd / && runuser -u postgres -- "$@")
    else
        "$@"
    fi
}

# The server user must reach the data folder. A repository under a private
# folder (mktemp -d makes them 0700) is not reachable by postgres: then the
# data lives under /var/tmp and the repository folder is a symlink to it.
prepare_dir() {
    if [ -L "$cluster_link" ] || [ -d "$cluster_link" ]; then
        return
    fi
    mkdir -p "$cluster_dir"
    if [ "$(id -u)" -eq 0 ]; then
        chown postgres:postgres "$cluster_dir"
        if ! (cd / && runuser -u postgres -- test -w "$cluster_dir"); then
            rmdir "$cluster_dir"
            local outside
            outside=/var/tmp/pg_shard-clusters/$(printf '%s' "$cluster_dir" | cksum | cut -d' ' -f1)
            mkdir -p "$outside"
            chown postgres:postgres "$outside"
            chmod 755 /var/tmp/pg_shard-clusters
            ln -s "$outside" "$cluster_dir"
        fi
    fi
}

# Past the symlink, if any: the server user may not be able to pass through
# the repository folder.
resolve_dir() {
    if [ -e "$cluster_link" ]; then
        cluster_dir=$(readlink -f "$cluster_link")
    fi
}

node_names() {
    echo metadata
    for i in $(seq 1 "$workers"); do echo "worker$i"; done
}

node_port() {
    case "$1" in
        metadata) echo "$base_port" ;;
        worker*) echo $((base_port + ${1#worker})) ;;
    esac
}

init_node() {
    local name=$1 port=$2 data=$cluster_dir/$1
    if [ -f "$data/PG_VERSION" ]; then
        return
    fi
    as_server_user "$bindir/initdb" --pgdata="$data" --auth=trust --encoding=UTF8 \
        --locale=C.UTF-8 --username=postgres >/dev/null
    node_conf "$port" "$cluster_dir" >>"$data/postgresql.conf"
}

# A node's settings (also for a plain server compared with the cluster:
# benches/coordinator.sh).
node_conf() {
    local port=$1 socket_dir=$2
    cat <<CONF
# pg_shard local cluster
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$socket_dir'
wal_level = logical
max_replication_slots = 16
max_wal_senders = 16
# job runners (one per database, and one briefly per queued job), the
# launcher, logical replication apply workers, parallel query workers
max_worker_processes = 32
# two-phase commit of the metadata node's remote transactions
max_prepared_transactions = 64
max_connections = 200
shared_buffers = 128MB
fsync = off
synchronous_commit = off
full_page_writes = off
logging_collector = off
CONF
}

# pg_shard's read fence (an executor hook) must be active in every backend.
ensure_preload() {
    local conf=$1/postgresql.conf
    if ! grep -q "^shared_preload_libraries = 'pg_shard'" "$conf"; then
        echo "shared_preload_libraries = 'pg_shard'" >>"$conf"
    fi
}

start() {
    prepare_dir
    resolve_dir
    for name in $(node_names); do
        local port data=$cluster_dir/$name
        port=$(node_port "$name")
        init_node "$name" "$port"
        ensure_preload "$data"
        if as_server_user "$bindir/pg_ctl" --pgdata="$data" status >/dev/null 2>&1; then
            continue
        fi
        # Without RUST_BACKTRACE, pgrx keeps Rust backtraces out of error details.
        as_server_user env -u RUST_BACKTRACE -u RUST_LIB_BACKTRACE \
            "$bindir/pg_ctl" --pgdata="$data" --log="$data/server.log" \
            --wait --silent start
    done
    for name in $(node_names); do
        local port
        port=$(node_port "$name")
        if ! psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atqc \
            "SELECT 1 FROM pg_database WHERE datname = '$database'" | grep -q 1; then
            psql -h 127.0.0.1 -p "$port" -U postgres -d postgres -qc "CREATE DATABASE \"$database\""
        fi
    done
    start_coordinator
    echo "cluster up: metadata 127.0.0.1:$base_port, workers" \
        "$(for i in $(seq 1 "$workers"); do printf '127.0.0.1:%s ' $((base_port + i)); done)" \
        "database $database (data in $cluster_dir)"
}

# The coordinator: clients' front door on 127.0.0.1:$coordinator_port. Clients
# are authenticated by the metadata node (passthrough, the default).
start_coordinator() {
    local pidfile=$cluster_dir/coordinator.pid
    if [ ! -x "$coordinator_bin" ]; then
        echo "no coordinator binary at $coordinator_bin (make install builds it); not started" >&2
        return
    fi
    if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        return
    fi
    # Servers on this machine are reached through their Unix-domain sockets.
    # In a session of its own, as a service manager (or pgbouncer -d) runs
    # it: the scheduler then shares the CPU between it and the shell's
    # programs (a benchmark's clients) instead of among them.
    setsid nohup "$coordinator_bin" --listen "127.0.0.1:$coordinator_port" \
        --metadata "127.0.0.1:$base_port" --metrics-listen "$coordinator_metrics" \
        --server-socket-dir "$cluster_dir" \
        >>"$cluster_dir/coordinator.log" 2>&1 &
    echo $! >"$pidfile"
    for _ in $(seq 1 50); do
        if psql -X -h 127.0.0.1 -p "$coordinator_port" -U postgres -d "$database" -Atqc "SELECT 1" \
            >/dev/null 2>&1; then
            echo "coordinator up: 127.0.0.1:$coordinator_port (log $cluster_dir/coordinator.log)"
            return
        fi
        sleep 0.1
    done
    echo "coordinator did not come up; see $cluster_dir/coordinator.log" >&2
    return 1
}

stop_coordinator() {
    local pidfile=$cluster_dir/coordinator.pid
    if [ -f "$pidfile" ]; then
        local pid
        pid=$(cat "$pidfile")
        if kill "$pid" 2>/dev/null; then
            for _ in $(seq 1 50); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
        fi
        rm -f "$pidfile"
    fi
}

stop() {
    [ -e "$cluster_link" ] || return 0
    resolve_dir
    stop_coordinator
    for name in $(node_names); do
        local data=$cluster_dir/$name
        if [ -f "$data/postmaster.pid" ]; then
            as_server_user "$bindir/pg_ctl" --pgdata="$data" --mode=fast --wait --silent stop || true
        fi
    done
}

status() {
    resolve_dir
    for name in $(node_names); do
        local data=$cluster_dir/$name
        if [ -f "$data/PG_VERSION" ] &&
            as_server_user "$bindir/pg_ctl" --pgdata="$data" status >/dev/null 2>&1; then
            echo "$name: running on 127.0.0.1:$(node_port "$name")"
        else
            echo "$name: stopped"
        fi
    done
    if [ -f "$cluster_dir/coordinator.pid" ] && kill -0 "$(cat "$cluster_dir/coordinator.pid")" 2>/dev/null; then
        echo "coordinator: running on 127.0.0.1:$coordinator_port"
    else
        echo "coordinator: stopped"
    fi
}

destroy() {
    stop
    if [ -L "$cluster_link" ]; then
        rm -rf "$(readlink -f "$cluster_link")"
    fi
    rm -rf "$cluster_link"
}

case "${1:-}" in
    start) start ;;
    restart) stop; start ;;
    stop) stop ;;
    status) status ;;
    destroy) destroy ;;
    conf) node_conf "$2" "$3" ;;
    *) echo "usage: $0 start|restart|stop|status|destroy|conf PORT SOCKET_DIR" >&2; exit 2 ;;
esac
