-- A move reverted while its reverse replication runs: the shard group goes
-- back to its old node at a new map version with every write made on the
-- new one, and the new copy goes.
CREATE TABLE reverting (id bigint PRIMARY KEY, v int NOT NULL);
INSERT INTO reverting SELECT g, 0 FROM generate_series(1, 1000) g;
SELECT pg_shard.create_distributed_table('reverting', 'id', shard_count => 2, colocate_with => 'none');
SELECT s.shard_id AS rev_shard, s.node_id AS rev_source,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS rev_target
  FROM pg_shard.shards s WHERE s.table_name = 'reverting'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = '1h';
SELECT pg_shard.move_shard(:rev_shard, :rev_target) AS rev_job \gset
SELECT pg_shard.wait_job(:rev_job, '10 seconds');
SELECT state, phase FROM pg_shard.jobs WHERE job_id = :rev_job;
SELECT node_id = :rev_target AS on_target, pg_shard.map_version() AS moved_version
  FROM pg_shard.shards WHERE shard_id = :rev_shard \gset
SELECT :'on_target' AS on_target;
-- writes on the new owner, then the revert
UPDATE reverting SET v = v + 1;
INSERT INTO reverting SELECT g, 1 FROM generate_series(1001, 1100) g;
DELETE FROM reverting WHERE id % 10 = 0;
SELECT pg_shard.revert_job(:rev_job);
SELECT pg_shard.revert_job(:rev_job);
SELECT pg_shard.complete_job(:rev_job);
SELECT pg_shard.wait_job(:rev_job, '1 minute');
SELECT state, phase, error FROM pg_shard.jobs WHERE job_id = :rev_job;
SELECT node_id = :rev_source AS back_on_source, pg_shard.map_version() = :moved_version + 1 AS one_new_version
  FROM pg_shard.shards WHERE shard_id = :rev_shard;
SELECT count(*), sum(v), sum(id) FROM reverting;
UPDATE reverting SET v = v + 1 WHERE id <= 10;
SELECT sum(v) FROM reverting;
-- the old node owns it again at the new epoch; the other one has no copy
-- and no replication object is left on either
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS rev_source_dsn
  FROM pg_shard.node WHERE node_id = :rev_source \gset
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS rev_target_dsn
  FROM pg_shard.node WHERE node_id = :rev_target \gset
\c :rev_source_dsn
SELECT state, epoch = :moved_version + 1 AS new_epoch FROM pg_shard.local_shard WHERE shard_id = :rev_shard;
SELECT count(*) AS replication_objects FROM (
    SELECT slot_name::text FROM pg_replication_slots UNION ALL SELECT pubname::text FROM pg_publication
    UNION ALL SELECT subname::text FROM pg_subscription) r;
\c :rev_target_dsn
SELECT count(*) AS copies FROM pg_shard.local_shard WHERE shard_id = :rev_shard;
SELECT count(*) AS replication_objects FROM (
    SELECT slot_name::text FROM pg_replication_slots UNION ALL SELECT pubname::text FROM pg_publication
    UNION ALL SELECT subname::text FROM pg_subscription) r;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP TABLE reverting;
