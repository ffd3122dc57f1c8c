-- The router class: a statement whose distributed tables each come down to
-- one shard, all on one node, runs whole on that node over pg_shard's own
-- connection, rewritten onto the shard tables.
CREATE TABLE rt_orders (customer_id bigint, order_id bigint, total numeric, note text,
                        PRIMARY KEY (customer_id, order_id));
CREATE TABLE rt_items (customer_id bigint, order_id bigint, line int, qty int,
                       PRIMARY KEY (customer_id, order_id, line));
CREATE TABLE rt_kinds (kind text PRIMARY KEY, label text);
SELECT pg_shard.create_distributed_table('rt_orders', 'customer_id', shard_count => 4);
SELECT pg_shard.create_distributed_table('rt_items', 'customer_id', colocate_with => 'rt_orders');
SELECT pg_shard.create_reference_table('rt_kinds');
INSERT INTO rt_kinds VALUES ('a', 'first'), ('b', 'second');
INSERT INTO rt_orders SELECT c, o, c * 10 + o, CASE WHEN o % 2 = 0 THEN 'a' ELSE 'b' END
  FROM generate_series(1, 20) c, generate_series(1, 3) o;
INSERT INTO rt_items SELECT c, o, l, l FROM generate_series(1, 20) c, generate_series(1, 3) o, generate_series(1, 2) l;

-- one key: the whole statement on its worker
EXPLAIN (COSTS OFF) SELECT * FROM rt_orders WHERE customer_id = 7 ORDER BY order_id;
SELECT * FROM rt_orders WHERE customer_id = 7 ORDER BY order_id;
-- a co-located join and a reference table, grouped and ordered there
EXPLAIN (COSTS OFF)
SELECT o.order_id, k.label, sum(i.qty) FROM rt_orders o
  JOIN rt_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id
  JOIN rt_kinds k ON k.kind = o.note
 WHERE o.customer_id = 7 GROUP BY 1, 2 ORDER BY 1;
SELECT o.order_id, k.label, sum(i.qty) FROM rt_orders o
  JOIN rt_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id
  JOIN rt_kinds k ON k.kind = o.note
 WHERE o.customer_id = 7 GROUP BY 1, 2 ORDER BY 1;
-- the key through the join condition, an outer join, a subquery, a CTE, window functions
SELECT o.order_id, count(i.line) FROM rt_orders o LEFT JOIN rt_items i USING (customer_id, order_id)
 WHERE o.customer_id = 3 GROUP BY 1 ORDER BY 1;
WITH lines AS (SELECT * FROM rt_items WHERE customer_id = 5)
SELECT order_id, line, sum(qty) OVER (PARTITION BY order_id ORDER BY line),
       rank() OVER (ORDER BY order_id DESC)
  FROM lines ORDER BY order_id, line;
SELECT order_id, (SELECT count(*) FROM rt_items i WHERE i.customer_id = 5 AND i.order_id = o.order_id)
  FROM rt_orders o WHERE customer_id = 5 ORDER BY 1;
SELECT o FROM rt_orders o WHERE customer_id = 2 AND order_id = 1;
SELECT customer_id, order_id FROM rt_orders WHERE customer_id = 4 AND order_id = 2 FOR UPDATE;
-- writes, with RETURNING; the command tags count the worker's rows
EXPLAIN (COSTS OFF) UPDATE rt_orders SET total = total + 1 WHERE customer_id = 7 AND order_id = 1;
UPDATE rt_orders SET total = total + 1 WHERE customer_id = 7 RETURNING order_id, total;
DELETE FROM rt_items WHERE customer_id = 7 AND line = 2;
INSERT INTO rt_items VALUES (7, 1, 2, 20);
-- INSERT … ON CONFLICT (columns): the shard's unique index decides
EXPLAIN (COSTS OFF)
INSERT INTO rt_items VALUES (7, 2, 2, 5) ON CONFLICT (customer_id, order_id, line) DO UPDATE SET qty = rt_items.qty + EXCLUDED.qty;
INSERT INTO rt_items VALUES (7, 2, 2, 5) ON CONFLICT (customer_id, order_id, line) DO UPDATE SET qty = rt_items.qty + EXCLUDED.qty
  RETURNING *;
INSERT INTO rt_items VALUES (7, 2, 2, 5) ON CONFLICT (customer_id, order_id, line) DO UPDATE SET qty = rt_items.qty + EXCLUDED.qty
  RETURNING *;
INSERT INTO rt_items VALUES (7, 2, 2, 5) ON CONFLICT DO NOTHING;
SELECT customer_id, order_id, line, qty FROM rt_items WHERE customer_id = 7 ORDER BY 2, 3;
-- a text parameter of a custom plan is a value like any other (EXECUTE of a
-- SQL-level prepared statement takes the postgres_fdw path; drivers' bound
-- parameters come in through the protocol: tests/coordinator)
SELECT total FROM rt_orders WHERE customer_id = '7'::text::bigint AND order_id = 3;

-- the worker's errors come back as PostgreSQL reports them, nothing is left behind
\set VERBOSITY sqlstate
INSERT INTO rt_orders VALUES (7, 1, 0, 'dup');
SELECT 1 / (total - total) FROM rt_orders WHERE customer_id = 7 AND order_id = 1;
UPDATE rt_orders SET total = 'x' || note WHERE customer_id = 7;
\set VERBOSITY default
SELECT count(*) AS prepared FROM pg_prepared_xacts;

