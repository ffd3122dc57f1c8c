-- A shard splits into two on its node: every co-located table's shard
-- becomes two new shards, each with half of the range, while the data stays
-- where routers find it. The job runs in a background worker: its own copy
-- from a snapshot, then the changes read from a logical replication slot.
CREATE TABLE splitting (id bigint PRIMARY KEY, v text NOT NULL);
CREATE TABLE splitting_notes (id bigint NOT NULL, note text, PRIMARY KEY (id, note));
INSERT INTO splitting SELECT g, 'v' || g FROM generate_series(1, 3000) g;
INSERT INTO splitting_notes SELECT g, 'n' || g FROM generate_series(1, 3000, 7) g;
SELECT pg_shard.create_distributed_table('splitting', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('splitting_notes', 'id', colocate_with => 'splitting');
CREATE TEMP TABLE before AS
SELECT s.shard_id, s.node_id, s.range_start, s.range_end, pg_shard.map_version() AS version,
       (SELECT colocation_id FROM pg_shard.logical_table WHERE table_rel = 'splitting'::regclass) AS colocation_id
  FROM pg_shard.shards s WHERE s.table_name = 'splitting'::regclass ORDER BY s.range_start LIMIT 1;
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.split_shard((SELECT shard_id FROM before)) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT kind, state, phase, error, rows_copied > 0 AS copied, source = target AS same_node,
       split_at = (SELECT (range_start::numeric + range_end::numeric + 1) / 2 FROM before) AS middle,
       table_name
  FROM pg_shard.jobs WHERE job_id = :job;
-- a split that has completed can no longer be reverted
SELECT pg_shard.revert_job(:job);
-- each table: the old shard gave way to two new ones on the same node,
-- splitting its range at the middle; the map moved on once
SELECT s.table_name, s.shard_id > b.shard_id AS new_shard, s.node_id = b.node_id AS same_node,
       s.range_start = b.range_start AS from_start, s.range_end = b.range_end AS to_end,
       s.range_start = lag(s.range_end) OVER (PARTITION BY s.table_name ORDER BY s.range_start) + 1 AS adjacent
  FROM pg_shard.shards s, before b
 WHERE s.table_name IN ('splitting'::regclass, 'splitting_notes'::regclass)
   AND s.range_start BETWEEN b.range_start AND b.range_end
 ORDER BY s.table_name, s.range_start;
SELECT count(*) AS old_shards FROM pg_shard.shards WHERE shard_id = (SELECT shard_id FROM before);
SELECT shard_count FROM pg_shard.colocation_group WHERE colocation_id = (SELECT colocation_id FROM before);
SELECT pg_shard.map_version() = (SELECT version + 1 FROM before) AS one_new_version;
-- every row is still there; reads and writes reach both halves
SELECT count(*), sum(id) FROM splitting;
SELECT count(*) FROM splitting m JOIN splitting_notes n USING (id);
EXPLAIN (COSTS OFF) SELECT * FROM splitting WHERE id = 1;
UPDATE splitting SET v = 'after' WHERE id <= 100;
INSERT INTO splitting SELECT g, 'new' FROM generate_series(3001, 3100) g;
DELETE FROM splitting WHERE id BETWEEN 2001 AND 2100;
SELECT count(*), count(*) FILTER (WHERE v = 'after') AS updated, count(*) FILTER (WHERE v = 'new') AS inserted
  FROM splitting;
-- the node: both halves active at the new epoch, each holding only keys of
-- its range; the old tables, the slot and the publication are gone
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS node_dsn
  FROM pg_shard.node WHERE node_id = (SELECT node_id FROM before) \gset
SELECT shard_id AS old_shard, version + 1 AS new_version FROM before \gset
\c :node_dsn
SELECT c.relname LIKE 'splitting_notes%' AS notes, l.state, l.epoch = :new_version AS new_epoch,
       (SELECT count(*) FROM pg_shard.local_shard o WHERE o.shard_id = :old_shard) AS old_record
  FROM pg_shard.local_shard l JOIN pg_class c ON c.oid = l.shard_rel
 WHERE c.relname LIKE 'splitting%' AND l.epoch = :new_version
 ORDER BY 1, l.range_start;
DO $$
DECLARE
    shard record;
    misplaced bigint;
BEGIN
    FOR shard IN SELECT shard_rel, dist_column, range_start, range_end FROM pg_shard.local_shard
                  WHERE shard_rel::text LIKE 'splitting%' LOOP
        EXECUTE format('SELECT count(*) FROM %s WHERE pg_shard.keyspace_id(%I) NOT BETWEEN %s AND %s',
                       shard.shard_rel, shard.dist_column, shard.range_start, shard.range_end)
           INTO misplaced;
        IF misplaced > 0 THEN
            RAISE NOTICE '% holds % rows outside its range', shard.shard_rel, misplaced;
        END IF;
    END LOOP;
END $$;
SELECT count(*) AS old_tables FROM pg_class WHERE relname IN (SELECT format('splitting_%s', :old_shard));
SELECT count(*) AS slots FROM pg_replication_slots;
SELECT count(*) AS publications FROM pg_publication;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a split point given explicitly is where the upper half starts
SELECT s.shard_id AS second, s.range_start + 1000 AS second_at
  FROM pg_shard.shards s WHERE s.table_name = 'splitting'::regclass ORDER BY s.range_start DESC LIMIT 1 \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.split_shard(:second, :second_at) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT (SELECT range_start FROM pg_shard.shards WHERE table_name = 'splitting'::regclass
         ORDER BY range_start DESC LIMIT 1) = :second_at AS upper_starts_there,
       (SELECT range_end FROM pg_shard.shards WHERE table_name = 'splitting'::regclass
         ORDER BY range_start DESC OFFSET 1 LIMIT 1) = :second_at - 1 AS lower_ends_before;
SELECT count(*) AS shards, count(*) FILTER (WHERE range_end - range_start = 999) AS thin FROM pg_shard.shards
 WHERE table_name = 'splitting'::regclass;
SELECT count(*), sum(id) FROM splitting;
-- A shard whose rows cannot be identified (no replica identity) cannot be
-- split: the job fails with the reason and changes nothing.
SELECT s.shard_id AS blocked, s.shard_table AS blocked_table,
       format('dbname=%s host=127.0.0.1 port=%s', current_database(), s.port) AS blocked_dsn
  FROM pg_shard.shards s WHERE s.table_name = 'splitting_notes'::regclass ORDER BY s.range_start LIMIT 1 \gset
SELECT pg_shard.map_version() AS version_before_failure \gset
\c :blocked_dsn
ALTER TABLE :blocked_table REPLICA IDENTITY NOTHING;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT pg_shard.split_shard(:blocked) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT state, phase, error FROM pg_shard.jobs WHERE job_id = :job;
-- nor moved
SELECT pg_shard.move_shard(:blocked, (SELECT min(node_id) FROM pg_shard.node n
        WHERE n.state = 'active' AND n.node_id <> (SELECT node_id FROM pg_shard.shards WHERE shard_id = :blocked))) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT state, phase, error FROM pg_shard.jobs WHERE job_id = :job;
SELECT pg_shard.map_version() = :version_before_failure AS same_map,
       count(*) AS shards FROM pg_shard.shards WHERE table_name = 'splitting'::regclass;
\c :blocked_dsn
SELECT count(*) AS slots FROM pg_replication_slots;
SELECT count(*) AS publications FROM pg_publication;
SELECT state FROM pg_shard.local_shard WHERE shard_rel = :'blocked_table'::regclass;
ALTER TABLE :blocked_table REPLICA IDENTITY DEFAULT;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT count(*) AS unfinished FROM pg_shard.jobs WHERE state IN ('queued', 'running');
DROP TABLE splitting_notes, splitting;
