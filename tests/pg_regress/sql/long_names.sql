-- Names PostgreSQL must cut, and names with spaces.
-- 63-byte table names: a shard table and its primary key's index
-- (<table>_pkey, cut to the same bytes) and two long index names that share
-- their first 56 bytes stay apart once the shard id is appended.
CREATE TABLE aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa (id bigint PRIMARY KEY, v text, w text);
CREATE TABLE aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbb (id bigint PRIMARY KEY, v text);
SELECT pg_shard.create_distributed_table('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa', 'id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbb', 'id', colocate_with => 'aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa');
CREATE INDEX index_with_a_very_long_name_that_goes_on_and_on_and_on_first ON aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa (v);
CREATE INDEX index_with_a_very_long_name_that_goes_on_and_on_and_on_second ON aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa (w);
INSERT INTO aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa SELECT g, 'v' || g, 'w' || g FROM generate_series(1, 40) g;
INSERT INTO aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbb SELECT g, 'v' || g FROM generate_series(1, 40) g;
SELECT count(*) FROM aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa;
SELECT count(*) FROM aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbb;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
-- every shard table has its own name, its key and both indexes
SELECT count(*) AS shard_tables, count(DISTINCT c.relname) AS names,
       sum((SELECT count(*) FROM pg_index i WHERE i.indrelid = c.oid)) AS indexes
  FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel WHERE c.relname LIKE 'aaaa%';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a shard of a table whose schema and name hold spaces moves
CREATE SCHEMA "Long Names";
CREATE TABLE "Long Names"."Spaced Items" (id bigint PRIMARY KEY, v text);
INSERT INTO "Long Names"."Spaced Items" SELECT g, 'v' || g FROM generate_series(1, 100) g;
SELECT pg_shard.create_distributed_table('"Long Names"."Spaced Items"', 'id', shard_count => 2, colocate_with => 'none');
SELECT s.shard_id AS spaced_shard,
       (SELECT min(n.node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS spaced_target
  FROM pg_shard.shards s WHERE s.table_name = '"Long Names"."Spaced Items"'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(:spaced_shard, :spaced_target) AS spaced_job \gset
SELECT pg_shard.wait_job(:spaced_job, '2 minutes');
SELECT node_id = :spaced_target AS moved FROM pg_shard.shards WHERE shard_id = :spaced_shard;
SELECT count(*), sum(id) FROM "Long Names"."Spaced Items";
DROP TABLE aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaabbb;
DROP SCHEMA "Long Names" CASCADE;
