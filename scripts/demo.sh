#!/usr/bin/env bash
# The demo behind `make demo`: a clean demo database on every node of the
# local cluster, the tour in examples/demo.sql, then a look at each worker.
# The cluster stays up afterwards (`make stop` stops it).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
base_port=${PGSHARD_BASE_PORT:-54320}
workers=${PGSHARD_WORKERS:-2}
database=${PGSHARD_DATABASE:-pg_shard_demo}
psql_node() { local port=$1; shift; psql -X -h 127.0.0.1 -p "$port" -U postgres "$@"; }

# Recreate the demo database everywhere, so a second `make demo` starts clean.
for i in $(seq 0 "$workers"); do
    port=$((base_port + i))
    psql_node "$port" -d postgres -q -c "DROP DATABASE IF EXISTS \"$database\" WITH (FORCE)" \
        -c "CREATE DATABASE \"$database\""
done

psql_node "$base_port" -d "$database" -v worker1_port=$((base_port + 1)) \
    -v worker2_port=$((base_port + 2)) -f "$repo/examples/demo.sql"

echo "== 6. each worker holds only its ranges: rows per shard table"
for i in $(seq 1 "$workers"); do
    port=$((base_port + i))
    echo "-- worker on 127.0.0.1:$port"
    psql_node "$port" -d "$database" -P footer=off -c "
        SELECT s.shard_rel AS shard_table, s.range_start, s.range_end, s.state, s.epoch,
               (xpath('/row/n/text()',
                      query_to_xml(format('SELECT count(*) AS n FROM %s', s.shard_rel),
                                   false, true, '')))[1]::text::bigint AS row_count
        FROM pg_shard.local_shard s ORDER BY s.shard_id"
done

echo "== 7. the worker enforces ownership: customer 1 does not belong in customer 42's shard"
read -r shard port < <(psql_node "$base_port" -d "$database" -Atc "
    SELECT shard_table, port FROM pg_shard.shards
    WHERE table_name = 'orders'::regclass
      AND pg_shard.keyspace_id(42::bigint) BETWEEN range_start AND range_end" | tr '|' ' ')
psql_node "$port" -d "$database" -c "INSERT INTO $shard VALUES (1, 999999, 1)" 2>&1 || true

coordinator_port=${PGSHARD_COORDINATOR_PORT:-6432}
echo
echo "== 8. apps connect to the coordinator (127.0.0.1:$coordinator_port): a statement on one shard"
echo "      goes straight to its worker (EXPLAIN shows the worker's plan on the shard table),"
echo "      everything else to the metadata node"
for _ in $(seq 1 50); do  # the coordinator reloads its map on NOTIFY pg_shard_map
    psql_node "$coordinator_port" -d "$database" -Atc "SHOW SHARDS" 2>/dev/null | grep -q orders && break
    sleep 0.1
done
psql_node "$coordinator_port" -d "$database" \
    -c "EXPLAIN (COSTS OFF) SELECT * FROM orders WHERE customer_id = 42" \
    -c "SELECT count(*) AS orders_of_42 FROM orders WHERE customer_id = 42" \
    -c "EXPLAIN (COSTS OFF) SELECT count(*) FROM orders" \
    -c "SHOW STATS"

echo
echo "== 9. customer 42's shard moves to the other worker online (a background job over logical"
echo "      replication); the coordinator follows the new map"
read -r shard42 target < <(psql_node "$base_port" -d "$database" -Atc "
    SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active')
    FROM pg_shard.shards s WHERE s.table_name = 'orders'::regclass
      AND pg_shard.keyspace_id(42::bigint) BETWEEN s.range_start AND s.range_end" | tr '|' ' ')
if [ -n "$target" ]; then
    psql_node "$base_port" -d "$database" -v ON_ERROR_STOP=1 \
        -c "SET pg_shard.move_drop_delay = 0" \
        -c "SELECT pg_shard.move_shard($shard42, $target) AS job" -Atq >/dev/null
    psql_node "$base_port" -d "$database" \
        -c "SET pg_shard.job_progress_interval = '1s'" \
        -c "SELECT pg_shard.wait_job(max(job_id), '2 minutes') FROM pg_shard.job" \
        -c "SELECT job_id, kind, state, phase, source, target, rows_copied, duration FROM pg_shard.jobs ORDER BY job_id DESC LIMIT 1"
    psql_node "$coordinator_port" -d "$database" \
        -c "SELECT count(*) AS orders_of_42 FROM orders WHERE customer_id = 42"
fi

echo
echo "== 10. customer 42's shard splits in two on its node (new shards, each with half of the range);"
echo "       its rows are copied and its changes applied to the half they belong to, online"
shard42=$(psql_node "$base_port" -d "$database" -Atc "
    SELECT s.shard_id FROM pg_shard.shards s WHERE s.table_name = 'orders'::regclass
      AND pg_shard.keyspace_id(42::bigint) BETWEEN s.range_start AND s.range_end")
psql_node "$base_port" -d "$database" -v ON_ERROR_STOP=1 \
    -c "SET pg_shard.move_drop_delay = 0" \
    -c "SELECT pg_shard.split_shard($shard42) AS job" -Atq >/dev/null
psql_node "$base_port" -d "$database" \
    -c "SET pg_shard.job_progress_interval = '1s'" \
    -c "SELECT pg_shard.wait_job(max(job_id), '2 minutes') FROM pg_shard.job" \
    -c "SELECT job_id, kind, state, phase, split_at, rows_copied, duration FROM pg_shard.jobs ORDER BY job_id DESC LIMIT 1" \
    -c "SELECT shard_id, shard_table, range_start, range_end, port FROM pg_shard.shards
         WHERE table_name = 'orders'::regclass ORDER BY range_start"
psql_node "$coordinator_port" -d "$database" \
    -c "SELECT count(*) AS orders_of_42 FROM orders WHERE customer_id = 42"

echo
echo "== 11. schema changes through the coordinator reach every shard in one two-phase transaction:"
echo "       a column, an index built without blocking writes, a check constraint"
psql_node "$coordinator_port" -d "$database" -v ON_ERROR_STOP=1 \
    -c "ALTER TABLE orders ADD COLUMN note text NOT NULL DEFAULT ''" \
    -c "CREATE INDEX CONCURRENTLY orders_note ON orders (note)" \
    -c "ALTER TABLE orders ADD CONSTRAINT orders_note_short CHECK (length(note) < 200)" \
    -c "SELECT kind, name, definition FROM pg_shard.table_constraint
         WHERE table_rel = 'orders'::regclass ORDER BY name"
for port in $(seq $((base_port + 1)) $((base_port + workers))); do
    psql_node "$port" -d "$database" -c "
        SELECT $port AS worker, count(*) AS order_shards,
               count(*) FILTER (WHERE EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = s.shard_rel AND a.attname = 'note'))
                   AS with_note,
               count(*) FILTER (WHERE EXISTS (SELECT 1 FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
                                              WHERE i.indrelid = s.shard_rel AND c.relname LIKE 'orders_note_%'))
                   AS with_index
          FROM pg_shard.local_shard s WHERE s.shard_rel::text LIKE 'orders_%' AND s.state = 'active'"
done

echo
echo "The cluster keeps running: psql -h 127.0.0.1 -p $base_port -U postgres $database (metadata node)"
echo "                       or: psql -h 127.0.0.1 -p $coordinator_port -U postgres $database (coordinator)"
echo "Stop it with: make stop"
