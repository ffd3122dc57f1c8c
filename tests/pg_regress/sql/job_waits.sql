-- pg_shard.wait_job cannot wait for a job that its own transaction queued:
-- no runner sees the job before the transaction commits, so the wait
-- would never end. It says so instead, and the job goes with the rollback.
CREATE TABLE jw_items (id bigint PRIMARY KEY);
-- (a co-location group of its own: a move takes the whole group)
SELECT pg_shard.create_distributed_table('jw_items', 'id', shard_count => 2, colocate_with => 'none');
SELECT count(*) AS jobs_before FROM pg_shard.job \gset
-- in one statement (the DBA's first try; the error names the job, whose id
-- depends on the suites before), and in a subtransaction
\set VERBOSITY sqlstate
SELECT pg_shard.wait_job(pg_shard.move_shard(s.shard_id,
           (SELECT min(n.node_id) FROM pg_shard.nodes n
             WHERE n.node_id <> s.node_id AND n.state = 'active')))
  FROM pg_shard.shards s WHERE s.table_name = 'jw_items'::regclass
 ORDER BY s.shard_id LIMIT 1;
\set VERBOSITY default
DO $$
DECLARE
    hint text;
BEGIN
    PERFORM pg_shard.wait_job(pg_shard.move_shard(s.shard_id,
                (SELECT min(n.node_id) FROM pg_shard.nodes n
                  WHERE n.node_id <> s.node_id AND n.state = 'active')))
       FROM pg_shard.shards s WHERE s.table_name = 'jw_items'::regclass
      ORDER BY s.shard_id LIMIT 1;
EXCEPTION WHEN object_not_in_prerequisite_state THEN
    GET STACKED DIAGNOSTICS hint = PG_EXCEPTION_HINT;
    RAISE NOTICE 'refused: % (hint: %)', regexp_replace(SQLERRM, '[0-9]+', 'N'), hint;
END $$;
-- no job was left queued
SELECT count(*) = :jobs_before AS no_new_jobs FROM pg_shard.job;
-- committed first, the same job is waited for as usual (the old tables
-- dropped at once)
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(s.shard_id,
           (SELECT min(n.node_id) FROM pg_shard.nodes n
             WHERE n.node_id <> s.node_id AND n.state = 'active')) AS jw_job
  FROM pg_shard.shards s WHERE s.table_name = 'jw_items'::regclass
 ORDER BY s.shard_id LIMIT 1 \gset
SELECT pg_shard.wait_job(:jw_job, '5 minutes');
DROP TABLE jw_items;
