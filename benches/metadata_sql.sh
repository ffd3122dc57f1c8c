#!/usr/bin/env bash
# SQL through the metadata node against the same work done directly:
#  1. single-row reads and writes by key: through the metadata node's
#     distributed table vs sent straight to one worker's shard table
#     (pgbench, one client, prepared statements, S seconds each, default 15,
#     the two alternating for R rounds, default 3, median ratio reported);
#  2. a full-table aggregate over N rows (default 1,000,000) spread over two
#     workers vs the same aggregate on one PostgreSQL holding the same rows
#     (a plain table on the metadata node's server), 7 pairs alternating
#     in one session, median of the pairs' ratios;
#  3. COPY of those N rows (CSV, from the client) into an empty distributed
#     table through the metadata node vs into a plain table with the same
#     primary key on the metadata node's server, median of 3 runs each,
#     alternating.
#
# Uses its own throwaway cluster (metadata 27320, workers 27321-27322).
# Run with: make bench-metadata   (or benches/metadata_sql.sh ROWS SECONDS ROUNDS)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rows=${1:-1000000}
seconds=${2:-15}
rounds=${3:-3}

export PGSHARD_CLUSTER_DIR=$repo/.cluster-bench
export PGSHARD_BASE_PORT=27320
export PGSHARD_WORKERS=2
export PGSHARD_DATABASE=pg_shard_bench
"$repo/scripts/cluster.sh" destroy
"$repo/scripts/cluster.sh" start >/dev/null
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"; "$repo/scripts/cluster.sh" destroy' EXIT

meta() { psql -X -q -h 127.0.0.1 -p 27320 -U postgres -d pg_shard_bench "$@"; }
worker1() { psql -X -q -h 127.0.0.1 -p 27321 -U postgres -d pg_shard_bench "$@"; }

meta -c "CREATE EXTENSION pg_shard" \
     -c "SELECT pg_shard.add_node('127.0.0.1', 27321)" \
     -c "SELECT pg_shard.add_node('127.0.0.1', 27322)" >/dev/null
meta -c "CREATE TABLE bench (id bigint PRIMARY KEY, v int NOT NULL, payload text)" \
     -c "INSERT INTO bench SELECT g, g % 1000, md5(g::text) FROM generate_series(1, $rows) g" \
     -c "SELECT pg_shard.create_distributed_table('bench', 'id', shard_count => 32)" >/dev/null
meta -c "CREATE TABLE bench_single (id bigint PRIMARY KEY, v int NOT NULL, payload text)" \
     -c "INSERT INTO bench_single SELECT g, g % 1000, md5(g::text) FROM generate_series(1, $rows) g" \
     -c "VACUUM ANALYZE bench_single" >/dev/null
# Both workers' shards as bench_single is: vacuumed (visibility map set, so
# the aggregate's scans skip per-row visibility checks) and analyzed.
for worker_port in 27321 27322; do
    psql -X -q -h 127.0.0.1 -p "$worker_port" -U postgres -d pg_shard_bench -c "VACUUM ANALYZE" >/dev/null
done
shard=$(worker1 -Atc "SELECT shard_rel FROM pg_shard.local_shard ORDER BY shard_id LIMIT 1")

tps() { # port script
    pgbench -n -h 127.0.0.1 -p "$1" -U postgres -M prepared -c 1 -T "$seconds" -f "$2" pg_shard_bench \
        2>/dev/null | sed -n 's/^tps = \([0-9.]*\).*/\1/p'
}
script() { # name sql
    printf '\\set id random(1, %d)\n%s\n' "$rows" "$2" >"$scratch/$1.sql"
    echo "$scratch/$1.sql"
}
# Direct statements read and update rows the shard holds, as those through
# the metadata node do: random keys would mostly miss (the shard holds a
# 32nd of them), and an UPDATE that finds no row writes nothing. Its keys
# are numbered in a table on the worker, looked up by an initplan.
worker1 -c "CREATE TABLE bench_direct_keys (n int PRIMARY KEY, id bigint NOT NULL)" \
        -c "INSERT INTO bench_direct_keys SELECT row_number() OVER (ORDER BY id), id FROM $shard" \
        -c "VACUUM ANALYZE bench_direct_keys" >/dev/null
shard_rows=$(worker1 -Atc "SELECT count(*) FROM bench_direct_keys")
direct_script() { # name sql (:n numbers one of the shard's keys)
    printf '\\set n random(1, %d)\n%s\n' "$shard_rows" "$2" >"$scratch/$1.sql"
    echo "$scratch/$1.sql"
}
shard_key='(SELECT id FROM bench_direct_keys WHERE n = :n)'
read_meta_sql=$(script read_meta 'SELECT v FROM bench WHERE id = :id;')
read_direct_sql=$(direct_script read_direct "SELECT v FROM $shard WHERE id = $shard_key;")
write_meta_sql=$(script write_meta 'UPDATE bench SET v = v + 1 WHERE id = :id;')
write_direct_sql=$(direct_script write_direct "UPDATE $shard SET v = v + 1 WHERE id = $shard_key;")
# (Random keys of the whole table, mostly missing, as this bench took them
# before: reported once, for comparison.)
write_missing_sql=$(script write_missing "UPDATE $shard SET v = v + 1 WHERE id = :id;")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
# The metadata node and direct alternate, ROUNDS rounds (default 3): one
# client's tps on this host moves by half between runs minutes apart, so a
# ratio is taken within each round and the median of the rounds reported.
read_runs=() read_ratios=() write_runs=() write_ratios=()
for _ in $(seq 1 "$rounds"); do
    meta_tps=$(tps 27320 "$read_meta_sql")
    direct_tps=$(tps 27321 "$read_direct_sql")
    read_runs+=("$meta_tps/$direct_tps")
    read_ratios+=("$(ratio "$meta_tps" "$direct_tps")")
    meta_tps=$(tps 27320 "$write_meta_sql")
    direct_tps=$(tps 27321 "$write_direct_sql")
    write_runs+=("$meta_tps/$direct_tps")
    write_ratios+=("$(ratio "$meta_tps" "$direct_tps")")
