#!/usr/bin/env bash
# Cost of the worker-side guard triggers, with the triggers enabled and
# disabled on the same shard table:
#  1. bulk load: COPY of N rows (default 1,000,000), repeated R times
#     (default 3), median reported;
#  2. single-row INSERTs by one pgbench client for S seconds (default 20),
#     the statement guard's per-statement cost.
#
# Uses its own throwaway cluster (metadata 26320, one worker 26321).
# Run with: make bench-triggers   (or benches/shard_guard.sh ROWS REPEATS SECONDS)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rows=${1:-1000000}
repeats=${2:-3}
seconds=${3:-20}

export PGSHARD_CLUSTER_DIR=$repo/.cluster-bench
export PGSHARD_BASE_PORT=26320
export PGSHARD_WORKERS=1
export PGSHARD_DATABASE=pg_shard_bench
"$repo/scripts/cluster.sh" destroy
"$repo/scripts/cluster.sh" start >/dev/null
trap '"$repo/scripts/cluster.sh" destroy' EXIT

meta() { psql -X -q -h 127.0.0.1 -p 26320 -U postgres -d pg_shard_bench "$@"; }
worker() { psql -X -q -h 127.0.0.1 -p 26321 -U postgres -d pg_shard_bench "$@"; }

meta -c "CREATE EXTENSION pg_shard" -c "SELECT pg_shard.add_node('127.0.0.1', 26321)" >/dev/null
meta -c "CREATE TABLE bench_rows (customer_id bigint, seq bigint, payload text, PRIMARY KEY (customer_id, seq))" \
     -c "SELECT pg_shard.create_distributed_table('bench_rows', 'customer_id', shard_count => 1)" >/dev/null
shard=$(worker -Atc "SELECT shard_rel FROM pg_shard.local_shard")
data=$(mktemp)
trap 'rm -f "$data"; "$repo/scripts/cluster.sh" destroy' EXIT
worker -Atc "COPY (SELECT g % 100000, g, md5(g::text) FROM generate_series(1, $rows) g) TO STDOUT" >"$data"

time_copy() {
    worker -c "TRUNCATE $shard" -c "CHECKPOINT" >/dev/null
    local start end
    start=$(date +%s.%N)
    worker -c "\\copy $shard FROM '$data'"
    end=$(date +%s.%N)
    awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A result
for mode in with_triggers without_triggers; do
    if [ "$mode" = without_triggers ]; then
        worker -c "ALTER TABLE $shard DISABLE TRIGGER USER" >/dev/null
    else
        worker -c "ALTER TABLE $shard ENABLE TRIGGER USER" >/dev/null
    fi
    times=()
    for _ in $(seq 1 "$repeats"); do times+=("$(time_copy)"); done
    result[$mode]=$(printf '%s\n' "${times[@]}" | median)
    echo "$mode: runs ${times[*]} s, median ${result[$mode]} s"
done
with=${result[with_triggers]}
without=${result[without_triggers]}
awk -v rows="$rows" -v with="$with" -v without="$without" 'BEGIN {
    printf "rows=%d with_triggers=%.3fs without_triggers=%.3fs overhead=%.1f%% per_row=%.0fns\n",
        rows, with, without, (with - without) * 100 / without, (with - without) * 1e9 / rows
}'

# Single-row inserts: one client, prepared statements, fresh keys.
script=$(mktemp)
trap 'rm -f "$data" "$script"; "$repo/scripts/cluster.sh" destroy' EXIT
cat >"$script" <<SQL
\\set k random(1, 1000000000)
INSERT INTO $shard VALUES (:k, :client_id * 1000000000 + :k, 'x') ON CONFLICT DO NOTHING;
SQL
for mode in with_triggers without_triggers; do
    if [ "$mode" = without_triggers ]; then
        worker -c "ALTER TABLE $shard DISABLE TRIGGER USER" >/dev/null
    else
        worker -c "ALTER TABLE $shard ENABLE TRIGGER USER" >/dev/null
    fi
    worker -c "TRUNCATE $shard" -c "CHECKPOINT" >/dev/null
    tps=$(pgbench -n -h 127.0.0.1 -p 26321 -U postgres -M prepared -c 1 -T "$seconds" \
        -f "$script" pg_shard_bench 2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    echo "single-row INSERT $mode: $tps tps"
    result[insert_$mode]=$tps
done
awk -v with="${result[insert_with_triggers]}" -v without="${result[insert_without_triggers]}" 'BEGIN {
    printf "single-row INSERT: with_triggers=%.0f tps without_triggers=%.0f tps latency +%.1f us per statement\n",
        with, without, (1e6 / with - 1e6 / without)
}'
