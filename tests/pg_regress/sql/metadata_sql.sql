-- SQL on distributed tables through the metadata node: the table is
-- partitioned by keyspace id and its partitions are foreign tables on the
-- shards; the planner hook adds keyspace conditions beside conditions on
-- the distribution column so that only the owning shards are touched.
-- (Statements on one shard run whole on their worker: tests/pg_regress/sql/router.sql;
-- SELECTs on co-located tables are pushed down: pushdown.sql. These are about
-- the postgres_fdw path, which the rest take.)
SET pg_shard.enable_router_executor = off;
SET pg_shard.enable_pushdown_executor = off;
SELECT count(*), sum(total) FROM orders;

-- one key: one shard, at plan time
EXPLAIN (COSTS OFF) SELECT * FROM orders WHERE customer_id = 42;
SELECT count(*), sum(total) FROM orders WHERE customer_id = 42;
-- the condition on the key is kept: other keys of the same shard are not returned
SELECT DISTINCT customer_id FROM orders WHERE customer_id = 42;
-- IN lists: the owning shards only
EXPLAIN (COSTS OFF) SELECT * FROM orders WHERE customer_id IN (1, 42, 7);
SELECT customer_id, count(*) FROM orders WHERE customer_id IN (1, 42, 7) GROUP BY 1 ORDER BY 1;
-- a parameter of a generic plan: pruned when the plan starts
PREPARE by_customer(bigint) AS SELECT count(*) FROM orders WHERE customer_id = $1;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE by_customer(42);
EXECUTE by_customer(42);
EXECUTE by_customer(1);
RESET plan_cache_mode;
DEALLOCATE by_customer;
-- an array parameter: pruned in custom plans (the default for such statements)
PREPARE by_customers(bigint[]) AS SELECT customer_id, count(*) FROM orders WHERE customer_id = ANY ($1) GROUP BY 1 ORDER BY 1;
EXPLAIN (COSTS OFF) EXECUTE by_customers('{1, 42}');
EXECUTE by_customers('{1, 42, 7}');
-- and in generic plans, when the plan starts
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE by_customers('{1, 42}');
EXECUTE by_customers('{1, 42, 7}');
-- duplicates, NULLs, an empty array, keys of every shard
EXPLAIN (COSTS OFF) EXECUTE by_customers('{42, NULL, 42}');
EXECUTE by_customers('{42, NULL, 42}');
EXECUTE by_customers('{}');
EXECUTE by_customers(NULL);
RESET plan_cache_mode;
DEALLOCATE by_customers;
-- more keys than the table has shards: a generic plan stays correct
PREPARE by_many(bigint[]) AS SELECT count(DISTINCT customer_id), count(*), sum(total) FROM orders WHERE customer_id = ANY ($1);
SELECT array_agg(k) AS every_third FROM generate_series(0, 199, 3) AS k \gset
SELECT array_agg(k) AS wide FROM generate_series(-5, 1000) AS k \gset
SET plan_cache_mode = force_generic_plan;
EXECUTE by_many(:'every_third');
EXECUTE by_many(:'wide');
RESET plan_cache_mode;
SELECT count(DISTINCT customer_id), count(*), sum(total) FROM orders WHERE customer_id IN (SELECT generate_series(0, 199, 3));
SELECT count(DISTINCT customer_id), count(*), sum(total) FROM orders;
DEALLOCATE by_many;
-- a join on the distribution column carries the condition to the other side
EXPLAIN (COSTS OFF)
SELECT count(*) FROM orders o JOIN order_items i USING (customer_id, order_id) WHERE o.customer_id = 5;
SELECT count(*) FROM orders o JOIN order_items i USING (customer_id, order_id) WHERE o.customer_id = 5;
-- co-located joins run shard by shard, pushed down to the workers
EXPLAIN (VERBOSE, COSTS OFF)
SELECT count(*) FROM orders o JOIN order_items i USING (customer_id, order_id) WHERE o.customer_id IN (1, 42);
-- grouping by the key aggregates on the workers
EXPLAIN (VERBOSE, COSTS OFF)
SELECT customer_id, count(*), sum(total) FROM orders WHERE customer_id IN (1, 42) GROUP BY customer_id;
SELECT customer_id, count(*), sum(total) FROM orders WHERE customer_id IN (1, 42) GROUP BY customer_id ORDER BY 1;
-- no key: every shard, scanned concurrently (async append)
EXPLAIN (COSTS OFF) SELECT count(*) FROM orders;

-- writes are routed to the owning shard; the shard checks them
INSERT INTO orders VALUES (42, 800001, 10), (1, 800001, 20), (7, 800001, 30) RETURNING *;
SELECT tableoid::regclass AS partition, customer_id FROM orders WHERE order_id = 800001 ORDER BY customer_id;
UPDATE orders SET total = total + 1 WHERE customer_id = 42 AND order_id = 800001 RETURNING total;
EXPLAIN (COSTS OFF) UPDATE orders SET total = total + 1 WHERE customer_id = 42;
DELETE FROM orders WHERE order_id = 800001 RETURNING customer_id, total;
-- other key types prune too (events is distributed by a uuid)
EXPLAIN (COSTS OFF) SELECT * FROM events WHERE id = '123e4567-e89b-12d3-a456-426614174000';
-- changing a row's key is refused clearly, also inside a CTE, and changes nothing
WITH moved AS (UPDATE orders SET customer_id = 3 WHERE order_id = 1 RETURNING *) SELECT count(*) FROM moved;
UPDATE orders SET customer_id = 2 WHERE customer_id = 1 AND order_id = 1;
UPDATE orders SET total = 0, customer_id = customer_id + 1 WHERE order_id = 1;
SELECT customer_id, total FROM orders WHERE order_id = 1;
-- COPY in and out
COPY orders (customer_id, order_id, total) FROM stdin;
11	800002	1.5
12	800002	2.5
\.
COPY (SELECT customer_id, order_id, total FROM orders WHERE order_id = 800002 ORDER BY 1) TO stdout;
DELETE FROM orders WHERE order_id = 800002;
SELECT count(*), sum(total) FROM orders;

-- the metadata node declares its map version to the workers: a shard whose
-- epoch is newer than that refuses the statement with WrongShard
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
UPDATE pg_shard.local_shard SET epoch = epoch + 1000 WHERE shard_id = 100000;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
\set SHOW_CONTEXT never
INSERT INTO orders VALUES (42, 800003, 1);
\echo :SQLSTATE
SELECT count(*) FROM orders WHERE order_id = 800003;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
UPDATE pg_shard.local_shard SET epoch = epoch - 1000 WHERE shard_id = 100000;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT srvname, srvoptions FROM pg_foreign_server ORDER BY srvname;
