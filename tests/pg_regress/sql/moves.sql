-- A shard moves to another worker while the data stays where routers find
-- it: the job runs in a background worker over logical replication.
CREATE TABLE moving (id bigint PRIMARY KEY, v text NOT NULL);
CREATE TABLE moving_notes (id bigint NOT NULL, note text, PRIMARY KEY (id, note));
INSERT INTO moving SELECT g, 'v' || g FROM generate_series(1, 2000) g;
INSERT INTO moving_notes SELECT g, 'n' || g FROM generate_series(1, 2000, 7) g;
SELECT pg_shard.create_distributed_table('moving', 'id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('moving_notes', 'id', colocate_with => 'moving');
CREATE TEMP TABLE before AS
SELECT s.shard_id, s.node_id AS source,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS target,
       pg_shard.map_version() AS version
  FROM pg_shard.shards s WHERE s.table_name = 'moving'::regclass ORDER BY s.range_start LIMIT 1;
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard((SELECT shard_id FROM before), (SELECT target FROM before)) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT kind, state, phase, error, rows_copied > 0 AS copied, duration > '0'::interval AS timed
  FROM pg_shard.jobs WHERE job_id = :job;
-- the whole group moved, the map moved on once
SELECT s.table_name, s.node_id = b.target AS on_target
  FROM pg_shard.shards s, before b
 WHERE s.table_name IN ('moving'::regclass, 'moving_notes'::regclass)
   AND s.range_start = (SELECT range_start FROM pg_shard.shards WHERE shard_id = b.shard_id)
 ORDER BY 1;
SELECT pg_shard.map_version() = (SELECT version + 1 FROM before) AS one_new_version;
-- every row is still there, reads and writes reach the new owner
SELECT count(*), sum(id) FROM moving;
SELECT count(*) FROM moving m JOIN moving_notes n USING (id);
UPDATE moving SET v = 'moved' WHERE id IN (SELECT id FROM moving ORDER BY id LIMIT 50);
INSERT INTO moving SELECT g, 'new' FROM generate_series(2001, 2100) g;
SELECT count(*), count(*) FILTER (WHERE v = 'moved') AS updated FROM moving;
-- the workers: the target owns the shards at the new epoch, the source has
-- dropped its copies, and no replication object is left behind
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS source_dsn
  FROM pg_shard.node WHERE node_id = (SELECT source FROM before) \gset
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS target_dsn
  FROM pg_shard.node WHERE node_id = (SELECT target FROM before) \gset
SELECT shard_id AS moved_shard, version + 1 AS new_version FROM before \gset
\c :target_dsn
SELECT state, epoch = :new_version AS new_epoch FROM pg_shard.local_shard l
  JOIN pg_class c ON c.oid = l.shard_rel WHERE c.relname LIKE 'moving%'
   AND l.range_start = (SELECT range_start FROM pg_shard.local_shard WHERE shard_id = :moved_shard)
 ORDER BY c.relname;
SELECT count(*) AS subscriptions FROM pg_subscription;
\c :source_dsn
SELECT count(*) AS old_copies FROM pg_shard.local_shard WHERE shard_id = :moved_shard;
SELECT count(*) AS slots FROM pg_replication_slots;
SELECT count(*) AS publications FROM pg_publication;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT count(*) AS unfinished FROM pg_shard.jobs WHERE state IN ('queued', 'running');
-- later suites count shards per node
DROP TABLE moving_notes, moving;
-- Old tables kept for a while (move_drop_delay): a stale router writing to
-- the old owner gets WrongShard, and so does a read; other jobs go on
-- meanwhile.
CREATE TABLE kept (id bigint PRIMARY KEY, v text);
INSERT INTO kept SELECT g, 'k' FROM generate_series(1, 500) g;
SELECT pg_shard.create_distributed_table('kept', 'id', shard_count => 2, colocate_with => 'none');
SELECT s.shard_id AS kept_shard, s.node_id AS kept_source, s.shard_table AS kept_table,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS kept_target,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS other_target,
       pg_shard.map_version() AS kept_version
  FROM pg_shard.shards s WHERE s.table_name = 'kept'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = '1h';
SELECT pg_shard.move_shard(:kept_shard, :kept_target) AS kept_job \gset
-- (wait_job returns after its timeout: the job replicates the new owner's
-- writes back to the old tables until their drop time)
SELECT pg_shard.wait_job(:kept_job, '10 seconds');
SELECT state, phase FROM pg_shard.jobs WHERE job_id = :kept_job;
-- the cutover is over: only the old tables' drop is pending
SELECT count(*) FROM kept;
-- a job that does not exist cannot be reverted or completed
SELECT pg_shard.revert_job(999999);
SELECT pg_shard.complete_job(999999);
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS kept_source_dsn
  FROM pg_shard.node WHERE node_id = :kept_source \gset
\c :kept_source_dsn
SET pg_shard.map_version = :kept_version;
\set VERBOSITY terse
INSERT INTO :kept_table VALUES (1000000, 'stale');
SELECT count(*) FROM :kept_table;
\set VERBOSITY default
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- another move runs while the first waits to drop its old tables
SELECT s.shard_id AS second_shard,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS second_target
  FROM pg_shard.shards s WHERE s.table_name = 'kept'::regclass ORDER BY s.range_start DESC LIMIT 1 \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(:second_shard, :second_target) AS second_job \gset
SELECT pg_shard.wait_job(:second_job, '2 minutes');
SELECT state, phase FROM pg_shard.jobs WHERE job_id = :kept_job;
-- past its cutover a job cannot be canceled; it can be completed now (the
-- reverse replication ends, the old tables go)
SELECT pg_shard.cancel_job(:kept_job);
SELECT pg_shard.complete_job(:kept_job);
SELECT pg_shard.wait_job(:kept_job, '1 minute');
SELECT state, phase FROM pg_shard.jobs WHERE job_id = :kept_job;
-- then it is over: nothing to complete, nothing to revert
SELECT pg_shard.complete_job(:kept_job);
SELECT pg_shard.revert_job(:kept_job);
-- switch_writes: only for a reads-first job waiting with its reads
-- switched; a bad call changes nothing
SELECT pg_shard.switch_writes(999999);
SELECT pg_shard.switch_writes(:kept_job);
SELECT pg_shard.move_shard(:kept_shard, :kept_target, switch_reads_first => NULL);
SELECT pg_shard.split_shard(:kept_shard, switch_reads_first => NULL);
SELECT count(*) AS routes FROM pg_shard.read_route;
\c :kept_source_dsn
SELECT count(*) AS old_copies FROM pg_shard.local_shard WHERE shard_id = :kept_shard;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT count(*) FROM kept;
DROP TABLE kept;