-- privileges are the metadata node's, before anything runs
CREATE ROLE rt_reader;
SET ROLE rt_reader;
SELECT * FROM rt_orders WHERE customer_id = 7;
RESET ROLE;
DROP ROLE rt_reader;

-- statement_timeout and cancel interrupt the worker's query too
SET statement_timeout = '300ms';
SELECT count(*) FROM rt_orders o, generate_series(1, 500000000) g WHERE o.customer_id = 1;
RESET statement_timeout;
SELECT pg_sleep(0.3);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS still_running FROM pg_stat_activity
 WHERE query LIKE '%generate_series(1, 500000000)%' AND pid <> pg_backend_pid();
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT count(*) AS still_running FROM pg_stat_activity
 WHERE query LIKE '%generate_series(1, 500000000)%' AND pid <> pg_backend_pid();
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- what does not qualify takes another path: several shards (a SELECT is
-- pushed down: pushdown.sql)
EXPLAIN (COSTS OFF) SELECT count(*) FROM rt_orders WHERE customer_id IN (1, 2, 3, 4, 5);
-- a transaction block: its statements run in its remote transactions
BEGIN;
EXPLAIN (COSTS OFF) SELECT * FROM rt_orders WHERE customer_id = 7;
UPDATE rt_orders SET note = 'in block' WHERE customer_id = 7 AND order_id = 3;
SELECT count(*) FROM rt_orders WHERE note = 'in block';
ROLLBACK;
-- EXPLAIN ANALYZE adds the worker's time and rows
\o | sed -E 's/[0-9]+\.[0-9]+ ms/N ms/'
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT order_id FROM rt_orders WHERE customer_id = 7;
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) UPDATE rt_orders SET total = total WHERE customer_id = 7;
\o
-- a transaction that wrote on one node commits there in one phase (no
-- commit record); one that wrote on two nodes commits by two-phase commit
-- (a record per writing node, kept until the next one is written)
SELECT coalesce(array_agg(gid), '{}') AS records_before FROM pg_shard.remote_transaction \gset
SELECT c AS key_a, (SELECT c2 FROM generate_series(1, 20) c2
                      JOIN pg_shard.shards s2 ON s2.table_name = 'rt_orders'::regclass
                       AND pg_shard.keyspace_id(c2::bigint) BETWEEN s2.range_start AND s2.range_end
                     WHERE s2.node_id <> s.node_id ORDER BY c2 LIMIT 1) AS key_b
  FROM generate_series(1, 20) c
  JOIN pg_shard.shards s ON s.table_name = 'rt_orders'::regclass
   AND pg_shard.keyspace_id(c::bigint) BETWEEN s.range_start AND s.range_end
 ORDER BY c LIMIT 1 \gset
BEGIN;
UPDATE rt_orders SET note = note WHERE customer_id = :key_a;
UPDATE rt_orders SET total = total WHERE customer_id = :key_a AND order_id = 1;
COMMIT;
SELECT count(*) AS one_node_records FROM pg_shard.remote_transaction WHERE gid <> ALL (:'records_before'::text[]);
BEGIN;
UPDATE rt_orders SET note = note WHERE customer_id = :key_a;
UPDATE rt_orders SET note = note WHERE customer_id = :key_b;
COMMIT;
SELECT count(*) AS two_node_records FROM pg_shard.remote_transaction WHERE gid <> ALL (:'records_before'::text[]);
SELECT count(*) AS prepared FROM pg_prepared_xacts;
-- a volatile function per row stays on the metadata node; the session's clock is
-- computed there and sent along
EXPLAIN (COSTS OFF) SELECT random() > 2 FROM rt_orders WHERE customer_id = 7;
EXPLAIN (COSTS OFF) SELECT now() IS NULL FROM rt_orders WHERE customer_id = 7;
-- updating the key
UPDATE rt_orders SET customer_id = 8 WHERE customer_id = 7 AND order_id = 1;
-- a local table
CREATE TABLE rt_local (customer_id bigint);
INSERT INTO rt_local VALUES (7);
EXPLAIN (COSTS OFF) SELECT count(*) FROM rt_orders o JOIN rt_local l USING (customer_id) WHERE o.customer_id = 7;
SELECT count(*) FROM rt_orders o JOIN rt_local l USING (customer_id) WHERE o.customer_id = 7;
-- a dropped column: the foreign partitions drop it as the table does, so
-- their columns still line up with the statement's (checked by name and number)
ALTER TABLE rt_items DROP COLUMN qty;
EXPLAIN (COSTS OFF) SELECT * FROM rt_items WHERE customer_id = 7 AND order_id = 1;
SELECT * FROM rt_items WHERE customer_id = 7 AND order_id = 1 ORDER BY line;
-- and the setting
SET pg_shard.enable_router_executor = off;
EXPLAIN (COSTS OFF) SELECT * FROM rt_orders WHERE customer_id = 7;
RESET pg_shard.enable_router_executor;

DROP TABLE rt_local, rt_items, rt_orders, rt_kinds;
