#!/usr/bin/env bash
# INSERTs that leave columns to `DEFAULT now()` and a `bigserial` id: the
# metadata node computes those values and the statement runs on its worker
# in one round trip (router), where it took postgres_fdw before (its path
# with pg_shard.enable_router_executor = off). Also the same INSERT giving
# every value itself (nothing to compute), and the defaulted one on a table
# with a unique lookup (which the postgres_fdw path refused).
#
# events (tenant, id bigserial, at timestamptz DEFAULT now(), note),
# distributed by tenant over 8 shards on 2 workers; looked_events the same
# with a unique lookup of note. Each INSERT is one row with a random tenant,
# on the metadata node (4 clients, pgbench -M extended). Rounds alternate
# (ROUNDS, default 3, of SECONDS_PER_ROUND, default 10); prints each
# round's tps and the ratios of the sums.
#
# Own throwaway cluster: metadata 29820, workers 29821-29822, coordinator
# 29920. Run with: bash benches/computed_values.sh
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
rounds=${ROUNDS:-3}
seconds=${SECONDS_PER_ROUND:-10}
# shellcheck source=benches/pgbench_cluster.sh
. "$repo/benches/pgbench_cluster.sh"
pgbench_cluster computed_values 29820 1
meta >/dev/null <<'SQL'
CREATE TABLE events (tenant bigint NOT NULL, id bigserial, at timestamptz NOT NULL DEFAULT now(),
                     note text, PRIMARY KEY (tenant, id));
SELECT pg_shard.create_distributed_table('events', 'tenant', shard_count => 8, colocate_with => 'none');
CREATE TABLE looked_events (tenant bigint NOT NULL, id bigserial, at timestamptz NOT NULL DEFAULT now(),
                            note text, PRIMARY KEY (tenant, id));
SELECT pg_shard.create_distributed_table('looked_events', 'tenant', shard_count => 8, colocate_with => 'none');
SELECT pg_shard.create_lookup('looked_events', 'note', "unique" => true);
SQL
sleep 1
for table in events looked_events; do
    cat >"$scratch/defaults_$table.sql" <<SQL
\set t random(1, 4611686018427387903)
INSERT INTO $table (tenant, note) VALUES (:t, :t::text);
SQL
done
cat >"$scratch/explicit.sql" <<'SQL'
\set t random(1, 4611686018427387903)
INSERT INTO events (tenant, id, at, note) VALUES (:t, :t, '2026-12-01 00:00+00', :t::text);
SQL
run() { # run SCRIPT [PGOPTIONS]
    PGOPTIONS=${2:-} pgbench -n -M extended -c 4 -j 2 -T "$seconds" -h 127.0.0.1 -p "$meta_port" \
        -f "$scratch/$1.sql" bench 2>&1 | awk '/^tps/ {print $3; exit}'
}
sum() { echo "$1 + $2" | bc -l; }
routed_sum=0 fdw_sum=0 explicit_sum=0 looked_sum=0
for round in $(seq 1 "$rounds"); do
    routed=$(run defaults_events)
    fdw=$(run defaults_events "-c pg_shard.enable_router_executor=off")
    explicit=$(run explicit)
    looked=$(run defaults_looked_events)
    echo "round $round: defaulted inserts computed here $routed tps, over postgres_fdw $fdw tps;" \
        "every value given $explicit tps; defaulted with a lookup $looked tps"
    routed_sum=$(sum "$routed_sum" "$routed") fdw_sum=$(sum "$fdw_sum" "$fdw")
    explicit_sum=$(sum "$explicit_sum" "$explicit") looked_sum=$(sum "$looked_sum" "$looked")
done
printf 'defaulted insert: over postgres_fdw / computed here: %.3f\n' "$(echo "$fdw_sum / $routed_sum" | bc -l)"
printf 'defaulted insert computed here / every value given: %.3f\n' "$(echo "$routed_sum / $explicit_sum" | bc -l)"
printf 'defaulted insert with a lookup / without: %.3f\n' "$(echo "$looked_sum / $routed_sum" | bc -l)"
meta -c "SELECT count(*) = count(DISTINCT id) AND max(id) <= (SELECT last_value FROM events_id_seq) FROM events WHERE id < 1000000000" |
    sed 's/^/every defaulted row has its own id from the sequence: /'
meta -c "SELECT count(*) = (SELECT count(*) FROM looked_events_note_lookup) FROM looked_events" |
    sed 's/^/every row with a lookup has its entry: /'
