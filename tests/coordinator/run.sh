#!/usr/bin/env bash
# Tests of the coordinator against a throwaway cluster: metadata node on
# 28320, workers 28321-28322 (28323 joins for rebalancing), coordinator 28420
# (metrics 28421), a second coordinator on 28422; and shard moves through it. Prints "coordinator: N passed, M failed".
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$repo/tests/coordinator
export PGSHARD_CLUSTER_DIR=$repo/.cluster-coordinator
export PGSHARD_BASE_PORT=28320
# A third worker joins only for the rebalancing test.
export PGSHARD_WORKERS=3
export PGSHARD_DATABASE=coordinator_test
export PGUSER=postgres
coordinator=28420
metrics=127.0.0.1:28421
second=28422
bin=${CARGO_TARGET_DIR:-$repo/target}/release/pg_shard_coordinator
passed=0
failed=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
not_ok() { echo "not ok - $1"; failed=$((failed + 1)); }
check() { # check "description" command...
    local description=$1
    shift
    if "$@"; then ok "$description"; else not_ok "$description"; fi
}
via() { psql -X -h 127.0.0.1 -p "$coordinator" -d "$PGSHARD_DATABASE" -v ON_ERROR_STOP=1 "$@"; }
on_metadata() { psql -X -h 127.0.0.1 -p "$PGSHARD_BASE_PORT" -d "$PGSHARD_DATABASE" -v ON_ERROR_STOP=1 "$@"; }

second_pid=
cleanup() {
    [ -n "$second_pid" ] && kill "$second_pid" 2>/dev/null
    if [ "${PGSHARD_KEEP_CLUSTER:-0}" = 1 ]; then
        "$repo/scripts/cluster.sh" stop >/dev/null
    else
        "$repo/scripts/cluster.sh" destroy >/dev/null
    fi
}
"$repo/scripts/cluster.sh" destroy >/dev/null
"$repo/scripts/cluster.sh" start >/dev/null || { echo "coordinator: 0 passed, 1 failed (cluster)"; exit 1; }
trap cleanup EXIT
cluster_dir=$(readlink -f "$PGSHARD_CLUSTER_DIR")

# 1. pg_regress suites through the coordinator (psql, simple protocol).
pg_regress=$(pg_config --pkglibdir)/pgxs/src/test/regress/pg_regress
rm -rf "$here/results" "$here/regression.diffs" "$here/regression.out"
(cd "$here" && "$pg_regress" --use-existing --host=127.0.0.1 --port="$coordinator" --user=postgres \
    --dbname="$PGSHARD_DATABASE" --inputdir="$here" --outputdir="$here" \
    --schedule="$here/schedule" 2>&1) >"$here/pg_regress.log" || true
cat "$here/pg_regress.log"
[ -f "$here/regression.diffs" ] && cat "$here/regression.diffs"
passed=$((passed + $(grep -cE '^(ok|test) .* \.\.\. ok' "$here/pg_regress.log" || true)))
failed=$((failed + $(grep -cE '\.\.\. FAILED|\.\.\. failed' "$here/pg_regress.log" || true)))

# 2. Real clients: psycopg 3, node-postgres, tokio-postgres.
dsn="host=127.0.0.1 port=$coordinator dbname=$PGSHARD_DATABASE user=postgres"
# Debian's python3-psycopg, for Debian's python (not one on PATH before it).
python=/usr/bin/python3
run_script() { # run_script log command...: a script that dies counts as a failure
    local log=$1
    shift
    if ! "$@" >>"$log" 2>&1 && ! grep -q '^not ok - ' "$log"; then
        echo "not ok - $* exited with an error" >>"$log"
    fi
}
: >"$here/clients.log"
run_script "$here/clients.log" "$python" "$here/clients/psycopg_test.py" "$dsn"
cat "$here/clients.log"
node_dir=${PGSHARD_NODE_MODULES:-/var/tmp/pg_shard-node}
if [ ! -d "$node_dir/node_modules/pg" ]; then
    mkdir -p "$node_dir" && npm install --silent --prefix "$node_dir" pg@8 >/dev/null 2>&1
fi
NODE_PATH=$node_dir/node_modules run_script "$here/clients.log" \
    node "$here/clients/node_test.js" "$coordinator" "$PGSHARD_DATABASE"
(cd "$repo" && PGSHARD_COORDINATOR_URL="host=127.0.0.1 port=$coordinator dbname=$PGSHARD_DATABASE user=postgres" \
    cargo test -q -p pg_shard_coordinator --test clients -- --ignored 2>&1) >"$here/tokio.log"
if grep -q "^test result: ok. 3 passed" "$here/tokio.log"; then
    echo "ok - tokio-postgres: 3 tests" >>"$here/clients.log"
else
    cat "$here/tokio.log"
    echo "not ok - tokio-postgres" >>"$here/clients.log"
fi
tail -n +1 "$here/clients.log" | grep -E "^(not )?ok - (node|tokio)"
passed=$((passed + $(grep -c '^ok - ' "$here/clients.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/clients.log")))

# 3. pgbench through the coordinator: every protocol mode, no failed
# transaction, and every acknowledged write accounted for.
bench=pgbench_test
for port in 28320 28321 28322; do
    psql -X -q -h 127.0.0.1 -p $port -d postgres -c "DROP DATABASE IF EXISTS $bench" -c "CREATE DATABASE $bench"
