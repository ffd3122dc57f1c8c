#!/usr/bin/env bash
# A shard move under write load, at pgbench scale S (default 10):
# pgbench_accounts distributed by aid (8 shards over 2 workers), history
# co-located, branches and tellers reference tables; pgbench -N runs through
# the coordinator (8 clients) while the shard group of aid 1 moves to the
# other worker. Reports the move's duration, bytes copied and MB/s, and the
# longest pgbench transaction that ended while the move ran (the write
# pause is inside it), with failures and the balance invariant.
#
# Own throwaway cluster: metadata 29520, workers 29521-29522, coordinator
# 29620. Run with: make bench-move
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scale=${1:-10}
export PGSHARD_CLUSTER_DIR=$repo/.cluster-bench-move
export PGSHARD_BASE_PORT=29520
export PGSHARD_WORKERS=2
export PGSHARD_DATABASE=bench
export PGUSER=postgres
"$repo/scripts/cluster.sh" destroy >/dev/null
"$repo/scripts/cluster.sh" start >/dev/null
scratch=$(mktemp -d)
cleanup() {
    rm -rf "$scratch"
    "$repo/scripts/cluster.sh" destroy >/dev/null
}
trap cleanup EXIT
meta() { psql -X -q -At -h 127.0.0.1 -p 29520 -d bench -v ON_ERROR_STOP=1 "$@"; }
meta -c "CREATE EXTENSION pg_shard" -c "SELECT pg_shard.add_node('127.0.0.1', 29521)" \
    -c "SELECT pg_shard.add_node('127.0.0.1', 29522)" >/dev/null
pgbench -i -q -s "$scale" -h 127.0.0.1 -p 29620 bench >/dev/null 2>&1
meta >/dev/null <<SQL
ALTER TABLE pgbench_history REPLICA IDENTITY FULL;
SELECT pg_shard.create_distributed_table('pgbench_accounts', 'aid', shard_count => 8);
SELECT pg_shard.create_distributed_table('pgbench_history', 'aid', colocate_with => 'pgbench_accounts');
SELECT pg_shard.create_reference_table('pgbench_branches');
SELECT pg_shard.create_reference_table('pgbench_tellers');
SQL
sleep 1
read -r shard target <<<"$(meta -F ' ' -c "SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id)
    FROM pg_shard.shards s WHERE s.table_name = 'pgbench_accounts'::regclass
     AND pg_shard.keyspace_id(1) BETWEEN s.range_start AND s.range_end")"
seconds=40
(cd "$scratch" && pgbench -n -N -c 8 -j 2 -T $seconds -h 127.0.0.1 -p 29620 -l --log-prefix="$scratch/tx" bench \
    >"$scratch/pgbench.out" 2>&1) &
bench=$!
sleep 8
job=$(meta -c "SET pg_shard.move_drop_delay = 0" -c "SELECT pg_shard.move_shard($shard, $target)")
state=$(meta -c "SELECT pg_shard.wait_job($job, '10 minutes')")
wait "$bench"
read -r started finished duration bytes <<<"$(meta -F ' ' -c "SELECT extract(epoch FROM started_at), extract(epoch FROM finished_at),
    extract(epoch FROM finished_at - started_at), bytes_copied FROM pg_shard.job WHERE job_id = $job")"
# pgbench's log: field 3 the latency (µs), fields 5-6 the end time (s, µs).
longest=$(cat "$scratch"/tx.* | awk -v from="$started" -v to="$finished" \
    '{ t = $5 + $6 / 1e6; if (t >= from && t <= to + 1 && $3 > max) max = $3 } END { printf "%.0f", max / 1000 }')
echo "pgbench scale $scale; move of shard $shard (its group: accounts and history) to node $target: $state"
printf 'move: %.2f s, %.1f MB copied, %.1f MB/s\n' "$duration" "$(awk "BEGIN {print $bytes / 1e6}")" \
    "$(awk "BEGIN {print $bytes / 1e6 / $duration}")"
echo "longest pgbench -N transaction ending during the move: $longest ms"
grep -E "^(tps|number of failed|number of transactions actually)" "$scratch/pgbench.out"
echo "balances equal history deltas: $(meta -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history)")"
