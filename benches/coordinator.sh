#!/usr/bin/env bash
# The coordinator on the hot path, side by side in one run:
#   pgbench -S at scale S (default 10) for T seconds (default 15) at 4 and 16
#   clients, simple and prepared protocol, on a quiet machine and again with
#   a CPU-bound process beside it, against
#     direct       one PostgreSQL holding the same data (TCP 127.0.0.1)
#     pgbouncer    pgbouncer (transaction pooling) in front of it, reaching
#                  the server over TCP, and over its Unix-domain socket
#     coordinator  the coordinator in front of the cluster (pgbench_accounts
#                  distributed by aid over 2 workers; PGSHARD_BENCH_WORKERS
#                  sets how many), reaching the servers
#                  over TCP, and over their Unix-domain sockets
#   Clients always connect over TCP to 127.0.0.1. Reports tps, the ratio to
#   direct, and p50/p99 latency (from pgbench's per-transaction log).
#   Then two-account transfers (BEGIN; UPDATE; UPDATE; COMMIT) and their
#   floor (the nodes' share of them, sent without a coordinator), COPY of 1M
#   rows, the coordinator against a baseline binary, and point reads
#   (pgbench -S, one client) while three clients pipeline
#   50,000 INSERTs each before one Sync, direct and through the coordinator;
#   and pgbench -N through the coordinator (history distributed by aid and
#   co-located with accounts; branches and tellers reference tables).
#
# Own throwaway cluster: metadata 29320, workers 29321-29322, coordinator
# 29420 (Unix sockets) and 29422 (TCP), with PGSHARD_BENCH_BASELINE=<binary>
# a baseline coordinator on 29424 (Unix sockets), pgbouncer 29430 (TCP) and 29431
# (Unix socket); the single PostgreSQL is a plain server (no pg_shard) on
# 29330, configured like the cluster's. Run with: make bench-coordinator
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scale=${1:-10}
seconds=${2:-15}
# Sections to run (default all): PGSHARD_BENCH_SECTIONS=hot,busy,transfers,floor,copy,pairs,pipeline,writes
sections=${PGSHARD_BENCH_SECTIONS:-hot,busy,transfers,floor,copy,pairs,pipeline,writes}
section() { [[ ",$sections," == *",$1,"* ]]; }
# Workers the distributed copy is spread over (default 2).
workers=${PGSHARD_BENCH_WORKERS:-2}

export PGSHARD_CLUSTER_DIR=$repo/.cluster-bench-coordinator
export PGSHARD_BASE_PORT=29320
export PGSHARD_WORKERS=$workers
export PGSHARD_DATABASE=bench
export PGUSER=postgres
bin=${CARGO_TARGET_DIR:-$repo/target}/release/pg_shard_coordinator
"$repo/scripts/cluster.sh" destroy >/dev/null
"$repo/scripts/cluster.sh" start >/dev/null
cluster_dir=$(readlink -f "$PGSHARD_CLUSTER_DIR")
scratch=$(mktemp -d)
chmod 755 "$scratch"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    for ini in "$scratch"/pgbouncer*.ini; do
        [ -f "$ini.pid" ] && kill "$(cat "$ini.pid")" 2>/dev/null || true
    done
    [ -f "$scratch/single/data/postmaster.pid" ] &&
        (cd / && runuser -u postgres -- "$(pg_config --bindir)/pg_ctl" -D "$scratch/single/data" -m fast -w -s stop) >/dev/null 2>&1
    rm -rf "$scratch"
    "$repo/scripts/cluster.sh" destroy >/dev/null
}
trap cleanup EXIT