done
pgbench_via() { pgbench -h 127.0.0.1 -p "$coordinator" "$@" "$bench"; }
psql -X -q -h 127.0.0.1 -p "$coordinator" -d "$bench" -v ON_ERROR_STOP=1 <<SQL
CREATE EXTENSION pg_shard;
SELECT pg_shard.add_node('127.0.0.1', 28321);
SELECT pg_shard.add_node('127.0.0.1', 28322);
SQL
pgbench_via -i -q -s 1 >/dev/null 2>&1
psql -X -q -h 127.0.0.1 -p "$coordinator" -d "$bench" -v ON_ERROR_STOP=1 >/dev/null <<SQL
ALTER TABLE pgbench_history REPLICA IDENTITY FULL;
SELECT pg_shard.create_distributed_table('pgbench_accounts', 'aid');
SELECT pg_shard.create_distributed_table('pgbench_history', 'aid', colocate_with => 'pgbench_accounts');
SELECT pg_shard.create_reference_table('pgbench_branches');
SELECT pg_shard.create_reference_table('pgbench_tellers');
SELECT pg_sleep(1);
SQL
invariant() {
    psql -X -At -h 127.0.0.1 -p 28320 -d "$bench" -c \
        "SELECT (SELECT sum(abalance) FROM pgbench_accounts) = (SELECT coalesce(sum(delta), 0) FROM pgbench_history)"
}
# pgbench through the coordinator, 4 clients × 200 transactions: all 800
# processed, none failed.
pgbench_passes() { # label what pgbench-arguments…
    local label=$1 what=$2 out
    shift 2
    out=$(pgbench_via -n "$@" -c 4 -j 2 -t 200 2>&1)
    if grep -q "number of transactions actually processed: 800/800" <<<"$out" &&
        grep -q "number of failed transactions: 0 " <<<"$out"; then
        ok "$label: 800 $what, none failed"
    else
        not_ok "$label"
        echo "$out" | tail -5
    fi
}
for mode in simple extended prepared; do
    for script in -S -N; do
        pgbench_passes "pgbench $script -M $mode" transactions $script -M $mode
    done
done
# Two-account transfers (pgbench custom script): about half touch both
# workers (two-phase commit through the coordinator); the sum stays.
for mode in simple extended prepared; do
    pgbench_passes "pgbench transfers -M $mode" "transactions across nodes" \
        -f "$here/transfer.pgbench" -M $mode --max-tries 10
done
check "balances equal the history's deltas after pgbench -N" test "$(invariant)" = t
history_rows=$(psql -X -At -h 127.0.0.1 -p 28320 -d "$bench" -c "SELECT count(*) FROM pgbench_history")
check "every -N transaction left one history row (2400)" test "$history_rows" = 2400
routed=$(curl -s "http://$metrics/metrics" | grep -E '^pg_shard_node_queries_total\{node="127.0.0.1:2832[12]"\}' |
    awk '{s += $2} END {print s + 0}')
check "pgbench statements went straight to the workers ($routed)" test "$routed" -gt 4000

# Two coordinators serve one cluster at once (the second without
# multiplexed reads: both ways of running reads are exercised).
"$bin" --listen 127.0.0.1:$second --metadata 127.0.0.1:28320 --metrics-listen "" \
    --server-socket-dir "$cluster_dir" --multiplex off >"$cluster_dir/coordinator2.log" 2>&1 &
second_pid=$!
for _ in $(seq 1 50); do
    psql -X -h 127.0.0.1 -p $second -d "$bench" -Atc "SHOW SHARDS" 2>/dev/null | grep -q pgbench_accounts && break
    sleep 0.1
done
pgbench -h 127.0.0.1 -p $second -n -N -c 4 -j 2 -t 300 "$bench" >"$here/second.log" 2>&1 &&
    pgbench -h 127.0.0.1 -p $second -n -S -c 4 -j 2 -t 300 "$bench" >>"$here/second.log" 2>&1 &
second_bench=$!
first_run=$(pgbench_via -n -N -M prepared -c 4 -j 2 -t 300 2>&1)
wait "$second_bench"
if grep -q "failed transactions: 0 " <<<"$first_run" && [ "$(grep -c "failed transactions: 0 " "$here/second.log")" = 2 ] &&
    [ "$(invariant)" = t ]; then
    ok "two coordinators at once: no failures, balances equal deltas"
else
    not_ok "two coordinators at once (invariant: $(invariant))"
    tail -3 "$here/second.log"
    echo "$first_run" | tail -3
fi

