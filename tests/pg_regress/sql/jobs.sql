-- Shard moves and splits are queued as jobs. Bad calls get a clear error
-- and queue nothing; a queued job can be canceled.
\set VERBOSITY default
CREATE TEMP TABLE pick AS
SELECT s.shard_id, s.node_id, g.range_start, g.range_end,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS other_node
  FROM pg_shard.shards s JOIN pg_shard.shard_group g ON g.range_start = s.range_start
 WHERE s.table_name = 'orders'::regclass
 ORDER BY s.range_start LIMIT 1;
SELECT count(*) AS jobs_before, pg_shard.map_version() AS version_before FROM pg_shard.jobs \gset
-- unknown shard, NULLs
SELECT pg_shard.move_shard(-1, 1);
SELECT pg_shard.move_shard(NULL, 1);
SELECT pg_shard.move_shard((SELECT shard_id FROM pick), NULL);
-- target: unknown, the source itself, not active
SELECT pg_shard.move_shard((SELECT shard_id FROM pick), 999);
SELECT pg_shard.move_shard((SELECT shard_id FROM pick), (SELECT node_id FROM pick));
BEGIN;
UPDATE pg_shard.node SET state = 'inactive' WHERE node_id = (SELECT other_node FROM pick);
SELECT pg_shard.move_shard((SELECT shard_id FROM pick), (SELECT other_node FROM pick));
ROLLBACK;
-- reference tables are everywhere already
SELECT pg_shard.move_shard((SELECT min(shard_id) FROM pg_shard.shard WHERE table_rel = 'countries'::regclass), 1);
SELECT pg_shard.split_shard((SELECT min(shard_id) FROM pg_shard.shard WHERE table_rel = 'countries'::regclass));
-- split points must fall inside the range, after its first id
SELECT pg_shard.split_shard((SELECT shard_id FROM pick), (SELECT range_start FROM pick));
SELECT pg_shard.split_shard((SELECT shard_id FROM pick), (SELECT range_end + 1 FROM pick));
SELECT pg_shard.split_shard(424242);
-- nothing was queued by any of that
SELECT count(*) = :jobs_before AS nothing_queued FROM pg_shard.jobs;
-- a move is queued once; a second job on the same shard group waits its turn
SELECT pg_shard.move_shard((SELECT shard_id FROM pick), (SELECT other_node FROM pick)) AS move_job \gset
SELECT kind, state, phase, shard_id = (SELECT shard_id FROM pick) AS right_shard,
       target = (SELECT format('%s:%s', host, port) FROM pg_shard.node WHERE node_id = (SELECT other_node FROM pick)) AS right_target
  FROM pg_shard.jobs WHERE job_id = :move_job;
SELECT pg_shard.move_shard((SELECT shard_id FROM pick), (SELECT other_node FROM pick)) IS NULL;
SELECT pg_shard.split_shard((SELECT shard_id FROM pick)) IS NULL;
-- canceled before it ran: nothing to undo
SELECT pg_shard.cancel_job(:move_job);
SELECT state, error, finished_at IS NOT NULL AS finished FROM pg_shard.jobs WHERE job_id = :move_job;
SELECT pg_shard.cancel_job(:move_job);
SELECT pg_shard.wait_job(:move_job, '1 second');
SELECT pg_shard.cancel_job(-5);
SELECT pg_shard.wait_job(-5);
-- a valid split (no point: the middle) is queued with the middle of the
-- range as the upper half's first id (rolled back here: splits run in the
-- splits suite)
BEGIN;
SELECT pg_shard.split_shard((SELECT shard_id FROM pick)) AS split_job \gset
SELECT kind, state, phase, target = source AS same_node,
       split_at = (SELECT (range_start::numeric + range_end::numeric + 1) / 2 FROM pick) AS middle
  FROM pg_shard.jobs WHERE job_id = :split_job;
ROLLBACK;
-- nothing left to run, and the map did not move
SELECT count(*) AS unfinished FROM pg_shard.jobs WHERE state IN ('queued', 'running');
SELECT pg_shard.map_version() = :version_before AS same_map;
-- pg_shard.cutover_lock_timeout: at least 1 ms, in time units
SET pg_shard.cutover_lock_timeout = 0;
SET pg_shard.cutover_lock_timeout = '1s';
SHOW pg_shard.cutover_lock_timeout;
RESET pg_shard.cutover_lock_timeout;
-- pg_shard.cutover_apply_timeout: the same
SET pg_shard.cutover_apply_timeout = 0;
SET pg_shard.cutover_apply_timeout = '2s';
SHOW pg_shard.cutover_apply_timeout;
RESET pg_shard.cutover_apply_timeout;
SHOW pg_shard.cutover_apply_timeout;
