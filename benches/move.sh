#!/usr/bin/env bash
# Shard moves and a split under write load, at pgbench scale S (default
# 10): pgbench_accounts distributed by aid (8 shards over 2 workers),
# history co-located, branches and tellers reference tables; pgbench -N runs
# through the coordinator (8 clients) while the shard group of aid 1 moves
# (copy rate unlimited, the default 32 MB/s, 8 MB/s) and then splits. Reports
# each job's duration, bytes copied and MB/s, and the pgbench latency while
# it copied and while it ran (the longest transaction contains the write
# pause) against the 5 s before it, the transactions that overlapped the
# cutover's pause (count and longest), with failures and the balance invariant;
# then the steps of each cutover and each verification, a revert's duration
# and pause, and the copy's own MB/s for a 150 MB shard on the idle cluster.
#
# Own throwaway cluster: metadata 29520, workers 29521-29522, coordinator
# 29620. Run with: make bench-move
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scale=${1:-10}
# shellcheck source=benches/pgbench_cluster.sh
. "$repo/benches/pgbench_cluster.sh"
pgbench_cluster move 29520 "$scale"
# The shard group of aid 1 moves to the other worker without a copy rate
# limit, moves back at the default limit, moves again at 8 MB/s, then
# splits (default limit), then moves without a limit, takes writes on the
# new node for 3 s and is reverted, then splits, takes writes on the halves
# for 3 s and is merged back by a revert; each job gets a 20 s slot (45 s
# above scale 10) of the pgbench run.
read -r shard <<<"$(meta -c "SELECT s.shard_id FROM pg_shard.shards s WHERE s.table_name = 'pgbench_accounts'::regclass
     AND pg_shard.keyspace_id(1) BETWEEN s.range_start AND s.range_end")"
