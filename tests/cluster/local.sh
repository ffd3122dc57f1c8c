# The pg_regress harness's cluster (tests/run_regress.sh), as local
# servers made by scripts/cluster.sh. Sourced; the harness sets $repo and
# the PGSHARD_* variables. tests/cluster/docker.sh offers the same functions
# for the Docker images.

as_server_user() {
    if [ "$(id -u)" -eq 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

node_data() {
    echo "$(readlink -f "$PGSHARD_CLUSTER_DIR")/$1"
}

# A fresh cluster, its nodes answering, the test database on each.
cluster_start() {
    "$repo/scripts/cluster.sh" destroy
    "$repo/scripts/cluster.sh" start >/dev/null
}

cluster_cleanup() {
    if [ "${PGSHARD_KEEP_CLUSTER:-0}" = 1 ]; then
        "$repo/scripts/cluster.sh" stop
    else
        "$repo/scripts/cluster.sh" destroy
    fi
}

node_stop() {
    as_server_user "$(pg_config --bindir)/pg_ctl" --pgdata="$(node_data "$1")" \
        --mode=fast --wait --silent stop
}

node_start() {
    as_server_user "$(pg_config --bindir)/pg_ctl" --pgdata="$(node_data "$1")" \
        --log="$(node_data "$1")/server.log" --wait --silent start
}

node_restart() {
    as_server_user "$(pg_config --bindir)/pg_ctl" --pgdata="$(node_data "$1")" \
        --log="$(node_data "$1")/server.log" --mode=fast --wait --silent restart
}

# node_log_mark NODE prints a mark; node_log_since NODE MARK prints what the
# node logged after it.
node_log_mark() {
    echo $(($(stat -c %s "$(node_data "$1")/server.log") + 1))
}

node_log_since() {
    tail -c +"$2" "$(node_data "$1")/server.log"
}