# The distributed copy, loaded and distributed through the coordinator.
psql -X -q -h 127.0.0.1 -p 29420 -d bench -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE EXTENSION pg_shard;
$(for i in $(seq 1 "$workers"); do echo "SELECT pg_shard.add_node('127.0.0.1', $((29320 + i)));"; done)
SQL
pgbench -i -q -s "$scale" -h 127.0.0.1 -p 29420 bench >/dev/null 2>&1
psql -X -q -h 127.0.0.1 -p 29420 -d bench -v ON_ERROR_STOP=1 >/dev/null <<SQL
ALTER TABLE pgbench_history REPLICA IDENTITY FULL;
SELECT pg_shard.create_distributed_table('pgbench_accounts', 'aid');
SELECT pg_shard.create_distributed_table('pgbench_history', 'aid', colocate_with => 'pgbench_accounts');
SELECT pg_shard.create_reference_table('pgbench_branches');
SELECT pg_shard.create_reference_table('pgbench_tellers');
SQL
for i in $(seq 1 "$workers"); do psql -X -q -h 127.0.0.1 -p $((29320 + i)) -d bench -c "VACUUM ANALYZE"; done
# The single PostgreSQL with the same data.
single_dir=$scratch/single
mkdir -p "$single_dir" && chown postgres "$single_dir"
as_postgres() { (cd / && runuser -u postgres -- "$@"); }
as_postgres "$(pg_config --bindir)/initdb" -D "$single_dir/data" --auth=trust --username=postgres \
    --encoding=UTF8 --locale=C.UTF-8 >/dev/null
# Configured as scripts/cluster.sh configures the cluster's nodes (in the
# file: pg_ctl -o drops whatever follows a line break).
"$repo/scripts/cluster.sh" conf 29330 "$single_dir" >>"$single_dir/data/postgresql.conf"
as_postgres "$(pg_config --bindir)/pg_ctl" -D "$single_dir/data" -l "$single_dir/server.log" -w -s start
# Compared like with like: the same durability settings on both sides.
durability() { # port → the settings that decide what a commit costs
    psql -X -At -h 127.0.0.1 -p "$1" -d postgres -c \
        "SELECT string_agg(name || '=' || setting, ',' ORDER BY name) FROM pg_settings
          WHERE name IN ('fsync', 'synchronous_commit', 'full_page_writes', 'shared_buffers')"
}
single_settings=$(durability 29330)
cluster_settings=$(durability 29321)
if [ "$single_settings" != "$cluster_settings" ]; then
    echo "the single PostgreSQL ($single_settings) is not configured like the cluster ($cluster_settings)" >&2
    exit 1
fi
psql -X -q -h 127.0.0.1 -p 29330 -d postgres -c "CREATE DATABASE single"
pgbench -i -q -s "$scale" -h 127.0.0.1 -p 29330 single >/dev/null 2>&1

# A second coordinator reaching the servers over TCP. Every coordinator runs
# in a session of its own, as pgbouncer -d does and as a service manager would
# start it: with autogroup scheduling (Debian's default) the CPU is shared
# between sessions first, and one shared with pgbench (and the hog below)
# would get a share of that session's.
setsid "$bin" --listen 127.0.0.1:29422 --metadata 127.0.0.1:29320 --metrics-listen "" \
    >"$scratch/coordinator-tcp.log" 2>&1 &
pids+=($!)
# Before and after side by side: PGSHARD_BENCH_BASELINE names another
# coordinator binary (an older build), run on 29424 in front of the same
# cluster over the same sockets, measured in the same loop.
coordinators=("coordinator (servers over TCP):29422:bench"
              "coordinator (servers over sockets):29420:bench")
if [ -n "${PGSHARD_BENCH_BASELINE:-}" ]; then
    setsid "$PGSHARD_BENCH_BASELINE" --listen 127.0.0.1:29424 --metadata 127.0.0.1:29320 \
        --metrics-listen "" --server-socket-dir "$cluster_dir" >"$scratch/coordinator-baseline.log" 2>&1 &
    baseline_pid=$!
    pids+=("$baseline_pid")
    coordinators+=("baseline (servers over sockets):29424:bench")
