#!/usr/bin/env bash
# The write pause of a cutover, many times over, against the same machine
# without a cutover. A pgbench workload runs through the coordinator while
# the shard group of aid 1 moves back and forth MOVES times (default 12, no
# copy limit), then is split and merged back by a revert SPLITS times
# (default 6: two pauses each, the split's and its revert's). Scale S,
# default 10. WORKLOAD picks the load:
#   N (default)  pgbench -N, 8 clients; pgbench_accounts distributed by aid
#                over 8 shards on 2 workers, history co-located;
#   update       issue 18's workload: 4 clients of single-row UPDATEs by a
#                random aid (one statement per transaction), 32 shards.
#
# For each pause (from the cutover's lock to its publish, as the job
# records them) the script counts the transactions that overlapped it and
# takes the longest; for the same pause it takes a control window of the
# same length 1 s before the job was queued, when no job ran, and its
# longest overlapping transaction. It prints, per kind, the pauses' lengths
# and both maxima (median and worst over the pauses): on a shared 2-core
# machine the worst transaction of any short window is often 20-40 ms, and
# only the difference says what a cutover costs.
#
# Own throwaway cluster: metadata 29720, workers 29721-29722, coordinator
# 29820. Run with: make bench-pause (or WORKLOAD=update benches/pause.sh 50)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scale=${1:-10}
moves=${MOVES:-12}
splits=${SPLITS:-6}
# shellcheck source=benches/pgbench_cluster.sh
. "$repo/benches/pgbench_cluster.sh"
workload=${WORKLOAD:-N}
case $workload in
N) clients=8 shards=8 ;;
update) clients=4 shards=32 ;;
*) echo "WORKLOAD is N or update, not $workload" >&2; exit 2 ;;
esac
pgbench_cluster pause 29720 "$scale" "$shards"
if [ "$workload" = N ]; then
    load=(-N)
else
    printf '%s\n' '\set aid random(1, 100000 * :scale)' \
        'UPDATE pgbench_accounts SET abalance = abalance + 1 WHERE aid = :aid;' >"$scratch/update.sql"
    load=(-f "$scratch/update.sql")
fi
# pgbench runs for a fixed time, long enough for the jobs (BENCH_SECONDS,
# default from MOVES, SPLITS and the scale), and ends on its own: its
# summary counts the transactions (a signal would lose its log's last
# lines).
seconds=${BENCH_SECONDS:-$(((30 + moves * 10 + splits * 20) * (scale > 10 ? 3 : 2) / 2))}
(cd "$scratch" && exec pgbench -n "${load[@]}" -c "$clients" -j 2 -T "$seconds" -h 127.0.0.1 -p 29820 \
    -l --log-prefix="$scratch/tx" bench >"$scratch/pgbench.out" 2>&1) &
bench=$!
began=$(date +%s)
sleep 5
shard_of_aid_1() {
    meta -c "SELECT s.shard_id FROM pg_shard.shards s WHERE s.table_name = 'pgbench_accounts'::regclass
         AND pg_shard.keyspace_id(1) BETWEEN s.range_start AND s.range_end"
}
# One line per pause: kind, its start and end (epoch seconds), and the
# control window's start and end.
windows=$scratch/windows
pause_of() { # job, kind, pause key, phase after the pause, queued at
    meta -F ' ' -c "SELECT '$2', extract(epoch FROM t) - (p->>'published')::float8 / 1000, extract(epoch FROM t),
            $5 - 1 - (p->>'published')::float8 / 1000, $5 - 1
        FROM pg_shard.job j, LATERAL (SELECT j.resources->'$3' AS p,
                                             (j.resources->'phase_times'->>'$4')::timestamptz AS t) x
        WHERE job_id = $1" >>"$windows"
    meta -c "SELECT '$2 ' || (resources->'$3')::text FROM pg_shard.job WHERE job_id = $1" >>"$scratch/steps"
}
for _ in $(seq "$moves"); do
    shard=$(shard_of_aid_1)
    queued=$(date +%s.%N)
    job=$(meta -c "SET pg_shard.move_drop_delay = 0" -c "SET pg_shard.copy_rate_limit = 0" \
        -c "SELECT pg_shard.move_shard($shard, (SELECT min(node_id) FROM pg_shard.node n
              WHERE n.node_id <> (SELECT node_id FROM pg_shard.shards WHERE shard_id = $shard)))")
    meta -c "SELECT pg_shard.wait_job($job, '5 minutes')" >/dev/null
    pause_of "$job" move cutover_ms cleanup "$queued"
    sleep 2
