#!/usr/bin/env bash
# Self-routing ids: a read by order id (a column declared with
# pg_shard.set_routing_id) against a read by the distribution key, both
# through the coordinator, and the cost of one pg_shard.next_id call.
#
# orders (customer_id, order_id, amount), distributed by customer_id over 8
# shards on 2 workers, one order per customer for 100,000 customers, the
# order ids from pg_shard.next_id. Both pgbench scripts first read a random
# customer's order id by key (\gset), then read the order again: by key in
# by_key, by order id in by_id; the difference is the second read alone.
# Rounds alternate between the two (ROUNDS, default 3, of SECONDS, default
# 10, with 4 clients); prints each round's tps and the ratio of the sums.
# Then next_id per call on the metadata node, 500,000 calls in one
# statement, against keyspace_id (hashing alone) and nextval.
#
# Own throwaway cluster: metadata 29820, workers 29821-29822, coordinator
# 29920. Run with: bash benches/routing_ids.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_ROUND:-10}
# shellcheck source=benches/pgbench_cluster.sh
. "$repo/benches/pgbench_cluster.sh"
pgbench_cluster ids 29820 1
meta >/dev/null <<'SQL'
CREATE TABLE orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, amount int NOT NULL,
                     PRIMARY KEY (customer_id, order_id));
SELECT pg_shard.create_distributed_table('orders', 'customer_id', shard_count => 8, colocate_with => 'none');
INSERT INTO orders SELECT c, pg_shard.next_id('orders', c), c % 1000 FROM generate_series(1::bigint, 100000) c;
CREATE INDEX ON orders (order_id);
SELECT pg_shard.set_routing_id('orders', 'order_id');
ANALYZE orders;
CREATE SEQUENCE bench_seq;
SQL
sleep 1
cat >"$scratch/by_key.sql" <<'SQL'
\set c random(1, 100000)
SELECT order_id FROM orders WHERE customer_id = :c \gset
SELECT amount FROM orders WHERE customer_id = :c;
SQL
cat >"$scratch/by_id.sql" <<'SQL'
\set c random(1, 100000)
SELECT order_id FROM orders WHERE customer_id = :c \gset
SELECT amount FROM orders WHERE order_id = :order_id;
SQL
run() {
    pgbench -n -M extended -c 4 -j 2 -T "$seconds" -h 127.0.0.1 -p "$coordinator_port" -f "$scratch/$1.sql" bench 2>&1 |
        awk '/^tps/ {print $3; exit}'
}
key_sum=0 id_sum=0
for round in $(seq 1 "$rounds"); do
    key=$(run by_key)
    id=$(run by_id)
    echo "round $round: by key $key tps, by id $id tps"
    key_sum=$(echo "$key_sum + $key" | bc -l)
    id_sum=$(echo "$id_sum + $id" | bc -l)
done
printf 'by id / by key: %.3f\n' "$(echo "$id_sum / $key_sum" | bc -l)"
# Where the reads went: the coordinator counts statements per shard and per server.
psql -X -At -h 127.0.0.1 -p "$coordinator_port" -d bench -c "SHOW STATS" | sed 's/^/servers: /'

per_call() {
    local started ended
    started=$(date +%s%N)
    meta -c "SELECT count($1) FROM generate_series(1::bigint, 500000) g" >/dev/null
    ended=$(date +%s%N)
    echo "$(( (ended - started) / 500000 ))"
}
for round in $(seq 1 "$rounds"); do
    echo "per call (ns, round $round): next_id $(per_call "pg_shard.next_id('orders', g)")," \
        "keyspace_id $(per_call "pg_shard.keyspace_id(g)"), nextval $(per_call "nextval('bench_seq')")," \
        "nothing $(per_call "g")"
done