done
write_missing=$(tps 27321 "$write_missing_sql")
read_fdw=$(PGOPTIONS="-c pg_shard.enable_router_executor=off" tps 27320 "$read_meta_sql")
write_fdw=$(PGOPTIONS="-c pg_shard.enable_router_executor=off" tps 27320 "$write_meta_sql")
read_direct=$(printf '%s\n' "${read_runs[@]#*/}" | median)
write_direct=$(printf '%s\n' "${write_runs[@]#*/}" | median)
echo "single-row SELECT by key: metadata node / worker shard table tps per round: ${read_runs[*]};" \
     "$(printf '%s\n' "${read_ratios[@]}" | median) of direct (median of rounds: ${read_ratios[*]});" \
     "over postgres_fdw $read_fdw tps, $(ratio "$read_fdw" "$read_direct") of direct's median"
echo "single-row UPDATE by key: metadata node / worker shard table tps per round: ${write_runs[*]};" \
     "$(printf '%s\n' "${write_ratios[@]}" | median) of direct (median of rounds: ${write_ratios[*]});" \
     "over postgres_fdw $write_fdw tps, $(ratio "$write_fdw" "$write_direct") of direct's median;" \
     "direct with random keys (mostly missing rows) $write_missing tps"

paired_ms() { # query A, query B: in one session, after a first run of
    # each, 7 runs of A and B alternating (the host's load moves within
    # seconds, so each pair's ratio is taken apart); prints A's median ms,
    # B's median ms, the median of the pairs' B/A ratios
    { echo '\timing on'; for _ in $(seq 1 8); do echo "$1"; echo "$2"; done; } | meta 2>&1 |
        sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -14 | paste - - |
        awk '{ a[NR] = $1; b[NR] = $2; r[NR] = $2 / $1 }
             function median(v, n,   i, j, t) {
                 for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
                     if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
                 return v[int((n + 1) / 2)]
             }
             END { printf "%s %s %.2f\n", median(a, NR), median(b, NR), median(r, NR) }'
}
first_ms() { # query: the median over 5 new sessions of their first run
    local query=$1 times=()
    for _ in 1 2 3 4 5; do
        times+=("$( { echo '\timing on'; echo "$query"; } | meta 2>&1 |
            sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1)")
    done
    printf '%s\n' "${times[@]}" | sort -n | sed -n 3p
}
aggregate='SELECT count(*), sum(v), avg(length(payload)) FROM'
read -r single distributed aggregate_ratio < <(paired_ms "$aggregate bench_single;" "$aggregate bench;")
single_first=$(first_ms "$aggregate bench_single;")
distributed_first=$(first_ms "$aggregate bench;")
echo "full-table aggregate over $rows rows (7 pairs alternating in one session, medians): one" \
     "PostgreSQL ${single} ms, distributed (2 workers, 32 shards) ${distributed} ms:" \
     "${aggregate_ratio}x (median of the pairs' ratios);" \
     "a new session's first: ${single_first} ms and ${distributed_first} ms"

# COPY from the client: the same file into a plain table and into a
# distributed one (emptied between runs), alternating.
meta -c "\\copy (SELECT g, g % 1000, md5(g::text) FROM generate_series(1, $rows) g) TO '$scratch/rows.csv' CSV"
meta -c "CREATE TABLE copy_single (id bigint PRIMARY KEY, v int NOT NULL, payload text)" \
     -c "CREATE TABLE copy_distributed (id bigint PRIMARY KEY, v int NOT NULL, payload text)" \
     -c "SELECT pg_shard.create_distributed_table('copy_distributed', 'id', shard_count => 32)" >/dev/null
copy_ms() { # table
    meta -c "TRUNCATE $1" >/dev/null
    { echo '\timing on'; echo "\\copy $1 FROM '$scratch/rows.csv' CSV"; } | meta 2>&1 |
        sed -n 's/^Time: \([0-9.]*\) ms.*/\1/p' | tail -1
}
copy_single=() copy_distributed=()
for _ in 1 2 3; do
    copy_single+=("$(copy_ms copy_single)")
    copy_distributed+=("$(copy_ms copy_distributed)")
done
median3() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
single_copy=$(median3 "${copy_single[@]}")
distributed_copy=$(median3 "${copy_distributed[@]}")
echo "COPY of $rows rows from the client: one PostgreSQL ${single_copy} ms, distributed" \
     "${distributed_copy} ms: $(ratio "$single_copy" "$distributed_copy") of the rate" \
     "(runs: ${copy_single[*]} / ${copy_distributed[*]})"