fi
# pgbouncer, transaction pooling, as Debian packages it (it refuses root).
pgbouncer_start() { # port server-host
    local ini=$scratch/pgbouncer-$1.ini
    cat >"$ini" <<INI
[databases]
single = host=$2 port=29330 dbname=single
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $1
auth_type = trust
auth_file = $scratch/users.txt
pool_mode = transaction
default_pool_size = 20
max_client_conn = 200
logfile = $scratch/pgbouncer-$1.log
pidfile = $ini.pid
INI
    echo '"postgres" ""' >"$scratch/users.txt"
    chown -R postgres "$scratch"
    (cd / && runuser -u postgres -- pgbouncer -d "$ini")
}
pgbouncer_start 29430 127.0.0.1
pgbouncer_start 29431 "$single_dir"
sleep 1

run() { # label port database clients [protocol] → "tps p50 p99"
    local log=$scratch/log-$1-$4
    rm -f "$log".*
    local out
    out=$(cd "$scratch" && pgbench -n -S -M "${5:-simple}" -c "$4" -j 2 -T "$seconds" -h 127.0.0.1 -p "$2" \
        -l --log-prefix="$log" --sampling-rate=0.2 "$3" 2>&1)
    local tps
    tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out")
    if grep -q "number of failed transactions: [1-9]" <<<"$out" || [ -z "$tps" ]; then
        echo "pgbench failed for $1:" >&2
        echo "$out" | tail -5 >&2
    fi
    # Field 3 of pgbench's log: the transaction's latency in microseconds.
    cat "$log".* | awk '{print $3}' | sort -n >"$log.sorted"
    local n p50 p99
    n=$(wc -l <"$log.sorted")
    p50=$(sed -n "$(( (n + 1) / 2 ))p" "$log.sorted")
    p99=$(sed -n "$(( (n * 99 + 99) / 100 ))p" "$log.sorted")
    printf '%s %s %s\n' "$tps" "$(awk "BEGIN {printf \"%.3f\", $p50 / 1000}")" \
        "$(awk "BEGIN {printf \"%.3f\", $p99 / 1000}")"
}

hot_path() { # heading
    echo "pgbench -S, scale $scale, $seconds s per run, 2 pgbench threads; $(nproc) cores; $workers worker(s)$1"
    printf '%-9s %-32s %7s %10s %7s %9s %9s\n' protocol target clients tps ratio "p50 ms" "p99 ms"
    for mode in simple prepared; do
        for clients in 4 16; do
            read -r direct_tps p50 p99 <<<"$(run "direct-$mode" 29330 single "$clients" "$mode")"
            printf '%-9s %-32s %7s %10.0f %7s %9s %9s\n' "$mode" "direct" "$clients" "$direct_tps" "1.00" "$p50" "$p99"
            for target in "pgbouncer (server over TCP):29430:single" \
                          "pgbouncer (server over socket):29431:single" "${coordinators[@]}"; do
                IFS=: read -r label port database <<<"$target"
                # PgBouncer 1.18 keeps no prepared statements in transaction
                # pooling: its clients fail under -M prepared.
                if [ "$mode" = prepared ] && [[ $label == pgbouncer* ]]; then
                    printf '%-9s %-32s %7s %10s %7s %9s %9s\n' "$mode" "$label" "$clients" "-" "-" "-" "-"
                    continue
                fi
                read -r tps p50 p99 <<<"$(run "${port}-$mode" "$port" "$database" "$clients" "$mode")"
                printf '%-9s %-32s %7s %10.0f %7.2f %9s %9s\n' "$mode" "$label" "$clients" "$tps" \
                    "$(awk "BEGIN {print $tps / $direct_tps}")" "$p50" "$p99"
            done
        done
    done
}
if section hot; then
    hot_path ""
fi
# The same with a CPU-bound process beside it (the machine busy).
if section busy; then
    echo
    # Other work on the machine: a session of its own too.
    setsid yes >/dev/null &
    hog=$!
    pids+=("$hog")
    hot_path ", with a CPU-bound process beside it (yes >/dev/null)"
    kill "$hog"
fi

