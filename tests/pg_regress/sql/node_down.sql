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
-- nor does an index: on a reference table (CONCURRENTLY too: a reference
-- table's index is built in one transaction, all or nothing) or on a
-- distributed table with a shard on the stopped node (every node is reached
-- before a CONCURRENTLY build starts)
SELECT s.table_rel::text AS outage_table, t.dist_column AS outage_column
  FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) JOIN pg_shard.node n USING (node_id)
  JOIN pg_shard.logical_table t ON t.table_rel = s.table_rel
 WHERE n.port = 25323 AND t.kind = 'distributed' ORDER BY 1 LIMIT 1 \gset
\set VERBOSITY terse
CREATE INDEX countries_during_outage ON countries (name);
CREATE INDEX CONCURRENTLY countries_during_outage ON countries (name);
CREATE INDEX during_outage_idx ON :outage_table (:"outage_column");
CREATE INDEX CONCURRENTLY during_outage_idx ON :outage_table (:"outage_column");
\set VERBOSITY default
SELECT count(*) AS indexes FROM pg_class WHERE relname IN ('countries_during_outage', 'during_outage_idx');
SELECT count(*) AS recorded FROM pg_shard.table_constraint WHERE name = 'during_outage_idx';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS indexes FROM pg_class WHERE relname LIKE 'countries_during_outage%' OR relname LIKE 'during_outage_idx%';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a statement that needs the stopped node fails naming it (pushed down to
-- every shard group, by key, or one statement per shard group), changing
-- nothing; one by a key on another node runs
SELECT format_type(atttypid, atttypmod) AS outage_type FROM pg_attribute
 WHERE attrelid = :'outage_table'::regclass AND attname = :'outage_column' \gset
WITH keys AS (
  SELECT k, (SELECT pl.node_id = n.node_id
               FROM pg_shard.shard s JOIN pg_shard.shard_group g USING (shard_group_id)
               JOIN pg_shard.placement pl USING (shard_group_id), pg_shard.node n
              WHERE s.table_rel = :'outage_table'::regclass AND n.port = 25323
                AND pg_shard.keyspace_id(CAST(k::text AS :outage_type)) BETWEEN g.range_start AND g.range_end) AS on_stopped
    FROM generate_series(1, 1000) k)
SELECT min(k) FILTER (WHERE on_stopped) AS down_key, min(k) FILTER (WHERE NOT on_stopped) AS up_key FROM keys \gset
\set VERBOSITY terse
SELECT count(*) FROM :outage_table;
SELECT count(*) FROM :outage_table WHERE :"outage_column" = CAST(:'down_key' AS :outage_type);
DELETE FROM :outage_table WHERE :"outage_column" IS NULL;
\set VERBOSITY default
SELECT count(*) >= 0 AS runs FROM :outage_table WHERE :"outage_column" = CAST(:'up_key' AS :outage_type);
-- recovery keeps the commit records of a node it cannot ask (its prepared
-- transactions are decided by them when it is back), and deletes those of
-- the nodes it asked that hold no such prepared transaction
INSERT INTO pg_shard.remote_transaction (gid, node_id)
SELECT pg_shard.gid_prefix() || '1_1_1', node_id FROM pg_shard.node WHERE port = 25323
UNION ALL
SELECT pg_shard.gid_prefix() || '1_1_2', node_id FROM pg_shard.node WHERE port = 25321;
\set VERBOSITY terse
SELECT pg_shard.recover_prepared_transactions() AS ended;
\set VERBOSITY default
SELECT n.port, count(*) AS records FROM pg_shard.remote_transaction r JOIN pg_shard.node n USING (node_id)
 WHERE r.gid IN (pg_shard.gid_prefix() || '1_1_1', pg_shard.gid_prefix() || '1_1_2') GROUP BY n.port ORDER BY 1;
DELETE FROM pg_shard.remote_transaction WHERE gid = pg_shard.gid_prefix() || '1_1_1';
-- node_health() says which node does not answer (/metrics: pg_shard_node_up)
SELECT port, reachable, prepared_transactions FROM pg_shard.node_health() ORDER BY port;