scenarios=("move 0" "move 32" "move 8" "split 32" "revert 0" "split-revert 32")
slot=$((scale <= 10 ? 20 : 45))
seconds=$((8 + slot * ${#scenarios[@]}))
(cd "$scratch" && pgbench -n -N -c 8 -j 2 -T $seconds -h 127.0.0.1 -p 29620 -l --log-prefix="$scratch/tx" bench \
    >"$scratch/pgbench.out" 2>&1) &
bench=$!
began=$(date +%s)
jobs=()
for scenario in "${scenarios[@]}"; do
    read -r kind rate <<<"$scenario"
    # wait for the scenario's slot
    while [ $(($(date +%s) - began)) -lt $((8 + slot * ${#jobs[@]})) ]; do sleep 0.2; done
    shard=$(meta -c "SELECT s.shard_id FROM pg_shard.shards s WHERE s.table_name = 'pgbench_accounts'::regclass
         AND pg_shard.keyspace_id(1) BETWEEN s.range_start AND s.range_end")
    if [ "$kind" = split ] || [ "$kind" = split-revert ]; then
        call="pg_shard.split_shard($shard)"
    else
        call="pg_shard.move_shard($shard, (SELECT min(node_id) FROM pg_shard.node n
              WHERE n.node_id <> (SELECT node_id FROM pg_shard.shards WHERE shard_id = $shard)))"
    fi
    delay=0
    [ "$kind" = revert ] || [ "$kind" = split-revert ] && delay="'1h'"
    job=$(meta -c "SET pg_shard.move_drop_delay = $delay" -c "SET pg_shard.copy_rate_limit = $rate" -c "SELECT $call")
    if [ "$delay" != 0 ]; then
        until [ "$(meta -c "SELECT phase FROM pg_shard.job WHERE job_id = $job")" = reverse_replicating ]; do
            sleep 0.1
        done
        sleep 3
        meta -c "SELECT pg_shard.revert_job($job)" >/dev/null
    fi
    meta -c "SELECT pg_shard.wait_job($job, '10 minutes')" >/dev/null
    jobs+=("$job")
done
wait "$bench"
echo "pgbench scale $scale, pgbench -N through the coordinator (8 clients); the shard group of aid 1 (accounts and history)"
printf '%-6s %-11s %-6s %8s %10s %6s %8s %9s   %-22s %-22s %-22s %-16s\n' job kind limit seconds "MB copied" "MB/s" \
    "copy+c-u" "copy MB/s" "before: p50/p99/max" "copy: p50/p99/max" "job: p50/p99/max" "pause: n/max"
for i in "${!jobs[@]}"; do
    job=${jobs[$i]}
    read -r kind rate <<<"${scenarios[$i]}"
    read -r state started finished duration bytes copy_from copy_to copy_rate <<<"$(meta -F ' ' -c "SELECT state,
        extract(epoch FROM started_at), extract(epoch FROM finished_at), extract(epoch FROM finished_at - started_at),
        bytes_copied, extract(epoch FROM (resources->'phase_times'->>'copy')::timestamptz),
        -- (catch_up is entered again after the verification: the copy
        -- window ends where the verification starts)
        extract(epoch FROM coalesce(resources->'phase_times'->>'verify',
                                    resources->'phase_times'->>'catch_up')::timestamptz),
        -- the copy's own rate: from the copy phase to the last page copied
        round((bytes_copied / 1e6 / extract(epoch FROM (resources->>'copied_at')::timestamptz
                                               - (resources->'phase_times'->>'copy')::timestamptz))::numeric, 1)
        FROM pg_shard.job WHERE job_id = $job")"
    # The cutover's pause (a revert's, for the revert): from its lock to its
    # publish, which commits as the job enters its next phase.
    read -r pause_from pause_to <<<"$(meta -F ' ' -c "SELECT
        extract(epoch FROM t) - (p->>'published')::float8 / 1000, extract(epoch FROM t)
        FROM pg_shard.job j, LATERAL (SELECT CASE WHEN j.phase = 'reverted' THEN j.resources->'revert_ms'
                                                 ELSE j.resources->'cutover_ms' END AS p,
                                            (j.resources->'phase_times'->>CASE WHEN j.phase = 'reverted'
                                                 THEN 'revert_cleanup' ELSE 'cleanup' END)::timestamptz AS t) x
        WHERE job_id = $job")"
    # Transactions that overlapped the pause: their count and the longest.
    overlapping() {
        cat "$scratch"/tx.* | awk -v from="$1" -v to="$2" '{ end = $5 + $6 / 1e6; start = end - $3 / 1e6
                if (start < to && end > from) { n++; if ($3 > max) max = $3 } }
            END { printf "%d/%.0f ms", n, max / 1000 }'
    }
    paused=$(overlapping "$pause_from" "$pause_to")
    # pgbench's log: field 3 the latency (µs), fields 5-6 the end time (s, µs).
    window() {
        cat "$scratch"/tx.* | awk -v from="$1" -v to="$2" '{ t = $5 + $6 / 1e6; if (t >= from && t <= to) print $3 }' |
            sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit }
                printf "%.1f/%.1f/%.0f ms", v[int(NR * 0.5) + 1] / 1000, v[int(NR * 0.99) + 1] / 1000, v[NR] / 1000 }'
    }
    during=$(window "$started" "$(awk "BEGIN {printf \"%.6f\", $finished + 1}")")
    before=$(window "$(awk "BEGIN {printf \"%.6f\", $started - 5}")" "$started")
    copying=$(window "$copy_from" "$copy_to")
    printf '%-6s %-11s %-6s %8.2f %10.1f %6.1f %8.2f %9s   %-22s %-22s %-22s %-16s\n' "$job" "$kind:$state" "$rate" "$duration" \
        "$(awk "BEGIN {print $bytes / 1e6}")" "$(awk "BEGIN {print $bytes / 1e6 / $duration}")" \
        "$(awk "BEGIN {print $copy_to - $copy_from}")" "$copy_rate" "$before" "$copying" "$during" "$paused"
done
# Where each job's pause went (ms from the cutover's lock to each step; the
# map is public when the runner commits right after "published") and its
# verification before the cutover (source and copy compared at one point
# while replication ran).
for job in "${jobs[@]}"; do
    echo "job $job: cutover $(meta -c "SELECT resources->'cutover_ms' FROM pg_shard.job WHERE job_id = $job")," \
        "verified $(meta -c "SELECT resources->'verified' FROM pg_shard.job WHERE job_id = $job")"
    # A revert: from its request to the end (reverting → done), and its pause.
    meta -F ' ' -c "SELECT 'job ' || job_id || ': reverted in ' || round(extract(epoch FROM
            (resources->'phase_times'->>'reverted')::timestamptz
            - (resources->'phase_times'->>'reverting')::timestamptz)::numeric, 2) || ' s, pause '
            || (resources->'revert_ms')::text
        FROM pg_shard.job WHERE job_id = $job AND phase = 'reverted'"
done
grep -E "^(tps|number of failed|number of transactions actually)" "$scratch/pgbench.out"
echo "balances equal history deltas: $(meta -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history)")"

# The copy's own rate on an idle cluster, for a larger shard (about 150 MB
# of pages): a move without a limit, one back at the default 32 MB/s, and
# one more without a limit (the last two read rows the move before had
# just copied).
meta >/dev/null <<SQL
CREATE TABLE copy_bench (id bigint PRIMARY KEY, a int, b int, filler char(84));
INSERT INTO copy_bench SELECT g, g % 1000, g % 77, '' FROM generate_series(1, 2000000) g;
SELECT pg_shard.create_distributed_table('copy_bench', 'id', shard_count => 2, colocate_with => 'none');
SQL
echo "copy of one shard of copy_bench, idle cluster:"
for rate in 0 32 0; do
    shard=$(meta -c "SELECT s.shard_id FROM pg_shard.shards s WHERE s.table_name = 'copy_bench'::regclass
         ORDER BY s.range_start LIMIT 1")
    job=$(meta -c "SET pg_shard.move_drop_delay = 0" -c "SET pg_shard.copy_rate_limit = $rate" \
        -c "SELECT pg_shard.move_shard($shard, (SELECT min(node_id) FROM pg_shard.node n
              WHERE n.node_id <> (SELECT node_id FROM pg_shard.shards WHERE shard_id = $shard)))")
    meta -c "SELECT pg_shard.wait_job($job, '10 minutes')" >/dev/null
    meta -F ' ' -c "SELECT 'job ' || job_id || ' (limit $rate MB/s): ' || round(bytes_copied / 1e6) || ' MB in '
        || round(extract(epoch FROM (resources->>'copied_at')::timestamptz
                 - (resources->'phase_times'->>'copy')::timestamptz)::numeric, 2) || ' s = '
        || round((bytes_copied / 1e6 / extract(epoch FROM (resources->>'copied_at')::timestamptz
                 - (resources->'phase_times'->>'copy')::timestamptz))::numeric, 1) || ' MB/s; job '
        || round(extract(epoch FROM finished_at - started_at)::numeric, 2) || ' s, verification '
        || round((resources->'verified'->>'seconds')::numeric, 2) || ' s'
        FROM pg_shard.job WHERE job_id = $job"
done