# Two-account transfers: BEGIN, UPDATE one random account, UPDATE another,
# COMMIT. Through the coordinator about half of them touch both workers
# (two-phase commit), the rest one; against the same script on the single
# PostgreSQL. Deadlocks (across nodes: the coordinator's timeout) are retried.
transfer_script=$scratch/transfer.sql
cat >"$transfer_script" <<'PGBENCH'
\set a random(1, 100000 * :scale)
\set b random(1, 100000 * :scale)
\set delta random(-5000, 5000)
BEGIN;
UPDATE pgbench_accounts SET abalance = abalance - :delta WHERE aid = :a;
UPDATE pgbench_accounts SET abalance = abalance + :delta WHERE aid = :b;
END;
PGBENCH
chmod 644 "$transfer_script"
transfers() { # port database clients protocol → tps
    local out
    out=$(pgbench -n -f "$transfer_script" -s "$scale" -M "$4" -c "$3" -j 2 -T "$seconds" \
        --max-tries 10 -h 127.0.0.1 -p "$1" "$2" 2>&1)
    if grep -q "number of failed transactions: [1-9]" <<<"$out"; then
        echo "transfers failed on port $1:" >&2
        echo "$out" | tail -5 >&2
    fi
    sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out"
}
if section transfers; then
echo
echo "two-account transfers (BEGIN; UPDATE; UPDATE; COMMIT), $seconds s per run:"
printf '%-9s %7s %12s %14s %7s\n' protocol clients "direct tps" "coordinator" ratio
for mode in simple prepared; do
    for clients in 4 16; do
        direct_tps=$(transfers 29330 single "$clients" "$mode")
        coordinator_tps=$(transfers 29420 bench "$clients" "$mode")
        printf '%-9s %7s %12.0f %14.0f %7.2f\n' "$mode" "$clients" "$direct_tps" "$coordinator_tps" \
            "$(awk "BEGIN {print $coordinator_tps / $direct_tps}")"
    done
done
transfer_check=$(psql -X -At -h 127.0.0.1 -p 29320 -d bench -c \
    "SELECT sum(abalance) FROM pgbench_accounts")
echo "sum of balances after the transfers (0 before): $transfer_check"
fi

if section floor; then
# The floor under the transfers: the statements the coordinator sends for
# them, sent by pgbench straight to the nodes, in the same mix (with two
# workers: a quarter of the transfers on each worker alone — BEGIN with
# the first UPDATE, the second, COMMIT —; half on both — on each, BEGIN with
# its UPDATE, PREPARE TRANSACTION, COMMIT PREPARED — with the metadata
# node's deciding transaction), paced at the single PostgreSQL's transfer
# rate. What the nodes keep up with estimates what a coordinator costing
# nothing would reach on this machine — low: the drivers are paced each on
# its own (nodes that are not the bottleneck keep their CPU), pgbench's own
# CPU counts, and pacing caps it at direct's rate. The accounts are a plain copy of each
# worker's rows (no guard triggers: about 1 µs a row); simple protocol.
if [ "$workers" -ne 2 ]; then
    echo "floor: only with 2 workers" >&2
