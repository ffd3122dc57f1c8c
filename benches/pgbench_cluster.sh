# Sourced by the write-load benchmarks (move.sh, pause.sh): a throwaway
# cluster named NAME on ports BASE (metadata), BASE+1 and BASE+2 (workers)
# and BASE+100 (coordinator), with pgbench's tables at scale SCALE,
# pgbench_accounts distributed by aid over SHARDS shards (default 8),
# history co-located,
# branches and tellers reference tables. Defines `meta` (psql on the
# metadata node), `scratch` (a temporary directory), and a trap that stops
# a pgbench left in `bench` and destroys the cluster on exit.
# Usage: pgbench_cluster NAME BASE SCALE [SHARDS]
pgbench_cluster() {
    local name=$1 base=$2 scale=$3 shards=${4:-8}
    export PGSHARD_CLUSTER_DIR=$repo/.cluster-bench-$name
    export PGSHARD_BASE_PORT=$base
    export PGSHARD_WORKERS=2
    export PGSHARD_DATABASE=bench
    export PGUSER=postgres
    meta_port=$base
    coordinator_port=$((base + 100))
    "$repo/scripts/cluster.sh" destroy >/dev/null
    "$repo/scripts/cluster.sh" start >/dev/null
    scratch=$(mktemp -d)
    bench=
    trap pgbench_cluster_cleanup EXIT
    meta -c "CREATE EXTENSION pg_shard" -c "SELECT pg_shard.add_node('127.0.0.1', $((base + 1)))" \
        -c "SELECT pg_shard.add_node('127.0.0.1', $((base + 2)))" >/dev/null
    pgbench -i -q -s "$scale" -h 127.0.0.1 -p "$coordinator_port" bench >/dev/null 2>&1
    meta >/dev/null <<SQL
ALTER TABLE pgbench_history REPLICA IDENTITY FULL;
SELECT pg_shard.create_distributed_table('pgbench_accounts', 'aid', shard_count => $shards);
SELECT pg_shard.create_distributed_table('pgbench_history', 'aid', colocate_with => 'pgbench_accounts');
SELECT pg_shard.create_reference_table('pgbench_branches');
SELECT pg_shard.create_reference_table('pgbench_tellers');
SQL
    sleep 1
}

# (without wait_job's progress NOTICEs: the benches print their own table)
meta() {
    PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning" \
        psql -X -q -At -h 127.0.0.1 -p "$meta_port" -d bench -v ON_ERROR_STOP=1 "$@"
}

pgbench_cluster_cleanup() {
    if [ -n "${bench:-}" ]; then kill "$bench" 2>/dev/null || true; fi
    rm -rf "$scratch"
    "$repo/scripts/cluster.sh" destroy >/dev/null
}
