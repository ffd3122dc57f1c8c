-- The pushdown class: a SELECT on co-located distributed tables joined on
-- their distribution columns runs as one query per shard group on the
-- workers (one statement per node, every node at once), and a final query
-- on the metadata node merges their rows.
CREATE TABLE pd_orders (customer_id bigint, order_id bigint, total numeric(10,2), status text,
                        PRIMARY KEY (customer_id, order_id));
CREATE TABLE pd_items (customer_id bigint, order_id bigint, line int, qty int,
                       PRIMARY KEY (customer_id, order_id, line));
CREATE TABLE pd_other (id bigint PRIMARY KEY, customer_id bigint);
CREATE TABLE pd_status (status text PRIMARY KEY, label text);
CREATE TABLE pd_local (customer_id bigint);
SELECT pg_shard.create_distributed_table('pd_orders', 'customer_id', shard_count => 4);
SELECT pg_shard.create_distributed_table('pd_items', 'customer_id', colocate_with => 'pd_orders');
SELECT pg_shard.create_distributed_table('pd_other', 'id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_reference_table('pd_status');
INSERT INTO pd_status VALUES ('new', 'placed'), ('paid', 'settled'), ('sent', 'shipped');
INSERT INTO pd_orders SELECT c, o, (c * 7 + o * 3) % 100, (ARRAY['new', 'paid', 'sent'])[1 + (c + o) % 3]
  FROM generate_series(1, 40) c, generate_series(1, 3) o;
INSERT INTO pd_items SELECT c, o, l, c + l FROM generate_series(1, 40) c, generate_series(1, 3) o, generate_series(1, 2) l;
INSERT INTO pd_other SELECT g, g % 40 FROM generate_series(1, 50) g;
INSERT INTO pd_local VALUES (1), (2);

-- aggregates across shard groups: partial results on the workers, merged here
EXPLAIN (COSTS OFF)
SELECT status, count(*), sum(total), avg(total), min(total), max(total) FROM pd_orders GROUP BY status ORDER BY status;
SELECT status, count(*), sum(total), avg(total), min(total), max(total) FROM pd_orders GROUP BY status ORDER BY status;
-- count(DISTINCT …): the workers group by its argument too, the answer is exact
EXPLAIN (COSTS OFF) SELECT count(DISTINCT status), count(*) FROM pd_orders;
SELECT count(DISTINCT status), count(*) FROM pd_orders;
-- an aggregate without partial results (an ORDER BY inside): the workers
-- return the argument values, the final query aggregates them all
EXPLAIN (COSTS OFF)
SELECT status, string_agg(customer_id::text, ',' ORDER BY customer_id DESC) FROM pd_orders WHERE order_id = 1 AND customer_id < 8 GROUP BY status;
SELECT status, string_agg(customer_id::text, ',' ORDER BY customer_id DESC) FROM pd_orders WHERE order_id = 1 AND customer_id < 8 GROUP BY status ORDER BY 1;
-- variance and stddev: the workers return each group's transition state,
-- which the final query combines and finishes (pg_shard's helper aggregates)
EXPLAIN (VERBOSE, COSTS OFF) SELECT stddev(total), variance(total) FROM pd_orders;
SELECT round(stddev(total), 4), round(variance(total), 4) FROM pd_orders;
-- GROUP BY the distribution column: the whole statement runs on the
-- workers; ORDER BY and LIMIT n OFFSET m are also applied there (n + m rows)
EXPLAIN (COSTS OFF)
SELECT customer_id, sum(total) AS s FROM pd_orders GROUP BY customer_id HAVING count(*) = 3 ORDER BY s DESC, customer_id LIMIT 3 OFFSET 1;
SELECT customer_id, sum(total) AS s FROM pd_orders GROUP BY customer_id HAVING count(*) = 3 ORDER BY s DESC, customer_id LIMIT 3 OFFSET 1;
-- a co-located join, a reference table, a correlated EXISTS on the key
EXPLAIN (COSTS OFF)
SELECT k.label, count(*), sum(i.qty) FROM pd_orders o
  JOIN pd_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id
  JOIN pd_status k ON k.status = o.status
 WHERE EXISTS (SELECT 1 FROM pd_items x WHERE x.customer_id = o.customer_id AND x.qty > 40)
 GROUP BY k.label ORDER BY 1;
SELECT k.label, count(*), sum(i.qty) FROM pd_orders o
  JOIN pd_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id
  JOIN pd_status k ON k.status = o.status
 WHERE EXISTS (SELECT 1 FROM pd_items x WHERE x.customer_id = o.customer_id AND x.qty > 40)
 GROUP BY k.label ORDER BY 1;
-- IN (a subquery grouped by the key) and a subquery in FROM
EXPLAIN (COSTS OFF) SELECT count(*) FROM pd_orders WHERE customer_id IN (SELECT customer_id FROM pd_items GROUP BY customer_id HAVING sum(qty) > 200);
SELECT count(*) FROM pd_orders WHERE customer_id IN (SELECT customer_id FROM pd_items GROUP BY customer_id HAVING sum(qty) > 200);
SELECT status, count(*) FROM (SELECT o.status FROM pd_orders o JOIN pd_items i USING (customer_id, order_id) WHERE i.line = 2) s
 GROUP BY status ORDER BY 1;
-- conditions on the key prune the shard groups
EXPLAIN (COSTS OFF) SELECT count(*) FROM pd_orders WHERE customer_id IN (1, 2, 3);
SELECT count(*) FROM pd_orders WHERE customer_id IN (1, 2, 3);
SELECT count(*), sum(total) FROM pd_orders WHERE customer_id = ANY (ARRAY[]::bigint[]);
-- per-node times and rows in EXPLAIN ANALYZE
\o | sed -E 's/[0-9]+\.[0-9]+ ms/N ms/'
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM pd_orders WHERE customer_id IN (1, 2, 3);
\o

-- what does not qualify takes the postgres_fdw path, still right
-- not co-located
EXPLAIN (COSTS OFF) SELECT count(*) FROM pd_orders o JOIN pd_other t ON t.customer_id = o.customer_id;
SELECT count(*) FROM pd_orders o JOIN pd_other t ON t.customer_id = o.customer_id;
-- not joined on the key
SELECT count(*) FROM pd_orders o JOIN pd_items i ON i.order_id = o.order_id;
-- a reference table keeping the unmatched rows of an outer join
SELECT k.status, count(o.customer_id) FROM pd_status k LEFT JOIN pd_orders o ON o.status = k.status GROUP BY 1 ORDER BY 1;
-- a sublink not tied to the key, a local table, FROM ONLY, system columns
SELECT count(*) FROM pd_orders o WHERE total > (SELECT avg(total) FROM pd_orders);
SELECT count(*) FROM pd_orders o JOIN pd_local l USING (customer_id);
SELECT count(*) FROM ONLY pd_orders;
SELECT count(DISTINCT tableoid) > 1 AS several_partitions FROM pd_orders;
-- window functions across shard groups
SELECT status, rank() OVER (ORDER BY count(*) DESC, status) FROM pd_orders GROUP BY status ORDER BY 1;
-- and the setting
SET pg_shard.enable_pushdown_executor = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM pd_orders;
RESET pg_shard.enable_pushdown_executor;

-- the workers' errors come back as themselves; the final query's too
\set VERBOSITY sqlstate
SELECT sum(1 / (total - total)) FROM pd_orders;
SELECT status, 1 / (count(*) - count(*)) FROM pd_orders GROUP BY status;
\set VERBOSITY default
-- privileges are the metadata node's, before anything runs
CREATE ROLE pd_reader;
SET ROLE pd_reader;
SELECT count(*) FROM pd_orders;
RESET ROLE;
DROP ROLE pd_reader;
-- statement_timeout interrupts the workers' queries
SET statement_timeout = '300ms';
SELECT count(*) FROM pd_orders o, generate_series(1, 500000000) g;
RESET statement_timeout;
SELECT count(*) AS prepared FROM pg_prepared_xacts;

DROP TABLE pd_local, pd_other, pd_items, pd_orders, pd_status;