else
floor_dir=$scratch/floor
mkdir -p "$floor_dir" && chmod 755 "$floor_dir"
for i in 1 2; do
    port=$((29320 + i))
    union=$(psql -X -At -h 127.0.0.1 -p "$port" -d bench -c \
        "SELECT string_agg(format('SELECT bid, abalance, filler FROM %I.%I', n.nspname, c.relname), ' UNION ALL ')
           FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
          WHERE c.relname ~ '^pgbench_accounts_[0-9]+$' AND c.relkind = 'r'")
    psql -X -q -h 127.0.0.1 -p "$port" -d bench -v ON_ERROR_STOP=1 \
        -c "CREATE TABLE floor_accounts AS SELECT row_number() OVER () AS aid, bid, abalance, filler FROM ($union) AS rows" \
        -c "ALTER TABLE floor_accounts ADD PRIMARY KEY (aid)" -c "VACUUM ANALYZE floor_accounts"
    rows=$(psql -X -At -h 127.0.0.1 -p "$port" -d bench -c "SELECT count(*) FROM floor_accounts")
    cat >"$floor_dir/alone-$i.sql" <<PGBENCH
\\set a random(1, $rows)
\\set b random(1, $rows)
\\set delta random(-5000, 5000)
BEGIN\\; UPDATE floor_accounts SET abalance = abalance - :delta WHERE aid = :a;
UPDATE floor_accounts SET abalance = abalance + :delta WHERE aid = :b;
COMMIT;
PGBENCH
    cat >"$floor_dir/both-$i.sql" <<PGBENCH
\\set a random(1, $rows)
\\set delta random(-5000, 5000)
\\set g random(1, 1000000000)
BEGIN\\; UPDATE floor_accounts SET abalance = abalance - :delta WHERE aid = :a;
PREPARE TRANSACTION 'pg_shard_floor_:client_id-:g';
COMMIT PREPARED 'pg_shard_floor_:client_id-:g';
PGBENCH
done
cat >"$floor_dir/decide.sql" <<'PGBENCH'
BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE\; SELECT pg_shard.coordinated_commit_gids('{1,2}'::pg_catalog.int4[]);
COMMIT;
PGBENCH
chmod 644 "$floor_dir"/*.sql
floor_rate=$(transfers 29330 single 16 simple)
drive() { # port rate scripts... → tps
    local port=$1 rate=$2 args=()
    shift 2
    for script in "$@"; do args+=(-f "$script"); done
    local out
    out=$(pgbench -n "${args[@]}" -c 8 -j 1 -T "$seconds" -R "$rate" --max-tries 10 \
        -h 127.0.0.1 -p "$port" bench 2>&1)
    if grep -q "number of failed transactions: [1-9]" <<<"$out"; then
        echo "floor: failed transactions on port $port:" >&2
        echo "$out" | tail -5 >&2
    fi
    sed -n 's/^tps = \([0-9.]*\).*/\1/p' <<<"$out"
}
rate=${floor_rate%.*}
drive 29321 $((rate * 3 / 4)) "$floor_dir/alone-1.sql@1" "$floor_dir/both-1.sql@2" >"$floor_dir/w1" &
drivers=($!)
drive 29322 $((rate * 3 / 4)) "$floor_dir/alone-2.sql@1" "$floor_dir/both-2.sql@2" >"$floor_dir/w2" &
drivers+=($!)
drive 29320 $((rate / 2)) "$floor_dir/decide.sql" >"$floor_dir/m" &
drivers+=($!)
wait "${drivers[@]}"
kept_up=$(awk -v w1="$(cat "$floor_dir/w1")" -v w2="$(cat "$floor_dir/w2")" -v m="$(cat "$floor_dir/m")" \
    'BEGIN { t = w1 / 0.75; if (w2 / 0.75 < t) t = w2 / 0.75; if (m / 0.5 < t) t = m / 0.5; printf "%.0f", t }')
echo
echo "the nodes' share of the transfers without a coordinator (simple protocol, paced at direct's" \
    "$rate/s at 16 clients): $kept_up transfers/s, $(awk "BEGIN {printf \"%.2f\", $kept_up / $floor_rate}") of direct"
fi
fi

if section copy; then
# COPY FROM STDIN of 1M rows (text): through the coordinator, which splits
# them by key and streams each worker's share into its shards, against
# COPY into the single PostgreSQL; three runs each, in turn, best of three.
copy_rows=${PGSHARD_BENCH_COPY_ROWS:-1000000}
copy_file=$scratch/copy.tsv
awk -v n="$copy_rows" 'BEGIN { for (i = 1; i <= n; i++) printf "%d\tnote %d for the load test\t%d.%02d\n", i, i, i % 10000, i % 100 }' >"$copy_file"
chmod 644 "$copy_file"
copy_table="CREATE TABLE copy_load (id bigint PRIMARY KEY, note text NOT NULL, amount numeric NOT NULL)"
psql -X -q -h 127.0.0.1 -p 29330 -d single -c "$copy_table"
psql -X -q -h 127.0.0.1 -p 29420 -d bench -c "$copy_table" \
    -c "SELECT pg_shard.create_distributed_table('copy_load', 'id')" -c "SELECT pg_sleep(1)" >/dev/null
