-- A transaction runs on the node of its first statement.
BEGIN;
UPDATE accounts SET balance = balance - 10 WHERE id = 42;
INSERT INTO transfers VALUES (42, 4, -10);
SELECT balance FROM accounts WHERE id = 42;
COMMIT;
SELECT balance FROM accounts WHERE id = 42;
SELECT count(*) FROM transfers WHERE account_id = 42;
-- rolled back: nothing stays
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
ROLLBACK;
SELECT balance FROM accounts WHERE id = 42;
-- a transaction on two workers commits on both (more in distributed_transactions.sql)
SELECT pg_shard.keyspace_id(42::bigint) AS k42, pg_shard.keyspace_id(7::bigint) AS k7 \gset
SELECT (SELECT node_id FROM pg_shard.shards WHERE table_name = 'accounts'::regclass
          AND :k42 BETWEEN range_start AND range_end)
    <> (SELECT node_id FROM pg_shard.shards WHERE table_name = 'accounts'::regclass
          AND :k7 BETWEEN range_start AND range_end) AS other_node;
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
UPDATE accounts SET balance = 0 WHERE id = 7;
SELECT 1;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- a transaction that starts on the metadata node can touch every shard
BEGIN;
SELECT count(*) FROM accounts;
UPDATE accounts SET balance = balance + 1 WHERE id = 42;
UPDATE accounts SET balance = balance + 1 WHERE id = 7;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- BEGIN and COMMIT without statements; statements without tables follow the transaction
BEGIN ISOLATION LEVEL REPEATABLE READ;
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
UPDATE accounts SET balance = balance WHERE id = 42;
SHOW transaction_isolation;
COMMIT;
BEGIN;
SELECT 1 AS no_table;
UPDATE accounts SET balance = balance WHERE id = 42;
COMMIT;
BEGIN;
UPDATE accounts SET balance = balance WHERE id = 42;
SHOW transaction_isolation;
SET LOCAL statement_timeout = '5s';
SELECT balance FROM accounts WHERE id = 42;
COMMIT;
-- an error inside a transaction aborts it, as in PostgreSQL
BEGIN;
UPDATE accounts SET balance = balance + 1 WHERE id = 42;
SELECT 1 / 0;
SELECT 1;
ROLLBACK;
SELECT balance FROM accounts WHERE id = 42;
-- savepoints on the transaction's node
BEGIN;
UPDATE accounts SET balance = 500 WHERE id = 42;
SAVEPOINT s;
UPDATE accounts SET balance = 600 WHERE id = 42;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT balance FROM accounts WHERE id = 42;
-- session settings survive transaction pooling
SET DateStyle = 'SQL, DMY';
SELECT '2024-03-01'::date;
SELECT '2024-03-01'::date FROM accounts WHERE id = 42;
RESET DateStyle;
SELECT '2024-03-01'::date;
-- a failed SET is not replayed, and does not get in the way of BEGIN
SET statement_timeout = 'bogus';
BEGIN;
UPDATE accounts SET balance = 7 WHERE id = 42;
ROLLBACK;
SELECT balance FROM accounts WHERE id = 42;
-- ROLLBACK TO SAVEPOINT after an error, on the transaction's worker
BEGIN;
UPDATE accounts SET balance = 501 WHERE id = 42;
SAVEPOINT s;
SELECT 1 / 0;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT balance FROM accounts WHERE id = 42;
-- a statement that needs the metadata node in a worker's transaction
BEGIN;
UPDATE accounts SET balance = balance WHERE id = 42;
CREATE TABLE made_in_transaction AS SELECT 1 AS one;
ROLLBACK;
SELECT count(*) FROM pg_class WHERE relname = 'made_in_transaction';
-- a temporary table shadows the distributed one: not routed (inside a
-- transaction, where the temporary table lives)
BEGIN;
CREATE TEMP TABLE accounts (id bigint, owner text, balance numeric);
INSERT INTO accounts VALUES (42, 'temporary', 0);
SELECT owner FROM accounts WHERE id = 42;
ROLLBACK;
SELECT owner FROM accounts WHERE id = 42;
