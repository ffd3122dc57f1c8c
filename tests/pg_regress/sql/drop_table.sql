-- DROP TABLE on a distributed or reference table drops its shards on the
-- workers and its catalog rows, and moves the map version.
CREATE TABLE short_lived (id bigint PRIMARY KEY, v text);
INSERT INTO short_lived SELECT g, 'v' || g FROM generate_series(1, 20) g;
SELECT pg_shard.create_distributed_table('short_lived', 'id', shard_count => 4, colocate_with => 'none');
CREATE TABLE short_lived_ref (code text PRIMARY KEY);
SELECT pg_shard.create_reference_table('short_lived_ref');
SELECT colocation_id AS short_lived_group FROM pg_shard.logical_table
WHERE table_rel = 'short_lived'::regclass \gset
SELECT pg_shard.map_version() AS version_before \gset

DROP TABLE short_lived;
SELECT pg_shard.map_version() = :version_before + 1 AS map_bumped;
SELECT count(*) AS catalog_shards FROM pg_shard.shard WHERE shard_name ~ '^short_lived_[0-9]+$';
-- its co-location group was its own: gone too, with its ranges and placements
SELECT count(*) AS groups FROM pg_shard.colocation_group WHERE colocation_id = :short_lived_group;
SELECT count(*) AS ranges FROM pg_shard.shard_group WHERE colocation_id = :short_lived_group;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS shard_tables FROM pg_class WHERE relname ~ '^short_lived_[0-9]+$' AND relkind = 'r';
SELECT count(*) AS ownership_records FROM pg_shard.local_shard WHERE shard_rel::text ~ '^short_lived_[0-9]+$';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- a reference table; the reference group stays while other reference tables use it
DROP TABLE short_lived_ref;
SELECT count(*) AS reference_tables, count(DISTINCT colocation_id) AS reference_groups
FROM pg_shard.logical_table WHERE kind = 'reference';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT count(*) AS shard_tables FROM pg_class WHERE relname ~ '^short_lived_ref_[0-9]+$' AND relkind = 'r';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- a DROP that rolls back keeps everything, on the workers too
BEGIN;
DROP TABLE sessions;
ROLLBACK;
SELECT count(*) AS sessions_shards FROM pg_shard.shards WHERE table_name = 'sessions'::regclass;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS sessions_shard_tables FROM pg_class WHERE relname ~ '^sessions_[0-9]+$' AND relkind = 'r';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- dropping a plain table is none of pg_shard's business
CREATE TABLE plain_table (id int);
SELECT pg_shard.map_version() AS version_before \gset
DROP TABLE plain_table;
SELECT pg_shard.map_version() = :version_before AS map_unchanged;