copy_seconds() { # port database → seconds for the COPY (the table emptied first)
    psql -X -q -h 127.0.0.1 -p "$1" -d "$2" -c "TRUNCATE copy_load"
    local start end
    start=$(date +%s.%N)
    psql -X -q -h 127.0.0.1 -p "$1" -d "$2" -v ON_ERROR_STOP=1 -c "\\copy copy_load FROM '$copy_file'" >/dev/null
    end=$(date +%s.%N)
    awk "BEGIN {printf \"%.3f\", $end - $start}"
}
direct_best=999999; coordinator_best=999999
for _ in 1 2 3; do
    d=$(copy_seconds 29330 single)
    c=$(copy_seconds 29420 bench)
    direct_best=$(awk "BEGIN {print ($d < $direct_best) ? $d : $direct_best}")
    coordinator_best=$(awk "BEGIN {print ($c < $coordinator_best) ? $c : $coordinator_best}")
    echo "copy run: direct ${d} s, coordinator ${c} s"
done
loaded=$(psql -X -At -h 127.0.0.1 -p 29320 -d bench -c "SELECT count(*) FROM copy_load")
echo
echo "COPY of $copy_rows rows (best of 3): direct $direct_best s, coordinator $coordinator_best s;" \
    "rate ratio $(awk "BEGIN {printf \"%.2f\", $direct_best / $coordinator_best}") ($loaded rows loaded)"
fi

