-- Ownership and epoch enforced by the worker itself. Every rejection has
-- SQLSTATE PS001 (WrongShard) and writes nothing.
\set SHOW_CONTEXT never
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT shard_id, range_start, range_end, epoch FROM pg_shard.local_shard WHERE shard_id = 100000;
-- keyspace ids: 42 is in shard 100000's range, 1 is not
SELECT pg_shard.keyspace_id(42::bigint) BETWEEN range_start AND range_end AS owns_42,
       pg_shard.keyspace_id(1::bigint) BETWEEN range_start AND range_end AS owns_1
FROM pg_shard.local_shard WHERE shard_id = 100000;
SELECT count(*) AS rows_before FROM orders_100000 \gset
-- a read of a shard in parallel workers (they do not repeat the leader's
-- check of the shard's state)
BEGIN;
SET LOCAL parallel_setup_cost = 0;
SET LOCAL parallel_tuple_cost = 0;
SET LOCAL min_parallel_table_scan_size = 0;
SET LOCAL max_parallel_workers_per_gather = 2;
EXPLAIN (COSTS OFF) SELECT count(*) FROM orders_100000;
SELECT count(*) = :rows_before AS all_rows FROM orders_100000;
COMMIT;

-- a row in range is accepted
INSERT INTO orders_100000 VALUES (42, 900001, 1);
-- a row outside the shard's range is rejected
INSERT INTO orders_100000 VALUES (1, 900002, 1);
\echo :SQLSTATE
-- a multi-row insert or COPY with one stray row writes nothing
INSERT INTO orders_100000 VALUES (42, 900003, 1), (1, 900004, 1);
\echo :SQLSTATE
COPY orders_100000 (customer_id, order_id, total) FROM stdin;
42	900005	1
1	900006	1
\.
\echo :SQLSTATE
-- an UPDATE may not move a row out of the range
UPDATE orders_100000 SET customer_id = 1 WHERE customer_id = 42 AND order_id = 900001;
\echo :SQLSTATE
SELECT count(*) - :rows_before AS rows_added FROM orders_100000;

-- a session that declares an older map version than the shard's epoch
SET pg_shard.map_version = 1;
UPDATE order_items_100040 SET sku = sku WHERE false;
\echo :SQLSTATE
SELECT epoch FROM pg_shard.local_shard WHERE shard_id = 100040;
-- a current (or newer) declaration is accepted
SELECT max(epoch) AS worker_version FROM pg_shard.local_shard \gset
SET pg_shard.map_version = :worker_version;
UPDATE order_items_100040 SET sku = sku WHERE false;
RESET pg_shard.map_version;

-- a frozen shard refuses every write, including DELETE and TRUNCATE
UPDATE pg_shard.local_shard SET state = 'frozen' WHERE shard_id = 100000;
INSERT INTO orders_100000 VALUES (42, 900007, 1);
\echo :SQLSTATE
DELETE FROM orders_100000 WHERE order_id = 900001;
\echo :SQLSTATE
TRUNCATE orders_100000;
\echo :SQLSTATE
-- reads of a frozen shard still work
SELECT count(*) - :rows_before AS rows_added FROM orders_100000;
-- a retired shard refuses writes too
UPDATE pg_shard.local_shard SET state = 'retired' WHERE shard_id = 100000;
UPDATE orders_100000 SET total = 0 WHERE order_id = 900001;
\echo :SQLSTATE
-- ...and, unlike a frozen one, no longer serves reads (the executor hook)
SELECT count(*) FROM orders_100000;
\echo :SQLSTATE
SELECT count(*) FROM orders_100002 o JOIN orders_100000 p USING (customer_id);
\echo :SQLSTATE
COPY (SELECT * FROM orders_100000) TO STDOUT;
\echo :SQLSTATE
-- EXPLAIN runs nothing and is allowed; other shards and tables are unaffected
EXPLAIN (COSTS OFF) SELECT * FROM orders_100000;
SELECT count(*) > 0 AS other_shard_readable FROM orders_100002;
UPDATE pg_shard.local_shard SET state = 'active' WHERE shard_id = 100000;
DELETE FROM orders_100000 WHERE order_id = 900001;

-- reference table copies refuse writes when frozen; the key range is the whole keyspace
UPDATE pg_shard.local_shard SET state = 'frozen' WHERE shard_id = 100068;
INSERT INTO countries_100068 VALUES ('ES', 'Spain');
\echo :SQLSTATE
UPDATE pg_shard.local_shard SET state = 'active' WHERE shard_id = 100068;

-- a shard table whose ownership record is missing refuses writes (fail closed)
CREATE TEMP TABLE saved AS SELECT * FROM pg_shard.local_shard WHERE shard_id = 100002;
DELETE FROM pg_shard.local_shard WHERE shard_id = 100002;
INSERT INTO orders_100002 SELECT * FROM orders_100002 LIMIT 0;
\echo :SQLSTATE
INSERT INTO pg_shard.local_shard SELECT * FROM saved;

-- a NULL distribution key is never accepted
INSERT INTO payments_100048 VALUES (NULL, 1);
\echo :SQLSTATE

-- an ordinary role with INSERT on a shard is checked the same way
CREATE ROLE shard_writer;
GRANT INSERT ON orders_100000 TO shard_writer;
SET ROLE shard_writer;
INSERT INTO orders_100000 VALUES (42, 900010, 1);
INSERT INTO orders_100000 VALUES (1, 900011, 1);
\echo :SQLSTATE
RESET ROLE;
DELETE FROM orders_100000 WHERE order_id = 900010;
REVOKE ALL ON orders_100000 FROM shard_writer;
DROP ROLE shard_writer;

-- a job's wait for its marker row (pg_shard.await_marker, run in a cutover's
-- pause): a row that is there is answered at once, with the WAL flushed and
-- the activation of the named shards at the named version checked
CREATE TABLE pg_shard.job_0_marker (job bigint PRIMARY KEY, activate_version bigint,
    activate_shards bigint[], applied_at timestamptz);
