-- Distributing a table that already has rows.
CREATE TABLE orders (
    customer_id bigint,
    order_id bigint,
    total numeric CHECK (total >= 0),
    note text,
    PRIMARY KEY (customer_id, order_id));
CREATE INDEX orders_note_idx ON orders (note) WHERE note IS NOT NULL;
INSERT INTO orders
    SELECT g % 200, g, g * 1.5, CASE WHEN g % 7 = 0 THEN 'note ' || g END
    FROM generate_series(1, 5000) g;
CREATE TEMP TABLE orders_before AS SELECT * FROM orders;

SELECT pg_shard.create_distributed_table('orders', 'customer_id', shard_count => 8);

-- the map changed once
SELECT pg_shard.map_version();

-- nothing is left behind on the metadata node
SELECT count(*) AS rows_left_on_metadata FROM ONLY orders;

-- eight equal ranges covering the keyspace, round-robin over two workers
SELECT shard_id, shard_table, range_start, range_end, node_id, host, port, state,
       size_bytes > 0 AS has_size
FROM pg_shard.shards WHERE table_name = 'orders'::regclass;
SELECT min(range_start) = -9223372036854775808 AS starts_at_min,
       max(range_end) = 9223372036854775807 AS ends_at_max,
       bool_and(next_start IS NULL OR next_start - 1 = range_end) AS contiguous
FROM (SELECT range_start, range_end,
             lead(range_start) OVER (ORDER BY range_start) AS next_start
      FROM pg_shard.shards WHERE table_name = 'orders'::regclass) r;

-- Every row is in exactly the shard whose range holds its keyspace id, none
-- lost, none duplicated: compare each worker's shards with the original rows.
CREATE TEMP TABLE expected_placement AS
SELECT o.*, s.shard_table, s.port
FROM orders_before o
JOIN pg_shard.shards s
  ON s.table_name = 'orders'::regclass
 AND pg_shard.keyspace_id(o.customer_id) BETWEEN s.range_start AND s.range_end;
SELECT port, count(*) AS expected_rows, sum(total) AS expected_total
FROM expected_placement GROUP BY port ORDER BY port;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT shard_rel, shard_id, dist_column, range_start, range_end, state, epoch
FROM pg_shard.local_shard ORDER BY shard_id;
SELECT 'worker1' AS worker, count(*) AS rows, sum(total) AS total, count(note) AS notes
FROM (SELECT * FROM orders_100000 UNION ALL SELECT * FROM orders_100002
      UNION ALL SELECT * FROM orders_100004 UNION ALL SELECT * FROM orders_100006) w;
-- each shard holds only keys of its own range
SELECT s.shard_id, bool_and(pg_shard.keyspace_id(o.customer_id) BETWEEN s.range_start AND s.range_end) AS in_range
FROM pg_shard.local_shard s,
     LATERAL (SELECT customer_id FROM orders_100000 WHERE s.shard_id = 100000
              UNION ALL SELECT customer_id FROM orders_100002 WHERE s.shard_id = 100002
              UNION ALL SELECT customer_id FROM orders_100004 WHERE s.shard_id = 100004
              UNION ALL SELECT customer_id FROM orders_100006 WHERE s.shard_id = 100006) o
GROUP BY s.shard_id ORDER BY s.shard_id;
-- shard tables have the original's columns, constraints and indexes
\d orders_100000
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT 'worker2' AS worker, count(*) AS rows, sum(total) AS total, count(note) AS notes
FROM (SELECT * FROM orders_100001 UNION ALL SELECT * FROM orders_100003
      UNION ALL SELECT * FROM orders_100005 UNION ALL SELECT * FROM orders_100007) w;
SELECT count(*) AS shard_tables FROM pg_shard.local_shard;

\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- on the metadata node the table is now partitioned by keyspace id, its
-- partitions foreign tables on the shards: writes are routed to the owning
-- shard, which enforces the primary key
\d orders
INSERT INTO orders VALUES (1, 1, 1);
INSERT INTO orders VALUES (1, 900000, 1) RETURNING *;
SELECT tableoid::regclass AS partition, * FROM orders WHERE order_id = 900000;
DELETE FROM orders WHERE order_id = 900000;
SELECT count(*), sum(total) FROM orders;

-- the catalog is kept in pg_dump output
SELECT count(*) AS config_tables FROM pg_extension e, unnest(e.extconfig) c WHERE e.extname = 'pg_shard';

-- default shard count is 32
CREATE TABLE events (id uuid PRIMARY KEY, payload text);
SELECT pg_shard.create_distributed_table('events', 'id');
SELECT count(*) AS shards, count(DISTINCT node_id) AS nodes FROM pg_shard.shards WHERE table_name = 'events'::regclass;
SELECT pg_shard.map_version();

