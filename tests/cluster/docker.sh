# The pg_regress harness's cluster (tests/run_regress.sh) as containers of
# the project's Docker images: docker/compose.yaml with docker/compose.test.yaml
# (a third worker, test settings), on the ports the suites expect. Sourced;
# tests/docker/run.sh builds the images and sets POSTGRES_PASSWORD and
# PGPASSWORD. Same functions as tests/cluster/local.sh.

docker_compose() {
    docker-compose --project-name "${PGSHARD_COMPOSE_PROJECT:-pg_shard_test}" \
        --file "$repo/docker/compose.yaml" --file "$repo/docker/compose.test.yaml" "$@"
}

export PGSHARD_METADATA_PORT=$PGSHARD_BASE_PORT
export PGSHARD_WORKER1_PORT=$((PGSHARD_BASE_PORT + 1))
export PGSHARD_WORKER2_PORT=$((PGSHARD_BASE_PORT + 2))
export PGSHARD_WORKER3_PORT=$((PGSHARD_BASE_PORT + 3))
export PGSHARD_COORDINATOR_PORT=$((PGSHARD_BASE_PORT + 100))
export PGSHARD_METRICS_PORT=$((PGSHARD_BASE_PORT + 101))
# compose.yaml registers the workers in its own database; the suites make
# theirs (pg_shard_regress) and register them there themselves.
export POSTGRES_DB=${POSTGRES_DB:-pg_shard_docker}

node_port() {
    case "$1" in
    metadata) echo "$PGSHARD_BASE_PORT" ;;
    worker*) echo $((PGSHARD_BASE_PORT + ${1#worker})) ;;
    esac
}

cluster_start() {
    docker_compose down --volumes --remove-orphans >/dev/null 2>&1 || true
    docker_compose up --detach >/dev/null
    local tries=0 state
    # Up once `register` has made the cluster and the coordinator answers.
    until state=$(docker inspect --format '{{.State.Status}} {{.State.ExitCode}}' \
        "$(docker_compose ps -q register)" 2>/dev/null) && [ "$state" = "exited 0" ] &&
        pg_isready -q -h 127.0.0.1 -p "$PGSHARD_COORDINATOR_PORT"; do
        tries=$((tries + 1))
        if [ "$tries" -ge 180 ] || [[ "$state" == exited\ [1-9]* ]]; then
            echo "the compose cluster did not come up (register: ${state:-none})" >&2
            docker_compose logs --no-color >&2 || true
            return 1
        fi
        sleep 1
    done
    local name
    for name in metadata worker1 worker2 worker3; do
        psql -X -q -h 127.0.0.1 -p "$(node_port "$name")" -U postgres -d postgres \
            -v db="$PGSHARD_DATABASE" <<<'CREATE DATABASE :"db";'
    done
}

cluster_cleanup() {
    if [ "${PGSHARD_KEEP_CLUSTER:-0}" = 1 ]; then
        docker_compose stop >/dev/null
    else
        docker_compose down --volumes --remove-orphans >/dev/null 2>&1
    fi
}

node_stop() {
    docker_compose stop "$1" >/dev/null 2>&1
}

node_start() {
    docker_compose start "$1" >/dev/null 2>&1
    until pg_isready -q -h 127.0.0.1 -p "$(node_port "$1")"; do sleep 0.2; done
}

node_restart() {
    docker_compose restart "$1" >/dev/null 2>&1
    until pg_isready -q -h 127.0.0.1 -p "$(node_port "$1")"; do sleep 0.2; done
}

node_log_mark() {
    date -u +%Y-%m-%dT%H:%M:%S.%NZ
}

node_log_since() {
    docker logs --since "$2" "$(docker_compose ps -q "$1")" 2>&1
}
