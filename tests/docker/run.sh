#!/usr/bin/env bash
# make docker-test: the Docker images (make docker) as a cluster
# (docker/compose.yaml), checked from outside as a user would: the compose
# cluster answers on the coordinator's port with its workers registered,
# a distributed table's rows route to the workers, nothing is logged as a
# warning; then the pg_regress suites of `make test` run against the
# containers (tests/run_regress.sh with tests/cluster/docker.sh).
#
# Starts a Docker engine if none answers (scripts/docker-engine.sh) and
# stops what it started.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log_dir=${PGSHARD_DOCKER_LOG_DIR:-/var/tmp/pg_shard-docker-test}
mkdir -p "$log_dir"

engine=$("$repo/scripts/docker-engine.sh" start)
stop_engine() {
    if [ -n "$engine" ]; then
        "$repo/scripts/docker-engine.sh" stop "$engine" || true
    fi
}
trap stop_engine EXIT

"$repo/scripts/docker.sh"

# A password with characters that need quoting in .pgpass and conninfo.
POSTGRES_PASSWORD="docker:test\\$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
export POSTGRES_PASSWORD PGPASSWORD=$POSTGRES_PASSWORD
# First as a DBA would run it: every login with the password.
export POSTGRES_HOST_AUTH_METHOD=scram-sha-256
export PGSHARD_REGRESS_CLUSTER=docker PGSHARD_BASE_PORT=25320 PGSHARD_DATABASE=pg_shard_regress
# shellcheck source=tests/cluster/docker.sh
. "$repo/tests/cluster/docker.sh"

passed=0 failed=0
check() {
    local name=$1
    shift
    if "$@"; then
        echo "ok - $name"
        passed=$((passed + 1))
    else
        echo "not ok - $name"
        failed=$((failed + 1))
    fi
}

cleanup() {
    docker_compose logs --no-color >"$log_dir/compose.log" 2>&1 || true
    docker_compose down --volumes --remove-orphans >/dev/null 2>&1 || true
    stop_engine
}
trap cleanup EXIT

coordinator() {
    psql -X -At -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGSHARD_COORDINATOR_PORT" -U postgres \
        -d "$POSTGRES_DB" "$@"
}

check "the compose cluster comes up (register done, coordinator answering)" cluster_start
check "the workers are registered in the compose database" \
    test "$(coordinator -c "SELECT string_agg(port::text, ',' ORDER BY port) FROM pg_shard.nodes WHERE state = 'active'")" \
    = "$PGSHARD_WORKER1_PORT,$PGSHARD_WORKER2_PORT"
register_again() {
    docker_compose run --rm --no-deps register >"$log_dir/register-again.log" 2>&1
}
check "register run again changes nothing" register_again
check "still two workers" \
    test "$(coordinator -c "SELECT count(*) FROM pg_shard.nodes")" = 2
coordinator -q <<'SQL' >/dev/null
CREATE TABLE docker_accounts (id bigint PRIMARY KEY, owner text NOT NULL);
SELECT pg_shard.create_distributed_table('docker_accounts', 'id', shard_count => 4);
INSERT INTO docker_accounts SELECT g, 'owner ' || g FROM generate_series(1, 1000) g;
SQL
check "rows through the coordinator" \
    test "$(coordinator -c "SELECT count(*), sum(id) FROM docker_accounts")" = "1000|500500"
# (query_to_xml: a count of each shard table of the worker, in one query)
worker_rows() {
    psql -X -At -h 127.0.0.1 -p "$1" -U postgres -d "$POSTGRES_DB" -c "
        SELECT coalesce(sum((xpath('/row/n/text()', query_to_xml(
                   format('SELECT count(*) AS n FROM %s', shard_rel), false, true, '')))[1]::text::bigint), 0)
          FROM pg_shard.local_shard WHERE shard_rel::text LIKE 'docker_accounts%'"
}
check "the rows are on the workers" \
    test $(($(worker_rows "$PGSHARD_WORKER1_PORT") + $(worker_rows "$PGSHARD_WORKER2_PORT"))) -eq 1000
check "a read by key goes to its worker (metrics)" sh -c '
    test "$(psql -X -At -h 127.0.0.1 -p "$0" -U postgres -d "$1" -c "SELECT owner FROM docker_accounts WHERE id = 42")" = "owner 42" &&
    curl -fsS "http://127.0.0.1:$2/metrics" | grep -Eq "^pg_shard_node_queries_total\{node=\"127.0.0.1:($3|$4)\"\} [1-9]"' \
    "$PGSHARD_COORDINATOR_PORT" "$POSTGRES_DB" "$PGSHARD_METRICS_PORT" "$PGSHARD_WORKER1_PORT" "$PGSHARD_WORKER2_PORT"
# A move between the containers: pg_shard's own connections log in with
# the nodes' password (.pgpass, written by the entry point).
move_job=$(coordinator -q -c "SET pg_shard.move_drop_delay = 0" -c "
    SELECT pg_shard.move_shard(
        (SELECT shard_id FROM pg_shard.shards WHERE table_name = 'docker_accounts'::regclass
            AND node_id = (SELECT node_id FROM pg_shard.nodes WHERE port = $PGSHARD_WORKER1_PORT)
          ORDER BY shard_id LIMIT 1),
        (SELECT node_id FROM pg_shard.nodes WHERE port = $PGSHARD_WORKER2_PORT))")
check "a shard moves between the containers" \
    test "$(coordinator -c "SELECT pg_shard.wait_job($move_job, '5 minutes')")" = done
check "rows unchanged after the move" \
    test "$(coordinator -c "SELECT count(*), sum(id) FROM docker_accounts")" = "1000|500500"
check "a plaintext login without the password is refused" \
    sh -c '! PGPASSWORD= psql -X -w -h 127.0.0.1 -p "$0" -U postgres -d postgres -c "SELECT 1" 2>/dev/null' \
    "$PGSHARD_METADATA_PORT"
warnings=$(docker_compose logs --no-color 2>&1 | grep -E ' (WARN|ERROR|WARNING|FATAL|PANIC)' |
    grep -v 'password authentication failed\|no password supplied\|Connection matched' |
    grep -v 'terminating logical replication worker due to administrator command' || true)
check "no warnings or errors in the containers' logs" test -z "$warnings"
[ -z "$warnings" ] || echo "$warnings" | head -20
docker_compose down --volumes --remove-orphans >/dev/null 2>&1

# The suites of make test, against the containers. They run as roles
# without passwords, which pg_shard's connections between the nodes log in
# as (the acting role), so their cluster trusts logins as the local
# cluster of make test does (initdb --auth=trust).
export POSTGRES_HOST_AUTH_METHOD=trust
regress_status=0
"$repo/tests/run_regress.sh" || regress_status=1
echo "docker: $passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$regress_status" -eq 0 ]
