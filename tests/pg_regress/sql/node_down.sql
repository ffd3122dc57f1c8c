-- Run after worker 3 (25323) was stopped by tests/run_regress.sh: a node that
-- cannot be reached makes create_distributed_table fail and change nothing.
SELECT pg_shard.map_version() AS version_before \gset
SELECT count(*) AS shards_before FROM pg_shard.shard \gset
CREATE TABLE during_outage (id bigint PRIMARY KEY, v text);
INSERT INTO during_outage SELECT g, 'v' || g FROM generate_series(1, 100) g;
-- 3 shards round-robin over 3 active workers: one lands on the stopped node
SELECT pg_shard.create_distributed_table('during_outage', 'id', shard_count => 3);
SELECT pg_shard.map_version() = :version_before AS version_unchanged,
       (SELECT count(*) FROM pg_shard.shard) = :shards_before AS no_new_shards,
       (SELECT count(*) FROM during_outage) AS rows_still_local;
-- the shards that would have gone to the reachable workers were rolled back there too
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS stray_tables FROM pg_class WHERE relname LIKE 'during_outage%';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT count(*) AS stray_tables FROM pg_class WHERE relname LIKE 'during_outage%';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- the shards view still answers: sizes of the unreachable node are NULL, with a warning
SELECT port, count(*) AS placements, count(size_bytes) AS with_size
FROM pg_shard.shards GROUP BY port ORDER BY port;
-- a schema change that cannot reach every node changes none (countries, a
-- reference table, has a copy on the stopped node)
\set VERBOSITY terse
ALTER TABLE countries ADD COLUMN added_during_outage int;
\set VERBOSITY default
SELECT count(*) AS added FROM pg_attribute WHERE attrelid = 'countries'::regclass AND attname = 'added_during_outage';
SELECT format('%I.%I', shard_schema, shard_name) AS countries_copy FROM pg_shard.shard WHERE table_rel = 'countries'::regclass LIMIT 1 \gset
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS added FROM pg_attribute WHERE attrelid = :'countries_copy'::regclass AND attname = 'added_during_outage';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
