-- pg_shard.shard_stats, pg_shard.imbalance() and pg_shard.node_health():
-- what the coordinators report (pg_shard.report_shard_load, called here as
-- a coordinator would) put together with the workers' sizes.
CREATE TABLE ss_items (id bigint PRIMARY KEY, body text NOT NULL);
SELECT pg_shard.create_distributed_table('ss_items', 'id', shard_count => 4, colocate_with => 'none');
INSERT INTO ss_items SELECT g, repeat('x', 200) FROM generate_series(1, 2000) g;
SELECT array_agg(shard_id ORDER BY range_start) AS ss_shards FROM pg_shard.shards
 WHERE table_name = 'ss_items'::regclass \gset
-- every placement: its node, a size, an estimate of rows, no statements yet
SELECT count(*) AS placements,
       count(*) FILTER (WHERE size_bytes > 0) AS sized,
       count(*) FILTER (WHERE estimated_rows >= 0) AS estimated,
       sum(statements_per_second) AS per_second,
       count(p50_ms) + count(p99_ms) + count(last_report) + count(job_id) AS reported
  FROM pg_shard.shard_stats WHERE table_name = 'ss_items'::regclass;
-- a coordinator's first report: counts and percentiles, no rate yet
SELECT pg_shard.report_shard_load('coordinator one', :'ss_shards'::bigint[], ARRAY[100, 10, 0, 0],
                                  ARRAY[1.5, 2.0, NULL, NULL], ARRAY[4.0, 8.0, NULL, NULL]);
SELECT array_position(:'ss_shards'::bigint[], shard_id) AS shard, statements_per_second,
       p50_ms, p99_ms, last_report IS NOT NULL AS reported
  FROM pg_shard.shard_stats WHERE table_name = 'ss_items'::regclass ORDER BY 1;
-- ten seconds later (moved back here) it reports 1,100 and 20: 100 and 1 per second
UPDATE pg_shard.shard_load SET reported_at = reported_at - interval '10 seconds'
 WHERE coordinator = 'coordinator one';
SELECT pg_shard.report_shard_load('coordinator one', :'ss_shards'::bigint[], ARRAY[1100, 20, 0, 0],
                                  ARRAY[1.0, 2.0, NULL, NULL], ARRAY[5.0, 8.0, NULL, NULL]);
-- a second coordinator: its p99 is worse, its p50 weighs by its rate (none yet: 1)
SELECT pg_shard.report_shard_load('coordinator two', :'ss_shards'::bigint[], ARRAY[7, 0, 0, 0],
                                  ARRAY[3.0, NULL, NULL, NULL], ARRAY[9.0, NULL, NULL, NULL]);
-- (the rates are over the time between the reports: 10 s and what the test took)
SELECT array_position(:'ss_shards'::bigint[], shard_id) AS shard,
       CASE array_position(:'ss_shards'::bigint[], shard_id)
            WHEN 1 THEN statements_per_second BETWEEN 90 AND 100
            WHEN 2 THEN statements_per_second BETWEEN 0.9 AND 1
            ELSE statements_per_second = 0 END AS expected_rate,
       round(p50_ms::numeric, 2) AS p50_ms, p99_ms
  FROM pg_shard.shard_stats WHERE table_name = 'ss_items'::regclass ORDER BY 1;
-- the busiest node by statements is the first shard's; sizes: a ratio of at least 1
SELECT measure,
       CASE WHEN measure = 'statements_per_second'
            THEN busiest_node = (SELECT node_id FROM pg_shard.shards WHERE shard_id = (:'ss_shards'::bigint[])[1])
       END AS first_shards_node,
       CASE WHEN measure = 'statements_per_second' THEN busiest BETWEEN 90 AND 100 END AS about_100,
       ratio IS NULL OR ratio >= 1 AS ratio_at_least_one
  FROM pg_shard.imbalance() ORDER BY measure;
-- bad reports change nothing: an unknown shard, arrays of other lengths
SELECT pg_shard.report_shard_load('coordinator three', ARRAY[-1], ARRAY[5]);
SELECT pg_shard.report_shard_load('coordinator three', :'ss_shards'::bigint[], ARRAY[5]);
SELECT count(*) AS third_coordinator_rows FROM pg_shard.shard_load WHERE coordinator = 'coordinator three'
   AND shard_id <> (:'ss_shards'::bigint[])[1];
-- and reports are the coordinators' only: PUBLIC may not send them
CREATE ROLE ss_reader;
SET ROLE ss_reader;
SELECT pg_shard.report_shard_load('intruder', :'ss_shards'::bigint[], ARRAY[1, 1, 1, 1]);
RESET ROLE;
DROP ROLE ss_reader;
-- every worker answers, nothing left prepared
SELECT port, reachable, prepared_transactions FROM pg_shard.node_health() ORDER BY port;
DELETE FROM pg_shard.shard_load WHERE coordinator LIKE 'coordinator %';
DROP TABLE ss_items;
