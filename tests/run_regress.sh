#!/usr/bin/env bash
# Run the pg_regress suites against a throwaway cluster: a metadata node on
# 25320 and workers on 25321-25323 (the third is added by a test, to check
# that add_node copies reference tables), plus a server without the pg_shard
# extension on 25324 (tests/bare_server.sh). The cluster is created fresh,
# and stopped and deleted afterwards unless PGSHARD_KEEP_CLUSTER=1.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
suite=$repo/tests/pg_regress

export PGSHARD_CLUSTER_DIR=$repo/.cluster-test
# Below the kernel's ephemeral port range (32768-60999): a listening port in
# it can collide with the local port of a recent client connection.
export PGSHARD_BASE_PORT=25320
export PGSHARD_WORKERS=3
export PGSHARD_DATABASE=pg_shard_regress
export PGUSER=postgres
# pg_shard.wait_job's progress NOTICEs depend on timing: none in the
# compared outputs (tests/moves/progress.py tests them).
export PGOPTIONS="${PGOPTIONS:-} -c pg_shard.job_progress_interval=0"

# Where the cluster runs: local servers (scripts/cluster.sh), or the
# Docker images (tests/docker/run.sh sets docker).
# shellcheck source=tests/cluster/local.sh
. "$repo/tests/cluster/${PGSHARD_REGRESS_CLUSTER:-local}.sh"

bare_dir=/var/tmp/pg_shard-bare-server-$PGSHARD_BASE_PORT
cleanup() {
    "$repo/tests/bare_server.sh" stop "$bare_dir"
    cluster_cleanup
}
"$repo/tests/bare_server.sh" stop "$bare_dir"
trap cleanup EXIT
cluster_start
"$repo/tests/bare_server.sh" start "$bare_dir" $((PGSHARD_BASE_PORT + 4)) "$PGSHARD_DATABASE"

pg_regress=$(pg_config --pkglibdir)/pgxs/src/test/regress/pg_regress
cd "$suite"
rm -rf results regression.diffs regression.out
rm -rf "$repo/tests/isolation/results" "$repo/tests/isolation/output_iso" \
    "$repo/tests/isolation/regression.diffs" "$repo/tests/isolation/regression.out"
status=0
"$pg_regress" \
    --use-existing \
    --host=127.0.0.1 --port="$PGSHARD_BASE_PORT" --user=postgres \
    --dbname="$PGSHARD_DATABASE" \
    --inputdir="$suite" --outputdir="$suite" \
    --schedule="$suite/schedule" 2>&1 | tee "$suite/pg_regress.log" || true
# The differential corpus: a plain database and the cluster must agree.
differential_failed=0
python3 "$repo/tests/differential/run.py" "$PGSHARD_BASE_PORT" \
    $((PGSHARD_BASE_PORT + 1)) $((PGSHARD_BASE_PORT + 2)) 2>&1 | grep -v '^NOTICE' |
    tee "$suite/differential.log" || true
grep -q '^differential: [0-9]* passed, 0 failed$' "$suite/differential.log" || differential_failed=1

# Then with worker 3 down: failures must change nothing.
node_stop worker3
"$pg_regress" \
    --use-existing \
    --host=127.0.0.1 --port="$PGSHARD_BASE_PORT" --user=postgres \
    --dbname="$PGSHARD_DATABASE" \
    --inputdir="$suite" --outputdir="$suite" \
    --schedule="$suite/schedule_node_down" 2>&1 | tee -a "$suite/pg_regress.log" || true
if [ -f regression.diffs ]; then
    cat regression.diffs
fi
passed=$(grep -cE '^(ok|test) .* \.\.\. ok' "$suite/pg_regress.log" || true)
failed=$(grep -cE '\.\.\. FAILED|\.\.\. failed' "$suite/pg_regress.log" || true)
# Concurrency specs, on the first worker (they create their own shard table).
isolation=$(pg_config --pkglibdir)/pgxs/src/test/isolation/pg_isolation_regress
"$isolation" \
    --use-existing \
    --host=127.0.0.1 --port=$((PGSHARD_BASE_PORT + 1)) --user=postgres \
    --dbname="$PGSHARD_DATABASE" \
    --inputdir="$repo/tests/isolation" --outputdir="$repo/tests/isolation" \
    --schedule="$repo/tests/isolation/schedule" 2>&1 | tee "$suite/pg_isolation_regress.log" || true
if [ -f "$repo/tests/isolation/regression.diffs" ]; then
    cat "$repo/tests/isolation/regression.diffs"
fi
# Moves under concurrent writes, on the metadata node (its job runner).
"$isolation" \
    --use-existing \
    --host=127.0.0.1 --port="$PGSHARD_BASE_PORT" --user=postgres \
    --dbname="$PGSHARD_DATABASE" \
    --inputdir="$repo/tests/isolation" --outputdir="$repo/tests/isolation" \
    --schedule="$repo/tests/isolation/schedule_metadata" 2>&1 | tee -a "$suite/pg_isolation_regress.log" || true
if [ -f "$repo/tests/isolation/regression.diffs" ]; then
    cat "$repo/tests/isolation/regression.diffs"
fi
# Worker 3 back (node_down stopped it) for what follows.
node_start worker3
# Concurrent statements through the metadata node wait on the workers: the
# blocked-check is replaced for these specs (tests/isolation/distributed_waits.sql).
psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGSHARD_BASE_PORT" -U postgres -d "$PGSHARD_DATABASE" \
    -f "$repo/tests/isolation/distributed_waits.sql"
