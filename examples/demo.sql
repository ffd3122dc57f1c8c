-- The pg_shard five-minute tour, run by `make demo` on the metadata node.
\set ON_ERROR_STOP on
\pset footer off
\echo '== 1. the extension, and two workers (add_node creates the extension there)'
CREATE EXTENSION pg_shard;
SELECT pg_shard.add_node('127.0.0.1', :worker1_port) AS worker1_node_id;
SELECT pg_shard.add_node('127.0.0.1', :worker2_port) AS worker2_node_id;
SELECT * FROM pg_shard.nodes;

\echo '== 2. ordinary tables with rows in them'
CREATE TABLE orders (customer_id bigint, order_id bigint, total numeric, PRIMARY KEY (customer_id, order_id));
CREATE TABLE order_items (customer_id bigint, order_id bigint, item_no int, sku text,
                          PRIMARY KEY (customer_id, order_id, item_no));
CREATE TABLE countries (code text PRIMARY KEY, name text);
INSERT INTO orders SELECT c, c * 100 + o, round((random() * 500)::numeric, 2)
    FROM generate_series(1, 1000) c, generate_series(1, 10) o;
INSERT INTO order_items SELECT customer_id, order_id, i, 'sku-' || (order_id % 97)
    FROM orders, generate_series(1, 3) i;
INSERT INTO countries VALUES ('DE', 'Germany'), ('FR', 'France'), ('NL', 'Netherlands'), ('PL', 'Poland');
SELECT (SELECT count(*) FROM orders) AS orders, (SELECT count(*) FROM order_items) AS order_items;

\echo '== 3. distribute them: 8 hash ranges of customer_id, items co-located with orders'
SELECT pg_shard.create_distributed_table('orders', 'customer_id', shard_count => 8);
SELECT pg_shard.create_distributed_table('order_items', 'customer_id', colocate_with => 'orders');
SELECT pg_shard.create_reference_table('countries');
SELECT pg_shard.map_version();
SELECT * FROM pg_shard.shards;
SELECT count(*) AS rows_left_on_metadata_node FROM ONLY orders;

\echo '== 4. where does customer 42 live?'
SELECT pg_shard.keyspace_id(42::bigint) AS keyspace_id_of_42, table_name, shard_table, host, port
FROM pg_shard.shards
WHERE pg_shard.keyspace_id(42::bigint) BETWEEN range_start AND range_end
  AND table_name IN ('orders'::regclass, 'order_items'::regclass);

\echo '== 5. plain SQL through the metadata node: one key touches one shard'
EXPLAIN (COSTS OFF) SELECT * FROM orders WHERE customer_id = 42;
SELECT count(*) AS orders_of_42, sum(total) FROM orders WHERE customer_id = 42;
INSERT INTO orders VALUES (42, 424242, 99.90) RETURNING *;
SELECT c.name AS country, count(*) AS items
FROM order_items i JOIN orders o USING (customer_id, order_id)
JOIN countries c ON c.code = (ARRAY['DE','FR','NL','PL'])[1 + o.customer_id % 4]
WHERE o.customer_id IN (1, 2, 3, 42) GROUP BY c.name ORDER BY c.name;
UPDATE countries SET name = 'Deutschland' WHERE code = 'DE';