if [ -n "${baseline_pid:-}" ] && section pairs; then
    # Before and after, run by run: the coordinator and the baseline in
    # turn, so that the machine's drift falls on both alike.
    pairs=${PGSHARD_BENCH_PAIRS:-5}
    echo
    echo "coordinator / baseline (servers over sockets), $pairs pairs of runs in turn:"
    printf '%-9s %-8s %-40s %7s\n' protocol clients "tps coordinator/baseline per pair" median
    for mode in simple prepared; do
        for clients in 4 16; do
            ratios=()
            for _ in $(seq 1 "$pairs"); do
                read -r after _ <<<"$(run paired-after 29420 bench "$clients" "$mode")"
                read -r before _ <<<"$(run paired-before 29424 bench "$clients" "$mode")"
                ratios+=("$(awk "BEGIN {printf \"%.3f\", $after / $before}")")
            done
            median=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(( (pairs + 1) / 2 ))p")
            printf '%-9s %-8s %-40s %7s\n' "$mode" "$clients" "${ratios[*]}" "$median"
        done
    done
    # Transactions on one node (pgbench -N: accounts and history are
    # co-located), the same way.
    single_node_tps() { # port clients → tps
        pgbench -n -N -M prepared -c "$2" -j 2 -T "$seconds" -h 127.0.0.1 -p "$1" bench 2>&1 |
            sed -n 's/^tps = \([0-9.]*\).*/\1/p'
    }
    echo "pgbench -N -M prepared (transactions on one node), coordinator / baseline:"
    for clients in 4 16; do
        ratios=()
        for _ in $(seq 1 "$pairs"); do
            after=$(single_node_tps 29420 "$clients")
            before=$(single_node_tps 29424 "$clients")
            ratios+=("$(awk "BEGIN {printf \"%.3f\", $after / $before}")")
        done
        median=$(printf '%s\n' "${ratios[@]}" | sort -n | sed -n "$(( (pairs + 1) / 2 ))p")
        printf '%-9s %-8s %-40s %7s\n' "-N" "$clients" "${ratios[*]}" "$median"
    done
fi

if section pipeline; then
# Point reads while three clients each pipeline 50,000 INSERTs with one
# Sync (pgbench -M extended in pipeline mode: Parse/Bind/Execute per row),
# into an ordinary table (on the metadata node through the coordinator):
# the reads must not wait behind the pipelines.
pipeline_rows=50000
load_script=$scratch/pipeline-load.sql
awk -v rows="$pipeline_rows" 'BEGIN {
    print "\\startpipeline"
    for (i = 1; i <= rows; i++) print "INSERT INTO pipeline_load VALUES (:client_id, '\''load'\'');"
    print "\\endpipeline" }' >"$load_script"
under_load() { # label port database → "reads p50 p99 pipelines"
    local log=$scratch/log-load-$2
    rm -f "$log".*
    psql -X -q -h 127.0.0.1 -p "$2" -d "$3" -c "SET client_min_messages = warning" \
        -c "DROP TABLE IF EXISTS pipeline_load" -c "CREATE TABLE pipeline_load (client int, v text)"
    # Bounded: a coordinator that stalls on long pipelines is reported, not waited for.
    (cd "$scratch" && timeout -s KILL $((seconds * 6)) pgbench -n -M extended -f "$load_script" \
        -c 3 -j 1 -T "$seconds" -h 127.0.0.1 -p "$2" "$3" >"$log.loaders" 2>&1) 2>/dev/null &
    local loaders=$!
    sleep 1
    (cd "$scratch" && timeout -s KILL $((seconds * 6)) pgbench -n -S -c 1 -j 1 -T "$((seconds - 2))" \
        -h 127.0.0.1 -p "$2" -l --log-prefix="$log" "$3" >"$log.reads" 2>&1) 2>/dev/null || true
    local rows status=0
    { wait "$loaders"; } 2>/dev/null || status=$?
    if [ "$status" -eq 137 ]; then
        rows=stalled
    else
        rows=$(psql -X -At -h 127.0.0.1 -p "$2" -d "$3" -c "SELECT count(*) FROM pipeline_load")
    fi
    if [ "$rows" = stalled ]; then
        echo "the pipelines through $1 had not finished after $((seconds * 6)) s" >&2
    elif grep -q "number of failed transactions: [1-9]" "$log.loaders" "$log.reads" ||
        [ $((rows % pipeline_rows)) -ne 0 ]; then
        echo "pgbench failed under load for $1 ($rows rows):" >&2
        tail -5 "$log.loaders" "$log.reads" >&2
    fi
    cat "$log".[0-9]* | awk '{print $3}' | sort -n >"$log.sorted"
    local n
    n=$(wc -l <"$log.sorted")
    printf '%s %s %s %s\n' "$n" \
        "$(awk "BEGIN {printf \"%.3f\", $(sed -n "$(( (n + 1) / 2 ))p" "$log.sorted") / 1000}")" \
        "$(awk "BEGIN {printf \"%.3f\", $(sed -n "$(( (n * 99 + 99) / 100 ))p" "$log.sorted") / 1000}")" \
        "$([ "$rows" = stalled ] && echo stalled || echo $((rows / pipeline_rows)))"
}
echo
echo "pgbench -S, 1 client, while 3 clients pipeline $pipeline_rows INSERTs per Sync ($seconds s):"
printf '%-32s %9s %9s %9s %10s\n' target reads "p50 ms" "p99 ms" pipelines
for target in "direct:29330:single" "${coordinators[@]:1}"; do
    IFS=: read -r label port database <<<"$target"
    read -r reads p50 p99 done_pipelines <<<"$(under_load "$label" "$port" "$database")"
    printf '%-32s %9s %9s %9s %10s\n' "$label" "$reads" "$p50" "$p99" "$done_pipelines"
done
fi

if [ -n "${baseline_pid:-}" ]; then
    # A stalled baseline ignores SIGTERM; the rest of the run is the
    # coordinator's own.
    kill -9 "$baseline_pid" 2>/dev/null || true
    { wait "$baseline_pid"; } 2>/dev/null || true
fi

if section writes; then
echo
echo "pgbench -N through the coordinator (16 clients, $seconds s):"
pgbench -n -N -c 16 -j 2 -T "$seconds" -h 127.0.0.1 -p 29420 bench 2>&1 |
    grep -E "^(tps|number of failed|latency average)"
check=$(psql -X -At -h 127.0.0.1 -p 29320 -d bench -c \
    "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT sum(delta) FROM pgbench_history)")
echo "balances equal history deltas: $check"
psql -X -h 127.0.0.1 -p 29420 -d bench -c "SHOW STATS"
fi
