-- Co-location: tables that share ranges and placements (shard groups).
CREATE TABLE order_items (customer_id bigint, order_id bigint, item_no int, sku text,
                          PRIMARY KEY (customer_id, order_id, item_no));
INSERT INTO order_items SELECT g % 200, g, 1, 'sku-' || g FROM generate_series(1, 3000) g;
SELECT pg_shard.create_distributed_table('order_items', 'customer_id', colocate_with => 'orders');

-- same ranges on the same nodes, in the same co-location group
SELECT o.range_start, o.range_end, o.node_id AS orders_node, i.node_id AS items_node
FROM pg_shard.shards o
JOIN pg_shard.shards i ON i.table_name = 'order_items'::regclass AND i.range_start = o.range_start
WHERE o.table_name = 'orders'::regclass ORDER BY o.range_start;
SELECT count(DISTINCT colocation_id) AS groups FROM pg_shard.logical_table
WHERE table_rel IN ('orders'::regclass, 'order_items'::regclass);

-- a customer's orders and items are on the same node (co-located join works locally)
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS joined_rows_on_worker1
FROM (SELECT * FROM orders_100000 UNION ALL SELECT * FROM orders_100002
      UNION ALL SELECT * FROM orders_100004 UNION ALL SELECT * FROM orders_100006) o
JOIN (SELECT * FROM order_items_100040 UNION ALL SELECT * FROM order_items_100042
      UNION ALL SELECT * FROM order_items_100044 UNION ALL SELECT * FROM order_items_100046) i
  USING (customer_id, order_id);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT count(*) AS joined_rows_on_worker2
FROM (SELECT * FROM orders_100001 UNION ALL SELECT * FROM orders_100003
      UNION ALL SELECT * FROM orders_100005 UNION ALL SELECT * FROM orders_100007) o
JOIN (SELECT * FROM order_items_100041 UNION ALL SELECT * FROM order_items_100043
      UNION ALL SELECT * FROM order_items_100045 UNION ALL SELECT * FROM order_items_100047) i
  USING (customer_id, order_id);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- by default, a table with the same shard count and key type joins the group
CREATE TABLE payments (customer_id int PRIMARY KEY, amount numeric);
SELECT pg_shard.create_distributed_table('payments', 'customer_id', shard_count => 8);
SELECT t.table_rel, t.colocation_id = o.colocation_id AS colocated_with_orders
FROM pg_shard.logical_table t, pg_shard.logical_table o
WHERE o.table_rel = 'orders'::regclass AND t.table_rel = 'payments'::regclass;

-- colocate_with => 'none' starts a new group; so does another shard count
CREATE TABLE audit (customer_id bigint, at timestamptz, PRIMARY KEY (customer_id, at));
SELECT pg_shard.create_distributed_table('audit', 'customer_id', shard_count => 8, colocate_with => 'none');
CREATE TABLE sessions (customer_id bigint PRIMARY KEY);
SELECT pg_shard.create_distributed_table('sessions', 'customer_id', shard_count => 4);
SELECT table_rel, kind, dist_column, colocation_id FROM pg_shard.logical_table ORDER BY table_rel::oid;
SELECT colocation_id, kind, shard_count, key_encoding FROM pg_shard.colocation_group ORDER BY colocation_id;

-- a table joining a group takes the group's shard count
SELECT count(*) AS order_items_shards FROM pg_shard.shards WHERE table_name = 'order_items'::regclass;
SELECT pg_shard.map_version();
