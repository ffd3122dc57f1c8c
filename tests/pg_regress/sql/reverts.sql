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

-- A split reverted while its reverse replication runs: the source tables
-- (kept, retired) receive the halves' writes, and the revert merges the
-- halves back into the old shard at a new map version, on the same node,
-- with every write made on the halves. The upper half is the job's until
-- it ends: it is neither moved nor split meanwhile.
CREATE TABLE rev_split (id bigint PRIMARY KEY, v int NOT NULL);
CREATE TABLE rev_split_notes (id bigint NOT NULL, n int NOT NULL, PRIMARY KEY (id, n));
INSERT INTO rev_split SELECT g, 0 FROM generate_series(1, 2000) g;
INSERT INTO rev_split_notes SELECT g, 1 FROM generate_series(1, 2000, 3) g;
SELECT pg_shard.create_distributed_table('rev_split', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('rev_split_notes', 'id', colocate_with => 'rev_split');
SELECT s.shard_id AS split_shard, s.node_id AS split_node, s.range_start AS split_start,
       s.range_end AS split_end
  FROM pg_shard.shards s WHERE s.table_name = 'rev_split'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = '1h';
SELECT pg_shard.split_shard(:split_shard) AS split_job \gset
SELECT set_config('pg_shard_regress.job', :'split_job', false) IS NOT NULL AS waiting;
DO $$
BEGIN
    FOR i IN 1..1200 LOOP
        EXIT WHEN (SELECT phase = 'reverse_replicating' OR state NOT IN ('queued', 'running')
                     FROM pg_shard.job WHERE job_id = current_setting('pg_shard_regress.job')::bigint);
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT state, phase FROM pg_shard.jobs WHERE job_id = :split_job;
SELECT pg_shard.map_version() AS split_version \gset
SELECT table_name, count(*) AS pieces FROM pg_shard.shards
 WHERE table_name IN ('rev_split'::regclass, 'rev_split_notes'::regclass)
   AND range_start BETWEEN :split_start AND :split_end GROUP BY 1 ORDER BY 1;
SELECT shard_id AS upper_half FROM pg_shard.shards
 WHERE table_name = 'rev_split'::regclass AND range_start > :split_start AND range_start <= :split_end \gset
\set VERBOSITY sqlstate
SELECT pg_shard.move_shard(:upper_half, (SELECT min(node_id) FROM pg_shard.node WHERE node_id <> :split_node));
SELECT pg_shard.split_shard(:upper_half);
-- nor does a new table join the co-location group (it would have no
-- shard in the old tables); refused, it stays a plain table
CREATE TABLE rev_split_late (id bigint PRIMARY KEY);
SELECT pg_shard.create_distributed_table('rev_split_late', 'id', colocate_with => 'rev_split');
\set VERBOSITY default
SELECT count(*) AS late_distributed FROM pg_shard.logical_table WHERE table_rel = 'rev_split_late'::regclass;
DROP TABLE rev_split_late;
-- writes on the halves, then the revert
UPDATE rev_split SET v = v + 1;
INSERT INTO rev_split SELECT g, 1 FROM generate_series(2001, 2100) g;
DELETE FROM rev_split WHERE id % 10 = 0;
DELETE FROM rev_split_notes WHERE id % 2 = 0;
SELECT pg_shard.revert_job(:split_job);
SELECT pg_shard.wait_job(:split_job, '1 minute');
SELECT state, phase, error FROM pg_shard.jobs WHERE job_id = :split_job;
SET client_min_messages = warning;
SELECT pg_shard.revert_job(:split_job) AS again;
RESET client_min_messages;
-- the old shards again, whole, on their node
SELECT table_name, count(*) AS pieces, bool_and(range_end = :split_end) AS whole,
       bool_and(node_id = :split_node) AS same_node FROM pg_shard.shards
 WHERE table_name IN ('rev_split'::regclass, 'rev_split_notes'::regclass)
   AND range_start BETWEEN :split_start AND :split_end GROUP BY 1 ORDER BY 1;
SELECT count(*) AS old_shard FROM pg_shard.shards WHERE shard_id = :split_shard;
SELECT pg_shard.map_version() = :split_version + 1 AS one_new_version,
       (SELECT shard_count FROM pg_shard.colocation_group g JOIN pg_shard.logical_table t USING (colocation_id)
         WHERE t.table_rel = 'rev_split'::regclass) AS shard_count;
SELECT count(*), sum(v), sum(id) FROM rev_split;
SELECT count(*), sum(id) FROM rev_split_notes;
UPDATE rev_split SET v = v + 1 WHERE id <= 10;
SELECT sum(v) FROM rev_split;
-- the node: the old tables active at the revert's epoch, the halves and
-- every replication object gone
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS split_dsn
  FROM pg_shard.node WHERE node_id = :split_node \gset
\c :split_dsn
SELECT c.relname LIKE 'rev_split_notes%' AS notes, l.state, l.epoch = :split_version + 1 AS new_epoch
  FROM pg_shard.local_shard l JOIN pg_class c ON c.oid = l.shard_rel
 WHERE c.relname LIKE 'rev_split%' AND l.range_start = :split_start ORDER BY 1;
SELECT count(*) AS halves FROM pg_shard.local_shard l JOIN pg_class c ON c.oid = l.shard_rel
 WHERE c.relname LIKE 'rev_split%' AND l.range_start >= :split_start AND l.range_end <= :split_end
   AND NOT (l.range_start = :split_start AND l.range_end = :split_end);
SELECT count(*) AS replication_objects FROM (
    SELECT slot_name::text FROM pg_replication_slots UNION ALL SELECT pubname::text FROM pg_publication
    UNION ALL SELECT subname::text FROM pg_subscription) r;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP TABLE rev_split_notes, rev_split;
