#!/usr/bin/env bash
# Cost of the worker-side guard triggers, with the triggers enabled and
# disabled on the same shard table:
#  1. bulk load: COPY of N rows (default 1,000,000), repeated R times
#     (default 3) per mode, alternating, median reported;
#  2. single-row INSERTs: STATEMENTS (default 300,000) of them in a
#     server-side loop, ROUNDS (default 5) rounds per mode, alternating;
#     the guards' cost per statement.
#
# Uses its own throwaway cluster (metadata 26320, one worker 26321).
# Run with: make bench-triggers   (or benches/shard_guard.sh ROWS REPEATS STATEMENTS ROUNDS)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rows=${1:-1000000}
repeats=${2:-3}
statements=${3:-300000}
rounds=${4:-5}

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
# The modes alternate so that a change in the host's load falls on both.
for _ in $(seq 1 "$repeats"); do
    for mode in with_triggers without_triggers; do
        if [ "$mode" = without_triggers ]; then
            worker -c "ALTER TABLE $shard DISABLE TRIGGER USER" >/dev/null
        else
            worker -c "ALTER TABLE $shard ENABLE TRIGGER USER" >/dev/null
        fi
        result[runs_$mode]="${result[runs_$mode]:-} $(time_copy)"
    done
done
for mode in with_triggers without_triggers; do
    result[$mode]=$(printf '%s\n' ${result[runs_$mode]} | median)
    echo "$mode: runs${result[runs_$mode]} s, median ${result[$mode]} s"
done
with=${result[with_triggers]}
without=${result[without_triggers]}
awk -v rows="$rows" -v with="$with" -v without="$without" 'BEGIN {
    printf "rows=%d with_triggers=%.3fs without_triggers=%.3fs overhead=%.1f%% per_row=%.0fns\n",
        rows, with, without, (with - without) * 100 / without, (with - without) * 1e9 / rows
}'

# Single-row inserts: one statement's own cost, measured inside the server
# (a DO loop of STATEMENTS single-row INSERTs, each a statement of its own
# that fires the statement triggers) so that the client round trip, which
# varies by tens of microseconds between runs on this host, does not drown
# a cost of about a microsecond. The modes alternate, ROUNDS rounds each,
# median reported.
for _ in $(seq 1 "$rounds"); do
    for mode in with_triggers without_triggers; do
        if [ "$mode" = without_triggers ]; then
            worker -c "ALTER TABLE $shard DISABLE TRIGGER USER" >/dev/null
        else
            worker -c "ALTER TABLE $shard ENABLE TRIGGER USER" >/dev/null
        fi
        worker -c "TRUNCATE $shard" -c "CHECKPOINT" >/dev/null
        start=$(date +%s.%N)
        worker -c "DO \$\$ BEGIN FOR i IN 1..$statements LOOP
                       INSERT INTO $shard VALUES (i, i, 'x');
                   END LOOP; END \$\$"
        end=$(date +%s.%N)
        per=$(awk -v a="$start" -v b="$end" -v n="$statements" 'BEGIN { printf "%.3f\n", (b - a) * 1e6 / n }')
        result[insert_$mode]="${result[insert_$mode]:-} $per"
    done
done
for mode in with_triggers without_triggers; do
    result[insert_median_$mode]=$(printf '%s\n' ${result[insert_$mode]} | median)
    echo "single-row INSERT $mode: runs${result[insert_$mode]} us, median ${result[insert_median_$mode]} us"
done
awk -v with="${result[insert_median_with_triggers]}" -v without="${result[insert_median_without_triggers]}" 'BEGIN {
    printf "single-row INSERT: with_triggers=%.2fus without_triggers=%.2fus overhead=+%.2fus per statement\n",
        with, without, with - without
}'
