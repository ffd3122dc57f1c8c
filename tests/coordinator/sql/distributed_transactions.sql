-- Transactions on several nodes through the coordinator: each node the
-- transaction reaches keeps one connection; COMMIT is a plain COMMIT when
-- at most one node wrote, two-phase commit decided on the metadata node
-- otherwise. Accounts 42 and 7 live on different workers (transactions.sql).
UPDATE accounts SET balance = 100 WHERE id IN (7, 42);
-- a transfer between two workers commits on both
BEGIN;
UPDATE accounts SET balance = balance - 30 WHERE id = 42;
UPDATE accounts SET balance = balance + 30 WHERE id = 7;
SELECT id, balance FROM accounts WHERE id = 42;
SELECT id, balance FROM accounts WHERE id = 7;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- nothing was left prepared for the recovery to end
SELECT pg_shard.recover_prepared_transactions() AS ended_by_recovery;
-- ROLLBACK undoes both
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
UPDATE accounts SET balance = 0 WHERE id = 7;
ROLLBACK;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- an error on the second node fails the transaction; COMMIT rolls back everywhere
BEGIN;
UPDATE accounts SET balance = balance - 1 WHERE id = 42;
UPDATE accounts SET balance = balance / 0 WHERE id = 7;
SELECT 1;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- a node that only read commits after the one that wrote (no two-phase commit)
BEGIN;
SELECT balance FROM accounts WHERE id = 7;
UPDATE accounts SET balance = balance + 5 WHERE id = 42;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- savepoints across nodes: a node reached after the savepoint rolls back to it too
BEGIN;
UPDATE accounts SET balance = 1 WHERE id = 42;
SAVEPOINT a;
UPDATE accounts SET balance = 2 WHERE id = 7;
UPDATE accounts SET balance = 3 WHERE id = 42;
ROLLBACK TO SAVEPOINT a;
SELECT id, balance FROM accounts WHERE id = 7;
SELECT id, balance FROM accounts WHERE id = 42;
UPDATE accounts SET balance = 4 WHERE id = 7;
RELEASE SAVEPOINT a;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- savepoints before any node, nested, and released
BEGIN;
SAVEPOINT outer_one;
SAVEPOINT inner_one;
UPDATE accounts SET balance = 10 WHERE id = 42;
RELEASE SAVEPOINT inner_one;
UPDATE accounts SET balance = 20 WHERE id = 7;
ROLLBACK TO SAVEPOINT outer_one;
UPDATE accounts SET balance = 30 WHERE id = 7;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- ROLLBACK TO a savepoint after an error on one of the nodes
BEGIN;
UPDATE accounts SET balance = 100 WHERE id = 42;
SAVEPOINT s;
UPDATE accounts SET balance = 100 WHERE id = 7;
SELECT balance / 0 FROM accounts WHERE id = 7;
SELECT 1;
ROLLBACK TO SAVEPOINT s;
UPDATE accounts SET balance = 99 WHERE id = 7;
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- after an error on one of two nodes, ROLLBACK TO and COMMIT in one query
-- are refused (the coordinator runs them on every node, one at a time):
-- nothing commits anywhere
BEGIN;
UPDATE accounts SET balance = 500 WHERE id = 42;
UPDATE accounts SET balance = 500 WHERE id = 7;
SAVEPOINT a;
SELECT balance / 0 FROM accounts WHERE id = 7;
ROLLBACK TO SAVEPOINT a \; COMMIT;
ROLLBACK;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- a savepoint that does not exist
BEGIN;
RELEASE SAVEPOINT nowhere;
ROLLBACK;
BEGIN;
UPDATE accounts SET balance = balance WHERE id = 42;
UPDATE accounts SET balance = balance WHERE id = 7;
ROLLBACK TO SAVEPOINT nowhere;
SELECT 1;
ROLLBACK;
-- a reference table written in the same transaction as two workers
BEGIN;
UPDATE accounts SET balance = balance - 1 WHERE id = 42;
UPDATE currencies SET name = 'Euro (EUR)' WHERE code = 'EUR';
UPDATE accounts SET balance = balance + 1 WHERE id = 7;
COMMIT;
SELECT name FROM currencies WHERE code = 'EUR';
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- ... and rolled back with them
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
UPDATE currencies SET name = 'gone' WHERE code = 'EUR';
UPDATE accounts SET balance = 0 WHERE id = 7;
ROLLBACK;
SELECT name FROM currencies WHERE code = 'EUR';
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
UPDATE currencies SET name = 'Euro' WHERE code = 'EUR';
-- a worker's copy of a reference table the metadata node wrote in this
-- transaction would not show the write: refused, the transaction rolled back
BEGIN;
UPDATE currencies SET name = 'Euro?' WHERE code = 'EUR';
SELECT a.id, c.name FROM accounts a JOIN currencies c ON c.code = 'EUR' WHERE a.id = 42;
SELECT 1;
ROLLBACK;
SELECT name FROM currencies WHERE code = 'EUR';
-- statements only the metadata node runs, after the transaction wrote on a
-- worker: refused before they run, the transaction rolled back
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
SELECT count(*) FROM accounts;
ROLLBACK;
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
SELECT pg_shard.recover_prepared_transactions();
ROLLBACK;
BEGIN;
UPDATE accounts SET balance = 0 WHERE id = 42;
ALTER TABLE accounts ADD COLUMN nope int;
ROLLBACK;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- such a statement first: the whole transaction runs on the metadata node
BEGIN;
UPDATE accounts SET balance = balance + 1 WHERE id IN (7, 42);
UPDATE accounts SET balance = balance + 1 WHERE id = 42;
SELECT sum(balance) FROM accounts WHERE id IN (7, 42);
COMMIT;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
-- a deferred constraint that fails at PREPARE: the client gets the error, nothing commits anywhere
CREATE TABLE ledger (id bigint, entry int, CONSTRAINT ledger_unique UNIQUE (id) DEFERRABLE INITIALLY DEFERRED);
ALTER TABLE ledger REPLICA IDENTITY FULL;
SELECT pg_shard.create_distributed_table('ledger', 'id', colocate_with => 'accounts');
SELECT pg_sleep(0.5);
BEGIN;
UPDATE accounts SET balance = balance + 1000 WHERE id = 42;
INSERT INTO ledger VALUES (7, 1);
INSERT INTO ledger VALUES (7, 2);
\set VERBOSITY sqlstate
COMMIT;
\set VERBOSITY default
SELECT count(*) AS ledger_rows FROM ledger;
SELECT id, balance FROM accounts WHERE id IN (7, 42) ORDER BY id;
SELECT pg_shard.recover_prepared_transactions() AS ended_by_recovery;
DROP TABLE ledger;