executor_specs_failed=0
"$isolation" \
    --use-existing \
    --host=127.0.0.1 --port="$PGSHARD_BASE_PORT" --user=postgres \
    --dbname="$PGSHARD_DATABASE" \
    --inputdir="$repo/tests/isolation" --outputdir="$repo/tests/isolation" \
    --schedule="$repo/tests/isolation/schedule_executor" 2>&1 |
    tee -a "$suite/pg_isolation_regress.log" || executor_specs_failed=1
psql -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PGSHARD_BASE_PORT" -U postgres -d "$PGSHARD_DATABASE" \
    -f "$repo/tests/isolation/distributed_waits_restore.sql"
if [ -f "$repo/tests/isolation/regression.diffs" ]; then
    cat "$repo/tests/isolation/regression.diffs"
fi
passed=$((passed + $(grep -cE '^(ok|test) .* \.\.\. ok' "$suite/pg_isolation_regress.log" || true)))
# Drivers prepare statements through the protocol, which psql cannot, and
# a move's cutover is timed by locks on the workers: scripts check those.
executor_out=$(for script in concurrent_updates prepared_router moved_shard_retry pipeline_writes remote_sessions; do
    /usr/bin/python3 "$repo/tests/executor/$script.py" "$PGSHARD_BASE_PORT" "$PGSHARD_DATABASE" 2>&1 || true
done)
echo "$executor_out"
passed=$((passed + $(grep -c '^ok - ' <<<"$executor_out" || true)))
failed=$((failed + $(grep -c '^not ok - ' <<<"$executor_out" || true)))
[ "$(grep -c '^ok - ' <<<"$executor_out" || true)" -ge 75 ] || failed=$((failed + 1))
failed=$((failed + $(grep -cE '\.\.\. FAILED|\.\.\. failed' "$suite/pg_isolation_regress.log" || true)))
failed=$((failed + executor_specs_failed))
if [ "$failed" -ne 0 ] || [ "$passed" -eq 0 ]; then
    status=1
fi
if [ -f regression.diffs ]; then
    cat regression.diffs
fi

# NOTIFY carries a server PID that expected files cannot hold: check it here.
notify_out=$(psql -X -h 127.0.0.1 -p "$PGSHARD_BASE_PORT" -d "$PGSHARD_DATABASE" -q <<'SQL' 2>&1
LISTEN pg_shard_map;
CREATE TABLE notify_probe (id bigint PRIMARY KEY);
SELECT pg_shard.create_distributed_table('notify_probe', 'id', shard_count => 2);
SELECT 1;
SQL
)
expected_version=$(psql -X -h 127.0.0.1 -p "$PGSHARD_BASE_PORT" -d "$PGSHARD_DATABASE" -Atc "SELECT pg_shard.map_version()")
if grep -q "notification \"pg_shard_map\" with payload \"$expected_version\" received" <<<"$notify_out"; then
    echo "ok - map change announced on pg_shard_map with payload $expected_version"
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    echo "not ok - no pg_shard_map notification for version $expected_version:"
    echo "$notify_out"
    status=1
fi
if [ "$differential_failed" -eq 0 ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    status=1
fi

# The catalog's contents are part of pg_dump output (pg_extension_config_dump).
dump=$(pg_dump -h 127.0.0.1 -p "$PGSHARD_BASE_PORT" -U postgres --data-only "$PGSHARD_DATABASE")
missing=""
for table in node colocation_group shard_group logical_table shard placement map_state; do
    grep -q "^COPY pg_shard\.$table " <<<"$dump" || missing="$missing $table"
done
if [ -z "$missing" ] && grep -q "setval('pg_shard.shard_id_seq'" <<<"$dump"; then
    echo "ok - pg_dump keeps the catalog"
    passed=$((passed + 1))
else
    echo "not ok - pg_dump lacks catalog data:${missing:- shard_id_seq}"
    failed=$((failed + 1))
    status=1
fi

# The launcher skips a database an interrupted DROP DATABASE left invalid
# (datconnlimit -2): a runner for it would fail and restart every 5 s.
invalid_port=$((PGSHARD_BASE_PORT + 2))
psql -X -q -h 127.0.0.1 -p "$invalid_port" -U postgres -d postgres \
    -c "CREATE DATABASE pg_shard_invalid_db" \
    -c "UPDATE pg_database SET datconnlimit = -2 WHERE datname = 'pg_shard_invalid_db'"
log_mark=$(node_log_mark worker2)
node_restart worker2
# (the launcher starts runners at once; a failed one comes back after 5 s)
sleep 8
runner_tries=$(node_log_since worker2 "$log_mark" | grep -c 'invalid database "pg_shard_invalid_db"' || true)
refused=$(psql -X -h 127.0.0.1 -p "$invalid_port" -U postgres -d pg_shard_invalid_db -c 'SELECT 1' 2>&1 || true)
psql -X -q -h 127.0.0.1 -p "$invalid_port" -U postgres -d postgres -c "DROP DATABASE pg_shard_invalid_db"
if [ "$runner_tries" -eq 0 ] && grep -q 'invalid database' <<<"$refused"; then
    echo "ok - the job launcher skips an invalid database"
    passed=$((passed + 1))
else
    echo "not ok - job runners tried the invalid database $runner_tries times (a client: $refused)"
    failed=$((failed + 1))
    status=1
fi

echo "pg_regress: $passed passed, $failed failed"
exit $status
