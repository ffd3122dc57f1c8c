#!/usr/bin/env bash
# Lookup tables: a read by a looked-up column (two single-shard hops
# through the coordinator) against a read by the distribution key, and the
# cost a lookup adds to an INSERT.
#
# customers (id, login, name), distributed by id over 8 shards on 2
# workers, 100,000 rows, a unique lookup of login (login = id + 1,000,000:
# an integer, so pgbench can bind it; indexed on customers too, as the
# second hop filters the shard by it). Reads: by_key reads a random
# customer's name by id, by_login by login. Inserts: one row with a random
# key into plain_inserts (no lookup) or looked_inserts (a unique lookup of
# login), both through the coordinator (a write of a table with lookups
# runs on the metadata node, which writes the lookup in the same
# transaction), and into plain_inserts through the metadata node too (its
# hop without the lookup's write); and ten rows per INSERT, each with its
# own random key, into either on the metadata node (one statement per
# shard group), and into plain_inserts over postgres_fdw (the path such
# INSERTs took before; pg_shard.enable_pushdown_executor = off).
# Rounds alternate (ROUNDS, default 3, of
# SECONDS, default 10, with 4 clients); prints each round's tps and the
# ratios of the sums.
#
# Own throwaway cluster: metadata 29820, workers 29821-29822, coordinator
# 29920. Run with: bash benches/lookups.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_ROUND:-10}
# shellcheck source=benches/pgbench_cluster.sh
. "$repo/benches/pgbench_cluster.sh"
pgbench_cluster lookups 29820 1
meta >/dev/null <<'SQL'
CREATE TABLE customers (id bigint PRIMARY KEY, login bigint NOT NULL, name text NOT NULL);
SELECT pg_shard.create_distributed_table('customers', 'id', shard_count => 8, colocate_with => 'none');
INSERT INTO customers SELECT g, g + 1000000, 'customer ' || g FROM generate_series(1::bigint, 100000) g;
SELECT pg_shard.create_lookup('customers', 'login', "unique" => true);
CREATE TABLE plain_inserts (id bigint PRIMARY KEY, login bigint NOT NULL, name text NOT NULL);
SELECT pg_shard.create_distributed_table('plain_inserts', 'id', shard_count => 8, colocate_with => 'none');
CREATE TABLE looked_inserts (id bigint PRIMARY KEY, login bigint NOT NULL, name text NOT NULL);
SELECT pg_shard.create_distributed_table('looked_inserts', 'id', shard_count => 8, colocate_with => 'none');
SELECT pg_shard.create_lookup('looked_inserts', 'login', "unique" => true);
CREATE INDEX ON customers (login);
ANALYZE customers;
SQL
sleep 1
cat >"$scratch/by_key.sql" <<'SQL'
\set c random(1, 100000)
SELECT name FROM customers WHERE id = :c;
SQL
cat >"$scratch/by_login.sql" <<'SQL'
\set l random(1000001, 1100000)
SELECT name FROM customers WHERE login = :l;
SQL
for table in plain_inserts looked_inserts; do
    cat >"$scratch/$table.sql" <<SQL
\set id random(1, 4611686018427387903)
INSERT INTO $table VALUES (:id, :id, 'x');
SQL
done
# Ten rows per INSERT, each with its own random key (so across shards).
for table in plain_inserts looked_inserts; do
    {
        for i in $(seq 1 10); do echo "\\set id$i random(1, 4611686018427387903)"; done
        printf 'INSERT INTO %s VALUES ' "$table"
        for i in $(seq 1 10); do printf '(:id%s, :id%s, %s)%s' "$i" "$i" "'x'" "$([ "$i" = 10 ] && echo ';' || echo ', ')"; done
        echo
    } >"$scratch/multi_$table.sql"
done
run() { # run SCRIPT PORT [PGOPTIONS]
    PGOPTIONS=${3:-} pgbench -n -M extended -c 4 -j 2 -T "$seconds" -h 127.0.0.1 -p "$2" \
        -f "$scratch/$1.sql" bench 2>&1 | awk '/^tps/ {print $3; exit}'
}
sum() { echo "$1 + $2" | bc -l; }
key_sum=0 login_sum=0 plain_sum=0 looked_sum=0 meta_sum=0 multi_sum=0 multi_fdw_sum=0 multi_looked_sum=0
for round in $(seq 1 "$rounds"); do
    key=$(run by_key "$coordinator_port")
    login=$(run by_login "$coordinator_port")
    plain=$(run plain_inserts "$coordinator_port")
    looked=$(run looked_inserts "$coordinator_port")
    via_meta=$(run plain_inserts "$meta_port")
    echo "round $round: reads by key $key tps, by login $login tps;" \
        "inserts without a lookup $plain tps, with one $looked tps, without one through the metadata node $via_meta tps"
    key_sum=$(sum "$key_sum" "$key") login_sum=$(sum "$login_sum" "$login")
    plain_sum=$(sum "$plain_sum" "$plain") looked_sum=$(sum "$looked_sum" "$looked")
    meta_sum=$(sum "$meta_sum" "$via_meta")
    multi=$(run multi_plain_inserts "$meta_port")
    multi_fdw=$(run multi_plain_inserts "$meta_port" "-c pg_shard.enable_pushdown_executor=off")
    multi_looked=$(run multi_looked_inserts "$meta_port")
    echo "round $round: 10-row inserts on the metadata node without a lookup $multi tps" \
        "(over postgres_fdw: $multi_fdw tps), with one $multi_looked tps"
    multi_sum=$(sum "$multi_sum" "$multi") multi_fdw_sum=$(sum "$multi_fdw_sum" "$multi_fdw")
    multi_looked_sum=$(sum "$multi_looked_sum" "$multi_looked")
done
printf 'read by login / read by key: %.3f\n' "$(echo "$login_sum / $key_sum" | bc -l)"
printf 'insert with a lookup / without: %.3f (without, through the metadata node / through the coordinator: %.3f)\n' \
    "$(echo "$looked_sum / $plain_sum" | bc -l)" "$(echo "$meta_sum / $plain_sum" | bc -l)"
printf '10-row insert: over postgres_fdw / one statement per shard group: %.3f; with a lookup / without: %.3f\n' \
    "$(echo "$multi_fdw_sum / $multi_sum" | bc -l)" "$(echo "$multi_looked_sum / $multi_sum" | bc -l)"
# Where the statements went.
psql -X -At -h 127.0.0.1 -p "$coordinator_port" -d bench -c "SHOW STATS" | sed 's/^/servers: /'
meta -c "SELECT count(*) = (SELECT count(*) FROM looked_inserts_login_lookup) FROM looked_inserts" |
    sed 's/^/every inserted row has its lookup entry: /'