INSERT INTO pg_shard.job_0_marker (job, applied_at) VALUES (7, '2026-01-01 00:00:00.5+00');
SELECT flushed_to::pg_lsn <= pg_current_wal_flush_lsn() AS flushed, activated, applied_at
  FROM pg_shard.await_marker('pg_shard.job_0_marker'::regclass, 7, NULL, NULL, 1000);
SELECT activated FROM pg_shard.await_marker('pg_shard.job_0_marker'::regclass, 7, ARRAY[100000],
    (SELECT epoch FROM pg_shard.local_shard WHERE shard_id = 100000), 1000);
SELECT activated AS at_another_version FROM pg_shard.await_marker('pg_shard.job_0_marker'::regclass,
    7, ARRAY[100000], -1, 1000);
-- the wait takes no transaction id (its commit writes no record of its own)
BEGIN;
SELECT activated FROM pg_shard.await_marker('pg_shard.job_0_marker'::regclass, 7, NULL, NULL, 1000);
SELECT pg_current_xact_id_if_assigned() IS NULL AS no_transaction_id;
COMMIT;
-- a marker that does not come: no row once the time is up
SELECT count(*) AS timed_out FROM pg_shard.await_marker('pg_shard.job_0_marker'::regclass, 8, NULL, NULL, 20);
-- bad input: a relation that does not exist; and not for ordinary roles
SELECT * FROM pg_shard.await_marker(0, 7, NULL, NULL, 20);
CREATE ROLE marker_waiter;
SET ROLE marker_waiter;
SELECT * FROM pg_shard.await_marker('pg_shard.job_0_marker'::regclass, 7, NULL, NULL, 20);
RESET ROLE;
DROP ROLE marker_waiter;
DROP TABLE pg_shard.job_0_marker;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