# 4. WrongShard: a worker takes the shard of account 42 at a newer map
# version the coordinator has not heard of; the coordinator reloads its map
# and retries (the metadata node's version moves without a NOTIFY here).
shard42=$(psql -X -At -h 127.0.0.1 -p 28320 -d "$PGSHARD_DATABASE" -c \
    "SELECT shard_table || ' ' || port FROM pg_shard.shards WHERE table_name = 'accounts'::regclass
     AND pg_shard.keyspace_id(42::bigint) BETWEEN range_start AND range_end")
read -r shard_table shard_port <<<"$shard42"
retries_before=$(curl -s "http://$metrics/metrics" | awk '/^pg_shard_wrong_shard_retries_total/ {print $2}')
version=$(psql -X -At -h 127.0.0.1 -p 28320 -d "$PGSHARD_DATABASE" -c "SELECT version FROM pg_shard.map_state")
old_epoch=$(psql -X -At -h 127.0.0.1 -p "$shard_port" -d "$PGSHARD_DATABASE" -c \
    "SELECT epoch FROM pg_shard.local_shard WHERE shard_rel = '$shard_table'::regclass")
psql -X -q -h 127.0.0.1 -p "$shard_port" -d "$PGSHARD_DATABASE" -c \
    "UPDATE pg_shard.local_shard SET epoch = $((version + 1)) WHERE shard_rel = '$shard_table'::regclass"
# Mid-transaction the refusal reaches the client (the transaction is not retried).
mid=$(psql -X -h 127.0.0.1 -p "$coordinator" -d "$PGSHARD_DATABASE" 2>&1 <<SQL
BEGIN;
SELECT balance FROM accounts WHERE id = 42;
UPDATE accounts SET balance = balance + 1 WHERE id = 42;
\echo :LAST_ERROR_SQLSTATE
ROLLBACK;
SQL
)
check "WrongShard inside a transaction reaches the client (PS001)" grep -q "^PS001" <<<"$mid"
psql -X -q -h 127.0.0.1 -p 28320 -d "$PGSHARD_DATABASE" -c "UPDATE pg_shard.map_state SET version = version + 1"
before=$(psql -X -At -h 127.0.0.1 -p 28320 -d "$PGSHARD_DATABASE" -c "SELECT balance FROM accounts WHERE id = 42")
out=$(via -Atqc "UPDATE accounts SET balance = balance + 1 WHERE id = 42 RETURNING balance" 2>&1)
retries_after=$(curl -s "http://$metrics/metrics" | awk '/^pg_shard_wrong_shard_retries_total/ {print $2}')
check "WrongShard in autocommit: map reloaded, statement retried ($out)" \
    test "$out" = "$((before + 1))" -a "$retries_after" -gt "$retries_before"
# Back to the shard's real epoch (the metadata node's postgres_fdw servers
# still declare the version before the hand-made bump).
psql -X -q -h 127.0.0.1 -p "$shard_port" -d "$PGSHARD_DATABASE" -c \
    "UPDATE pg_shard.local_shard SET epoch = $old_epoch WHERE shard_rel = '$shard_table'::regclass"
# A read on a shared (multiplexed) connection refused with WrongShard: the
# map is reloaded and the read tried again, a bounded number of times; the
# refusal then reaches the client, and the connection keeps serving.
retries_before=$(curl -s "http://$metrics/metrics" | awk '/^pg_shard_wrong_shard_retries_total/ {print $2}')
psql -X -q -h 127.0.0.1 -p "$shard_port" -d "$PGSHARD_DATABASE" -c \
    "UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_rel = '$shard_table'::regclass"
refused=$(via -Atc "SELECT owner FROM accounts WHERE id = 42" 2>&1)
psql -X -q -h 127.0.0.1 -p "$shard_port" -d "$PGSHARD_DATABASE" -c \
    "UPDATE pg_shard.local_shard SET state = 'active' WHERE shard_rel = '$shard_table'::regclass"
retries_after=$(curl -s "http://$metrics/metrics" | awk '/^pg_shard_wrong_shard_retries_total/ {print $2}')
served=$(via -Atc "SELECT owner FROM accounts WHERE id = 42" 2>&1)
check "WrongShard on a read: retried twice, then reported; served once active ($served)" \
    test "$(grep -c 'WrongShard\|wrong shard\|PS001\|retired' <<<"$refused")" -ge 1 \
    -a "$((retries_after - retries_before))" = 2 -a "$served" = "owner 42"

# 5. Faults: malformed messages, vanishing clients, a worker down and back;
# multiplexed reads (answers to their askers, slow reads, cancels, settings,
# dying connections).
: >"$here/faults.log"
run_script "$here/faults.log" "$python" "$here/clients/faults.py" "$coordinator" "$PGSHARD_DATABASE"
run_script "$here/faults.log" "$python" "$here/clients/multiplex.py" "$coordinator" 28320 \
    "$PGSHARD_DATABASE" "$metrics"
run_script "$here/faults.log" "$python" "$here/clients/session_protocol.py" "$coordinator" "$PGSHARD_DATABASE" 28320
# Transactions on several nodes: transfers through two coordinators, a
# coordinator killed at each step of a two-phase commit, a worker down.
run_script "$here/faults.log" "$python" "$here/clients/transfers.py" 28320 "$coordinator" "$second" \
    "$PGSHARD_DATABASE" "$cluster_dir" "$bin" 28321,28322
# COPY FROM STDIN split by key to the shards.
run_script "$here/faults.log" "$python" "$here/clients/copy_split.py" "$coordinator" 28320 "$PGSHARD_DATABASE"
cat "$here/faults.log"
passed=$((passed + $(grep -c '^ok - ' "$here/faults.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/faults.log")))
worker2=$cluster_dir/worker2
as_postgres() { (cd / && runuser -u postgres -- "$@"); }
key_on_worker2=$(psql -X -At -h 127.0.0.1 -p 28320 -d "$PGSHARD_DATABASE" -c \
    "SELECT min(id) FROM accounts a WHERE EXISTS (SELECT 1 FROM pg_shard.shards s
       WHERE s.table_name = 'accounts'::regclass AND s.port = 28322
         AND pg_shard.keyspace_id(a.id) BETWEEN s.range_start AND s.range_end)")
as_postgres "$(pg_config --bindir)/pg_ctl" -D "$worker2" -m fast -w stop >/dev/null
down=$(via -Atc "SELECT owner FROM accounts WHERE id = $key_on_worker2" 2>&1)
up=$(via -Atc "SELECT owner FROM accounts WHERE id = 42" 2>&1)
check "worker down: its keys fail cleanly, others are served" \
    test "$(grep -c 'pg_shard coordinator' <<<"$down")" -ge 1 -a "$up" = "owner 42"
as_postgres "$(pg_config --bindir)/pg_ctl" -D "$worker2" -l "$worker2/server.log" -w start >/dev/null
back=$(via -Atc "SELECT owner FROM accounts WHERE id = $key_on_worker2" 2>&1)
check "worker back: served again" test "$back" = "owner $key_on_worker2"
as_postgres "$(pg_config --bindir)/pg_ctl" -D "$worker2" -m fast -w restart >/dev/null
again=$(via -Atc "SELECT owner FROM accounts WHERE id = $key_on_worker2" 2>&1)
check "worker restarted: pooled connections replaced transparently" test "$again" = "owner $key_on_worker2"

# Session settings stay with their client: a pooled connection another
# client used comes back to the defaults.
via -qc "SET search_path = pg_catalog, public" -c "SET work_mem = '3MB'" -c "SELECT 1" >/dev/null
fresh=$(via -Atc "SHOW search_path" -c "SHOW work_mem")
check "SET of one client does not reach the next ($(echo $fresh))" test "$(echo $fresh)" = '"$user", public 4MB'

# A shard move and a split under write load through the coordinator and
# the metadata node (pg_shard's job runner, logical replication); a split
# and a move under every kind of change with the runner killed mid-copy and
# mid-catch-up.
: >"$here/moves.log"
run_script "$here/moves.log" "$python" "$repo/tests/moves/under_load.py" 28320 "$coordinator" "$PGSHARD_DATABASE" 20000
run_script "$here/moves.log" "$python" "$repo/tests/moves/under_load.py" 28320 "$coordinator" "$PGSHARD_DATABASE" 20000 split
run_script "$here/moves.log" "$python" "$repo/tests/moves/under_load.py" 28320 "$coordinator" "$PGSHARD_DATABASE" 20000 revert
run_script "$here/moves.log" "$python" "$repo/tests/moves/under_load.py" 28320 "$coordinator" "$PGSHARD_DATABASE" 20000 split-revert
run_script "$here/moves.log" "$python" "$repo/tests/moves/under_load.py" 28320 "$coordinator" "$PGSHARD_DATABASE" 20000 isolate
run_script "$here/moves.log" "$python" "$repo/tests/moves/cutover_lock.py" 28320 "$coordinator" "$PGSHARD_DATABASE"
# A cutover whose new side applies too late gives the shard back (the
# activation vetoed before it came, or undone after).
run_script "$here/moves.log" "$python" "$repo/tests/moves/veto.py" 28320 "$coordinator" "$PGSHARD_DATABASE" before
run_script "$here/moves.log" "$python" "$repo/tests/moves/veto.py" 28320 "$coordinator" "$PGSHARD_DATABASE" after
run_script "$here/moves.log" "$python" "$repo/tests/moves/churn.py" 28320 "$coordinator" "$PGSHARD_DATABASE" split
# Reads switched before writes: seen through the coordinator and the
# metadata node, for a move and a split, and rolled back by a cancel.
run_script "$here/moves.log" "$python" "$repo/tests/moves/reads_first.py" 28320 "$coordinator" "$PGSHARD_DATABASE" move
run_script "$here/moves.log" "$python" "$repo/tests/moves/reads_first.py" 28320 "$coordinator" "$PGSHARD_DATABASE" split
run_script "$here/moves.log" "$python" "$repo/tests/moves/reads_first.py" 28320 "$coordinator" "$PGSHARD_DATABASE" cancel
# A move's copy paced by its source's replication lag (a slot nobody reads).
run_script "$here/moves.log" "$python" "$repo/tests/moves/pacing.py" 28320 "$PGSHARD_DATABASE"
run_script "$here/moves.log" "$python" "$repo/tests/moves/churn.py" 28320 "$coordinator" "$PGSHARD_DATABASE" move
# Prepares through the coordinator while the metadata node crash-restarts.
run_script "$here/moves.log" "$python" "$repo/tests/moves/metadata_restart.py" 28320 "$coordinator" "$PGSHARD_DATABASE"
# Rebalancing onto the third worker, then draining it.
run_script "$here/moves.log" "$python" "$repo/tests/moves/rebalance.py" 28320 28323 "$PGSHARD_DATABASE"
# Rebalancing by the statement rates the coordinator reports.
run_script "$here/moves.log" "$python" "$repo/tests/moves/rebalance_load.py" 28320 "$coordinator" "$PGSHARD_DATABASE"
# Progress NOTICEs of pg_shard.wait_job for a paced move.
run_script "$here/moves.log" "$python" "$repo/tests/moves/progress.py" 28320 "$PGSHARD_DATABASE"
# Per-shard statistics, imbalance, /metrics and the alert rules' series.
run_script "$here/moves.log" "$python" "$repo/tests/monitoring/metrics.py" 28320 "$coordinator" "$metrics" \
    "$PGSHARD_DATABASE" "$repo/docs/monitoring/pg_shard.rules.yml"
# The /map page in headless chromium, and its screenshot.
run_script "$here/moves.log" "$python" "$repo/tests/monitoring/map_page.py" "$metrics" "$PGSHARD_DATABASE" \
    "$here/map.png"
# Self-routing ids: made at once on two nodes, and reads by id routed to one
# shard before and after a split and a move.
run_script "$here/moves.log" "$python" "$repo/tests/routing/routing_ids.py" 28320 "$coordinator" "$PGSHARD_DATABASE"
# Hot keys of a skewed pgbench run: SHOW HOT_KEYS, /metrics, pg_shard.hot_keys().
run_script "$here/moves.log" "$python" "$repo/tests/routing/hot_keys.py" 28320 "$coordinator" "$metrics" "$PGSHARD_DATABASE"
# Values the metadata node computes (defaults from sequences and the clock,
# generic plans' parameters), through prepared statements of real clients.
run_script "$here/moves.log" "$python" "$repo/tests/routing/computed_values.py" 28320 "$coordinator" "$second" "$PGSHARD_DATABASE"
# Lookup tables: reads by email in two single-shard hops, writes through
# both coordinators (one winner per email), moves and splits under writes,
# and a crash between the two phases (last: it crash-restarts the metadata
# node).
run_script "$here/moves.log" "$python" "$repo/tests/routing/lookups.py" 28320 "$coordinator" "$second" "$PGSHARD_DATABASE"
cat "$here/moves.log"
passed=$((passed + $(grep -c '^ok - ' "$here/moves.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/moves.log")))
# The cutovers above announced what they changed, and the coordinator
# patched its map from that; the full read that follows each patch found
# the same routes.
patches=$(grep -c 'shard map patched' "$cluster_dir/coordinator.log" || true)
check "the coordinator patched its map at the cutovers ($patches times), as the catalog says" \
    test "$patches" -ge 4 -a "$(grep -c 'patched shard map differed' "$cluster_dir/coordinator.log" || true)" = 0

# 6. Observability: admin commands and /metrics.
pools=$(via -Atc "SHOW POOLS")
check "SHOW POOLS lists the pools" grep -q "127.0.0.1:28321" <<<"$pools"
stats=$(via -Atc "SHOW STATS")
check "SHOW STATS counts statements per node" grep -q "127.0.0.1:28320|" <<<"$stats"
# A role that is not a superuser sees only its own pools, and no statistics.
on_metadata -q -c "DROP ROLE IF EXISTS sp_viewer" -c "CREATE ROLE sp_viewer LOGIN"
viewer_pools=$(psql -X -h 127.0.0.1 -p "$coordinator" -U sp_viewer -d "$PGSHARD_DATABASE" -Atc "SHOW POOLS" 2>&1)
viewer_stats=$(psql -X -h 127.0.0.1 -p "$coordinator" -U sp_viewer -d "$PGSHARD_DATABASE" -Atc "SHOW STATS" 2>&1)
check "SHOW POOLS for a role that is not a superuser: its own pools only" \
    test -n "$viewer_pools" -a "$(grep -vc '|sp_viewer|' <<<"$viewer_pools")" = 0
check "...and SHOW STATS is refused (42501)" grep -q "permission denied to run SHOW STATS" <<<"$viewer_stats"
check "...while a superuser sees every role's pools" grep -q "|postgres|" <<<"$(via -Atc "SHOW POOLS")"
on_metadata -q -c "DROP ROLE sp_viewer"
metrics_text=$(curl -s "http://$metrics/metrics")
check "/metrics: latency histograms per node" grep -q 'pg_shard_node_latency_seconds_bucket{node="127.0.0.1:28321",le="+Inf"}' <<<"$metrics_text"
check "/metrics: statements per shard" grep -q "^pg_shard_shard_queries_total{database=\"$PGSHARD_DATABASE\",shard=\"" <<<"$metrics_text"

# Busy-polling (on by default) polls only for a moment after each send: a
# coordinator that just answered statements and then has none uses almost
# no CPU (a poller that never rests would use the whole 2 s).
cpu_ticks() { awk '{print $14 + $15}' "/proc/$(cat "$cluster_dir/coordinator.pid")/stat"; }
for _ in 1 2 3; do via -Atc "SELECT 1" >/dev/null; done
idle_before=$(cpu_ticks)
sleep 2
idle_used=$(( $(cpu_ticks) - idle_before ))
check "busy-polling: an idle coordinator uses almost no CPU ($idle_used of 200 ticks in 2 s)" \
    test "$idle_used" -le 20

# 7. Authentication: SCRAM against a users file (a third coordinator).
users=$cluster_dir/users.txt
printf '"postgres" "s3cret"\n' >"$users"
"$bin" --listen 127.0.0.1:28423 --metadata 127.0.0.1:28320 --metrics-listen "" --auth scram \
    --users-file "$users" >"$cluster_dir/coordinator3.log" 2>&1 &
third_pid=$!
sleep 0.5
good=$(PGPASSWORD=s3cret psql -X -h 127.0.0.1 -p 28423 -d "$PGSHARD_DATABASE" -Atc "SELECT owner FROM accounts WHERE id = 42" 2>&1)
bad=$(PGPASSWORD=wrong psql -X -h 127.0.0.1 -p 28423 -d "$PGSHARD_DATABASE" -Atc "SELECT 1" 2>&1)
kill "$third_pid"
check "SCRAM: right password accepted" test "$good" = "owner 42"
check "SCRAM: wrong password refused" grep -q "password authentication failed" <<<"$bad"
nodb=$(psql -X -h 127.0.0.1 -p "$coordinator" -d no_such_database -Atc "SELECT 1" 2>&1)
check "passthrough: the metadata node's refusal reaches the client" grep -q 'database "no_such_database" does not exist' <<<"$nodb"
# Passthrough meets the metadata node's rules for TCP clients even though
# the coordinator reaches the node over its Unix-domain socket (trust there).
hba=$cluster_dir/metadata/pg_hba.conf
on_metadata -q -c "DROP ROLE IF EXISTS sp_secure" -c "CREATE ROLE sp_secure LOGIN PASSWORD 'right'"
cp "$hba" "$hba.saved"
{ echo "host all sp_secure 127.0.0.1/32 scram-sha-256"; cat "$hba.saved"; } >"$hba"
on_metadata -Atqc "SELECT pg_reload_conf()" >/dev/null
login_as_secure() { # port password → what the login gave
    PGPASSWORD=$2 psql -X -w -h 127.0.0.1 -p "$1" -U sp_secure -d "$PGSHARD_DATABASE" \
        -Atc "SELECT current_user" 2>&1
}
direct_nopw=$(PGPASSWORD= psql -X -w -h 127.0.0.1 -p 28320 -U sp_secure -d "$PGSHARD_DATABASE" -Atc "SELECT 1" 2>&1)
via_nopw=$(PGPASSWORD= psql -X -w -h 127.0.0.1 -p "$coordinator" -U sp_secure -d "$PGSHARD_DATABASE" -Atc "SELECT 1" 2>&1)
via_wrong=$(login_as_secure "$coordinator" wrong)
via_right=$(login_as_secure "$coordinator" right)
cp "$hba.saved" "$hba"
on_metadata -Atqc "SELECT pg_reload_conf()" >/dev/null
check "passthrough over the node's socket: a login the node refuses over TCP without a password is refused" \
    grep -q "no password supplied" <<<"$direct_nopw"
check "...through the coordinator too (no session without the password)" grep -q "no password supplied" <<<"$via_nopw"
check "...a wrong password is refused" grep -q 'password authentication failed for user "sp_secure"' <<<"$via_wrong"
check "...the right one logs in" test "$via_right" = "sp_secure"
on_metadata -q -c "DROP ROLE sp_secure"
# Passthrough logins reach the metadata node over TCP; the coordinator's
# pooled connections there use the node's socket all the same (its map
# listeners and loaders stay on TCP). Ports of this coordinator's TCP connections to the
# node, against the ports of the node's TCP sessions that are not listeners.
for _ in 1 2 3; do via -Atc "SELECT count(*) FROM pg_catalog.pg_class" >/dev/null; done
sleep 0.5
via -Atc "SELECT count(*) FROM pg_catalog.pg_class" >/dev/null
coordinator_ports=$(ss -tnpH state established "( dport = :$PGSHARD_BASE_PORT )" |
    grep "pid=$(cat "$cluster_dir/coordinator.pid")," | awk '{print $3}' | sed 's/.*://' | sort)
session_ports=$(on_metadata -Atc "SELECT client_port FROM pg_catalog.pg_stat_activity
    WHERE client_addr IS NOT NULL AND pid <> pg_catalog.pg_backend_pid()
      AND application_name NOT IN ('pg_shard_coordinator listener', 'pg_shard_coordinator map')" | sort)
over_tcp=$(comm -12 <(echo "$coordinator_ports") <(echo "$session_ports") | grep -c . || true)
check "passthrough: pooled connections to the metadata node use its socket ($over_tcp over TCP)" \
    test "$over_tcp" = 0 -a -n "$coordinator_ports"
# Each login leaves its connection (or one over the socket in its place) in
# the pool, which keeps to its size (20): 40 logins one after another do not
# leave 40 more sessions on the node.
socket_sessions() {
    on_metadata -Atc "SELECT count(*) FROM pg_catalog.pg_stat_activity
        WHERE client_port = -1 AND datname = pg_catalog.current_database()"
}
sessions_before=$(socket_sessions)
for _ in $(seq 40); do via -Atc "SELECT 1" >/dev/null; done
sleep 0.5
sessions_after=$(socket_sessions)
check "passthrough: 40 logins one after another leave at most the pool's size of sessions on the node ($sessions_before before, $sessions_after after)" \
    test "$((sessions_after - sessions_before))" -le 20

# 8. A database dropped and created again under the same name: the
# coordinator's pooled connections and map listener do not keep it busy,
# and the new database's map (lower version, other shards) is the one used.
again=cr_again
on_node() { psql -X -q -h 127.0.0.1 -p "$1" -U postgres -v ON_ERROR_STOP=1 "${@:2}"; }
make_again() { # how (coordinator|node) shards value extra_tables
    local port=$coordinator
    if [ "$1" = node ]; then
        port=28320
        on_node 28320 -d postgres -c "DROP DATABASE IF EXISTS $again WITH (FORCE)"
    fi
    for p in 28321 28322; do on_node "$p" -d postgres -c "DROP DATABASE IF EXISTS $again WITH (FORCE)" -c "CREATE DATABASE $again"; done
    on_node "$port" -d postgres -c "CREATE DATABASE $again" || return
    # On the node: the map listener reconnects (within a second) while the
    # new database has no pg_shard yet, so its first load fails.
    [ "$1" = node ] && sleep 2.5
    on_node "$port" -d "$again" -c "SET client_min_messages = warning" -c "CREATE EXTENSION pg_shard" \
        -c "SELECT pg_shard.add_node('127.0.0.1', 28321)" -c "SELECT pg_shard.add_node('127.0.0.1', 28322)" \
        -c "CREATE TABLE kv (id bigint PRIMARY KEY, v text)" \
        -c "SELECT pg_shard.create_distributed_table('kv', 'id', shard_count => $2)" \
        -c "INSERT INTO kv SELECT i, '$3' FROM generate_series(1, 40) i" >/dev/null &&
    for i in $(seq 1 "$4"); do # more map versions
        on_node "$port" -d "$again" -c "CREATE TABLE extra$i (id bigint PRIMARY KEY)" \
            -c "SELECT pg_shard.create_distributed_table('extra$i', 'id')" >/dev/null
    done
}
via_again() { psql -X -h 127.0.0.1 -p "$coordinator" -d "$again" "$@"; }
reads_again() { # the values of ids 1-40 read one by one through the coordinator, as "count value;"
    for i in $(seq 1 40); do via_again -Atc "SELECT v FROM kv WHERE id = $i" 2>&1; done | sort | uniq -c |
        awk '{$1=$1; print}' | tr '\n' ';'
}
on_node 28320 -d postgres -c "DROP DATABASE IF EXISTS $again WITH (FORCE)"
make_again coordinator 8 first 4
# Routed reads pool connections to the workers, and the map has a listener.
check "a database made through the coordinator: routed reads right" test "$(reads_again)" = "40 first;"
dropped=$(psql -X -h 127.0.0.1 -p "$coordinator" -d postgres -c "DROP DATABASE $again" 2>&1)
check "DROP DATABASE through the coordinator while it has pooled connections and a map listener there" \
    grep -q "^DROP DATABASE" <<<"$dropped"
make_again coordinator 2 second 0
check "...created again through it (2 shards instead of 8, a lower map version): every routed read is right at once" \
    test "$(reads_again)" = "40 second;"
# DROP DATABASE with the extended protocol (as drivers send it), while the
# coordinator again holds pooled connections and a listener there.
reads_again >/dev/null
extended_drop=$("$python" -c "
import psycopg
with psycopg.connect('host=127.0.0.1 port=$coordinator dbname=postgres user=postgres', autocommit=True) as c:
    c.execute('DROP DATABASE $again', prepare=True)
    print('dropped')" 2>&1)
check "...DROP DATABASE with the extended protocol too" test "$extended_drop" = dropped
# Dropped (WITH FORCE) and created again on the node itself: the listener
# reconnects and reads the new map whatever its version (one it cannot
# read yet sends statements to the metadata node until the next change).
make_again node 8 third 4
sleep 2
before=$(reads_again)
make_again node 2 fourth 0
fresh=
for _ in $(seq 1 50); do
    if [ "$(via_again -Atc "SHOW SHARDS" | grep -c '^public.kv|')" = 2 ]; then
        fresh=yes
        break
    fi
    sleep 0.1
done
check "...dropped and created again on the node: the coordinator's map is the new one within 5 s" test "$fresh" = yes
check "...and every routed read is right (before: $before)" test "$(reads_again)" = "40 fourth;"
on_node 28320 -d postgres -c "DROP DATABASE IF EXISTS $again WITH (FORCE)"
for p in 28321 28322; do on_node "$p" -d postgres -c "DROP DATABASE IF EXISTS $again WITH (FORCE)"; done

# Pooled server connections idle for longer than --server-idle-timeout
# close (a fourth coordinator, 1 s): they keep no database busy.
on_node 28320 -d postgres -c "DROP DATABASE IF EXISTS cr_idle" -c "CREATE DATABASE cr_idle"
"$bin" --listen 127.0.0.1:28424 --metadata 127.0.0.1:28320 --metrics-listen "" --server-idle-timeout 1 \
    --server-socket-dir "$cluster_dir" >"$cluster_dir/coordinator4.log" 2>&1 &
fourth_pid=$!
sleep 0.5
pooled_in_idle_db() { # server sessions in cr_idle other than the map's listener and loader
    on_node 28320 -d postgres -Atc "SELECT count(*) FROM pg_stat_activity WHERE datname = 'cr_idle'
                                    AND application_name NOT IN ('pg_shard_coordinator listener', 'pg_shard_coordinator map')"
}
clients=()
for _ in 1 2 3; do
    psql -X -h 127.0.0.1 -p 28424 -d cr_idle -Atc "SELECT pg_sleep(0.3)" >/dev/null &
    clients+=($!)
done
wait "${clients[@]}"
pooled=$(pooled_in_idle_db)
sleep 3
after_idle=$(pooled_in_idle_db)
kill "$fourth_pid"
check "--server-idle-timeout 1: pooled connections ($pooled after three clients) are closed after 3 s idle ($after_idle left)" \
    test "$pooled" -ge 1 -a "$after_idle" = 0
on_node 28320 -d postgres -c "DROP DATABASE cr_idle WITH (FORCE)"

# Client limits (a fifth coordinator): at most 4 clients, 1 s to log in.
# Half-open connections (connected, never a startup packet) past the limit
# make the next client get PostgreSQL's 53300; once they time out, an
# ordinary client is served within a second.
"$bin" --listen 127.0.0.1:28425 --metadata 127.0.0.1:28320 --metrics-listen "" --max-clients 4 \
    --authentication-timeout 1 --server-socket-dir "$cluster_dir" >"$cluster_dir/coordinator5.log" 2>&1 &
fifth_pid=$!
sleep 0.5
holders=()
for _ in 1 2 3 4 5 6; do
    sleep 4 </dev/tcp/127.0.0.1/28425 &
    holders+=($!)
done
sleep 0.2
crowded=$(psql -X -h 127.0.0.1 -p 28425 -d "$PGSHARD_DATABASE" -Atc "SELECT 1" 2>&1)
sleep 1.5
served=$(timeout 1 psql -X -h 127.0.0.1 -p 28425 -d "$PGSHARD_DATABASE" -Atc "SELECT 1" 2>&1)
kill "${holders[@]}" "$fifth_pid" 2>/dev/null
check "--max-clients 4 with 6 half-open connections: the next client gets 53300" \
    grep -q "sorry, too many clients already" <<<"$crowded"
check "--authentication-timeout 1: after they time out, a client is served within a second" test "$served" = 1

# At an open files limit of 256 (an eighth coordinator), --max-clients is
# lowered to what fits: of 300 logged-in clients the ones past it are
# refused with 53300 at once, the others served, and a new one served
# once they left.
(ulimit -n 256 && exec "$bin" --listen 127.0.0.1:28428 --metadata 127.0.0.1:28320 --metrics-listen "" \
    --server-socket-dir "$cluster_dir") >"$cluster_dir/coordinator8.log" 2>&1 &
eighth_pid=$!
sleep 0.5
: >"$here/open_files.log"
run_script "$here/open_files.log" "$python" "$here/clients/open_files.py" 28428 "$PGSHARD_DATABASE" 300
kill "$eighth_pid" 2>/dev/null
cat "$here/open_files.log"
passed=$((passed + $(grep -c '^ok - ' "$here/open_files.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/open_files.log")))

# A client that announces a large message holds only what it sent: 20
# logged-in clients each announce a 60 MiB query and send 10 bytes of it.
"$bin" --listen 127.0.0.1:28426 --metadata 127.0.0.1:28320 --metrics-listen "" \
    --server-socket-dir "$cluster_dir" >"$cluster_dir/coordinator6.log" 2>&1 &
sixth_pid=$!
sleep 0.5
grown=$("$python" "$here/clients/big_message.py" 28426 "$sixth_pid" "$PGSHARD_DATABASE")
kill "$sixth_pid" 2>/dev/null
check "20 clients announcing 60 MiB queries: the coordinator's memory grows by ${grown:-?} MiB (at most 64)" \
    test -n "$grown" -a "${grown:-9999}" -le 64

# A bounded soak (a seventh coordinator, idle server connections closed
# after 2 s): 200 clients connect, query, cancel and vanish for 45 s; then
# memory and server connections are back.
"$bin" --listen 127.0.0.1:28427 --metadata 127.0.0.1:28320 --metrics-listen "" \
    --server-idle-timeout 2 --server-socket-dir "$cluster_dir" >"$cluster_dir/coordinator7.log" 2>&1 &
seventh_pid=$!
sleep 0.5
: >"$here/soak.log"
run_script "$here/soak.log" "$python" "$here/clients/soak.py" 28427 "$seventh_pid" "$PGSHARD_DATABASE" 28320 45
kill "$seventh_pid" 2>/dev/null
cat "$here/soak.log"
passed=$((passed + $(grep -c '^ok - ' "$here/soak.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/soak.log")))

# TLS with clients: a test CA made here signs a certificate for localhost
# and 127.0.0.1; a ninth coordinator takes only TLS (tls = require), a
# tenth both (tls = allow). psql, psycopg 3 and node-postgres connect.
# Then TLS with the nodes (server_tls.sh: coordinators on 28440-28444).
tls_dir=$(mktemp -d /var/tmp/pg_shard-tls.XXXXXX)
(
    cd "$tls_dir" &&
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 \
            -subj "/CN=pg_shard test CA" &&
        openssl req -x509 -newkey rsa:2048 -nodes -keyout other.key -out other.crt -days 2 \
            -subj "/CN=another CA" &&
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" &&
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext &&
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile server.ext -out server.crt
) >"$tls_dir/openssl.log" 2>&1 || cat "$tls_dir/openssl.log"
tls_flags=(--tls-cert-file "$tls_dir/server.crt" --tls-key-file "$tls_dir/server.key")
"$bin" --listen 127.0.0.1:28429 --metadata 127.0.0.1:28320 --metrics-listen "" \
    --server-socket-dir "$cluster_dir" --tls require "${tls_flags[@]}" >"$cluster_dir/coordinator9.log" 2>&1 &
ninth_pid=$!
"$bin" --listen 127.0.0.1:28430 --metadata 127.0.0.1:28320 --metrics-listen "" \
    --server-socket-dir "$cluster_dir" --tls allow "${tls_flags[@]}" >"$cluster_dir/coordinator10.log" 2>&1 &
tenth_pid=$!
sleep 0.5
verified=$(psql -X -At "host=localhost hostaddr=127.0.0.1 port=28429 dbname=$PGSHARD_DATABASE sslmode=verify-full sslrootcert=$tls_dir/ca.crt" \
    -c "SELECT owner FROM accounts WHERE id = 42" 2>&1)
check "TLS: psql sslmode=verify-full against the test CA (got: $verified)" test "$verified" = "owner 42"
plain=$(psql -X -At "host=127.0.0.1 port=28429 dbname=$PGSHARD_DATABASE sslmode=disable" -c "SELECT 1" 2>&1 || true)
check "TLS: psql without TLS is refused by tls = require" grep -q "accepts only TLS connections (tls = require)" <<<"$plain"
: >"$here/tls.log"
run_script "$here/tls.log" "$python" "$here/clients/tls_test.py" 28429 28430 "$PGSHARD_DATABASE" \
    "$tls_dir/ca.crt" "$tls_dir/other.crt"
NODE_PATH=$node_dir/node_modules run_script "$here/tls.log" \
    node "$here/clients/tls_node.js" 28429 "$PGSHARD_DATABASE" "$tls_dir/ca.crt" "$tls_dir/other.crt"
kill "$ninth_pid" "$tenth_pid" 2>/dev/null
# TLS with the nodes (server_tls_sslmode), SCRAM-SHA-256-PLUS both ways.
run_script "$here/tls.log" bash "$here/server_tls.sh" "$bin" "$cluster_dir" "$PGSHARD_DATABASE" "$tls_dir"
bad_key=$("$bin" --listen 127.0.0.1:28431 --metadata 127.0.0.1:28320 --metrics-listen "" --tls require \
    --tls-cert-file "$tls_dir/server.crt" --tls-key-file "$tls_dir/other.key" 2>&1 || true)
check "TLS: a key that is not the certificate's stops the start, saying so" \
    grep -q "do not go together" <<<"$bad_key"
rm -rf "$tls_dir"
cat "$here/tls.log"
passed=$((passed + $(grep -c '^ok - ' "$here/tls.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/tls.log")))

# CREATE INDEX CONCURRENTLY of a distributed table under writes.
: >"$here/ddl.log"
run_script "$here/ddl.log" "$python" "$repo/tests/ddl/concurrent_index.py" 28320 "$coordinator" "$PGSHARD_DATABASE"
cat "$here/ddl.log"
passed=$((passed + $(grep -c '^ok - ' "$here/ddl.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/ddl.log")))

# Interrupted moves and splits (last: killing the job runner makes the metadata node
# restart all its backends): canceled at copy and catch-up, runner killed
# at the start of each phase, source, target and metadata node restarted.
: >"$here/crash.log"
run_script "$here/crash.log" "$python" "$repo/tests/moves/crash.py" 28320 "$PGSHARD_DATABASE" "$cluster_dir"
run_script "$here/crash.log" "$python" "$repo/tests/moves/crash.py" 28320 "$PGSHARD_DATABASE" "$cluster_dir" split
# A schema change's backend killed between the two phases of its commit.
run_script "$here/crash.log" "$python" "$repo/tests/ddl/crash_two_phase.py" 28320 "$PGSHARD_DATABASE"
# A multi-shard UPDATE and a COPY refused at PREPARE by a worker, and their backend
# killed between the two phases of their commit.
run_script "$here/crash.log" "$python" "$repo/tests/executor/crash_two_phase_dml.py" 28320 "$PGSHARD_DATABASE"
cat "$here/crash.log"
passed=$((passed + $(grep -c '^ok - ' "$here/crash.log")))
failed=$((failed + $(grep -c '^not ok - ' "$here/crash.log")))

echo "coordinator: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