done
for _ in $(seq "$splits"); do
    shard=$(shard_of_aid_1)
    queued=$(date +%s.%N)
    job=$(meta -c "SET pg_shard.move_drop_delay = '1h'" -c "SET pg_shard.copy_rate_limit = 0" \
        -c "SELECT pg_shard.split_shard($shard)")
    until [ "$(meta -c "SELECT phase FROM pg_shard.job WHERE job_id = $job")" = reverse_replicating ]; do
        sleep 0.1
    done
    pause_of "$job" split cutover_ms cleanup "$queued"
    sleep 2
    queued=$(date +%s.%N)
    meta -c "SELECT pg_shard.revert_job($job)" >/dev/null
    meta -c "SELECT pg_shard.wait_job($job, '5 minutes')" >/dev/null
    pause_of "$job" split-revert revert_ms revert_cleanup "$queued"
    sleep 2
done
jobs_done=$(date +%s)
wait "$bench" || true
bench=
# pgbench's log: field 3 the latency (µs), fields 5-6 the end time (s, µs).
cat "$scratch"/tx.* >"$scratch/all"
ended=$(awk '$5 + $6 / 1e6 > end { end = $5 + $6 / 1e6 } END { printf "%.6f", end }' "$scratch/all")
longest() { # from, to: the longest transaction overlapping the window (ms)
    awk -v from="$1" -v to="$2" '{ end = $5 + $6 / 1e6; start = end - $3 / 1e6
            if (start < to && end > from && $3 > max) max = $3 }
        END { printf "%.1f", max / 1000 }' "$scratch/all"
}
echo "pgbench scale $scale, workload $workload through the coordinator ($clients clients, $shards shards); the shard group of aid 1"
printf '%-13s %6s   %-24s %-24s %-24s\n' kind pauses "pause ms: median/max" "in the pause: median/max" \
    "control: median/max"
: >"$scratch/rows"
while read -r kind from to control_from control_to; do
    # (A pause after pgbench's end had no transaction to wait: left out.)
    if awk -v to="$to" -v end="$ended" 'BEGIN { exit !(to > end) }'; then continue; fi
    echo "$kind $(awk "BEGIN {printf \"%.1f\", ($to - $from) * 1000}") $(longest "$from" "$to")" \
        "$(longest "$control_from" "$control_to")" >>"$scratch/rows"
done <"$windows"
for kind in move split split-revert; do
    stats() { # column: median/max over the kind's pauses
        awk -v kind="$kind" -v col="$1" '$1 == kind { print $col }' "$scratch/rows" | sort -n |
            awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit }
                printf "%s/%s", v[int((NR + 1) / 2)], v[NR] }'
    }
    printf '%-13s %6s   %-24s %-24s %-24s\n' "$kind" "$(awk -v kind="$kind" '$1 == kind' "$scratch/rows" | wc -l)" \
        "$(stats 2) ms" "$(stats 3) ms" "$(stats 4) ms"
done
echo "each pause (kind, ms, longest in it, longest in its control window):"
awk '{ printf "  %s %s/%s/%s", $1, $2, $3, $4 } NR % 4 == 0 { print "" } END { print "" }' "$scratch/rows"
echo "each pause's steps (ms from its lock):"
sed 's/^/  /' "$scratch/steps"
processed=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$scratch/pgbench.out")
echo "transactions: ${processed:-?} (logged $(wc -l <"$scratch/all")), pgbench errors: $(grep -c -i "error\|abort" "$scratch/pgbench.out" || true)"
# (A pause after pgbench's end would have no transaction to count.)
echo "pauses after pgbench ended, left out (raise BENCH_SECONDS if any): $(awk -v end="$ended" '$3 > end' "$windows" | wc -l)" \
    "(the jobs ended $((jobs_done - ${began%.*})) s into pgbench's $seconds s)"
if [ "$workload" = N ]; then
    echo "balances equal history deltas: $(meta -c "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history)")"
else
    # Each update adds 1: every one pgbench saw commit, exactly once.
    echo "balances sum to the transactions: $(meta -c "SELECT sum(abalance) = ${processed:-0} FROM pgbench_accounts")"
fi
