-- The multi-shard DML class: an UPDATE or DELETE across shard groups, an
-- INSERT … SELECT between co-located tables that keeps the distribution
-- column, or a multi-row INSERT … VALUES, runs as one statement per shard
-- group on the workers (a node's in one round trip, every node at once),
-- committed with the local transaction (two-phase commit when several
-- nodes wrote).
CREATE TABLE md_accounts (id bigint PRIMARY KEY, owner bigint, balance numeric(12,2) NOT NULL,
                          kind text, CHECK (balance >= -100));
CREATE TABLE md_history (id bigint, seq int, amount numeric(12,2), PRIMARY KEY (id, seq));
CREATE TABLE md_copy (id bigint PRIMARY KEY, owner bigint, balance numeric(12,2), kind text);
CREATE TABLE md_other (id bigint PRIMARY KEY, account bigint);
CREATE TABLE md_kinds (kind text PRIMARY KEY, rate numeric);
SELECT pg_shard.create_distributed_table('md_accounts', 'id', shard_count => 4);
SELECT pg_shard.create_distributed_table('md_history', 'id', colocate_with => 'md_accounts');
SELECT pg_shard.create_distributed_table('md_copy', 'id', colocate_with => 'md_accounts');
SELECT pg_shard.create_distributed_table('md_other', 'id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_reference_table('md_kinds');
INSERT INTO md_kinds VALUES ('basic', 0.01), ('gold', 0.02);
INSERT INTO md_accounts SELECT g, g % 7, 100, (ARRAY['basic', 'gold'])[1 + g % 2] FROM generate_series(1, 40) g;
INSERT INTO md_history SELECT g, s, s * 10 FROM generate_series(1, 40) g, generate_series(1, 3) s;
INSERT INTO md_other SELECT g, 41 - g FROM generate_series(1, 40) g;

-- an UPDATE without a key filter: one statement per shard group
EXPLAIN (COSTS OFF) UPDATE md_accounts SET balance = balance + 1 WHERE owner = 3;
UPDATE md_accounts SET balance = balance + 1 WHERE owner = 3;
SELECT count(*), sum(balance) FROM md_accounts;
-- EXPLAIN ANALYZE adds each node's time and rows (and changes them)
\o | sed -E 's/[0-9]+\.[0-9]+ ms/N ms/'
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) UPDATE md_accounts SET balance = balance + 1 WHERE owner = 4;
\o
SELECT count(*), sum(balance) FROM md_accounts;
-- RETURNING gives every shard's rows
UPDATE md_accounts SET balance = balance - 2 WHERE owner = 5 RETURNING id, balance;
-- (a modifying CTE takes the postgres_fdw path)
WITH changed AS (UPDATE md_accounts SET kind = kind WHERE id % 10 = 0 RETURNING id) SELECT count(*) FROM changed;
-- a reference table in FROM, and in a subquery
UPDATE md_accounts a SET balance = balance * (1 + k.rate) FROM md_kinds k WHERE k.kind = a.kind AND a.owner = 1;
SELECT id, balance FROM md_accounts WHERE owner = 1 ORDER BY id;
DELETE FROM md_history WHERE seq = 3 AND id IN (SELECT id FROM md_accounts WHERE kind IN (SELECT kind FROM md_kinds WHERE rate > 0.015));
SELECT count(*) FROM md_history;
-- a co-located table joined on the key, a correlated sublink on the key
EXPLAIN (COSTS OFF)
UPDATE md_accounts a SET balance = a.balance + h.amount FROM md_history h WHERE h.id = a.id AND h.seq = 1 AND a.owner = 2;
UPDATE md_accounts a SET balance = a.balance + h.amount FROM md_history h WHERE h.id = a.id AND h.seq = 1 AND a.owner = 2;
DELETE FROM md_history h USING md_accounts a WHERE a.id = h.id AND a.owner = 6 AND h.seq = 2;
UPDATE md_accounts a SET balance = (SELECT sum(amount) FROM md_history h WHERE h.id = a.id) WHERE owner = 4;
SELECT count(*), sum(balance) FROM md_accounts;
SELECT count(*), sum(amount) FROM md_history;
-- conditions on the key prune the shard groups
EXPLAIN (COSTS OFF) DELETE FROM md_history WHERE id IN (1, 2, 3) AND seq = 9;
-- what cannot run per shard group takes the postgres_fdw path, still right:
-- a table not co-located, a join not on the key, changing the key
EXPLAIN (COSTS OFF) UPDATE md_accounts a SET owner = 0 FROM md_other o WHERE o.account = a.id AND o.id = 0;
UPDATE md_accounts a SET owner = o.id FROM md_other o WHERE o.account = a.id AND o.id < 3;
SELECT id, owner FROM md_accounts WHERE owner < 3 AND id > 30 ORDER BY id;
UPDATE md_accounts SET id = id + 100 WHERE owner = 6;
-- INSERT … SELECT between co-located tables, keeping the key
EXPLAIN (COSTS OFF) INSERT INTO md_copy SELECT id, owner, balance, kind FROM md_accounts WHERE kind = 'gold';
INSERT INTO md_copy SELECT id, owner, balance, kind FROM md_accounts WHERE kind = 'gold';
SELECT count(*), sum(balance) FROM md_copy;
-- … with ON CONFLICT DO UPDATE, a join with a co-located table, RETURNING
INSERT INTO md_copy (id, owner, balance)
SELECT a.id, a.owner, sum(h.amount) FROM md_accounts a JOIN md_history h ON h.id = a.id WHERE a.id <= 6 GROUP BY a.id, a.owner
    ON CONFLICT (id) DO UPDATE SET balance = excluded.balance, kind = 'merged'
RETURNING id, balance, kind;
SELECT kind, count(*), sum(balance) FROM md_copy GROUP BY kind ORDER BY kind;
-- … not keeping the key, or aggregating across groups: postgres_fdw
EXPLAIN (COSTS OFF) INSERT INTO md_copy (id, balance) SELECT owner, sum(balance) FROM md_accounts GROUP BY owner;
INSERT INTO md_copy (id, balance) SELECT owner + 1000, sum(balance) FROM md_accounts GROUP BY owner;
SELECT count(*) FROM md_copy WHERE id > 1000;
-- a multi-row INSERT … VALUES: each shard group's statement inserts its
-- own rows; a row a shard refuses writes none of them
EXPLAIN (COSTS OFF) INSERT INTO md_copy VALUES (2001, 1, 5, 'v'), (2002, 1, 6, 'v'), (2003, 2, 7, 'v'), (2004, 2, 8, 'v');
INSERT INTO md_copy VALUES (2001, 1, 5, 'v'), (2002, 1, 6, 'v'), (2003, 2, 7, 'v'), (2004, 2, 8, 'v');
INSERT INTO md_copy VALUES (2005, 1, 5, 'v'), (2006, 1, 6, 'v'), (2001, 2, 7, 'v');
SELECT id, balance FROM md_copy WHERE kind = 'v' ORDER BY id;
-- … a key that is not a constant: postgres_fdw
EXPLAIN (COSTS OFF) INSERT INTO md_copy VALUES (2005 + (random() * 0)::int, 1, 1, 'w'), (2006, 1, 1, 'w');
DELETE FROM md_copy WHERE kind = 'v';
-- a generic plan takes postgres_fdw, and marks the transaction when it
-- runs: the statements after it take that path too, and see its rows
SET plan_cache_mode = force_generic_plan;
PREPARE md_generic(bigint, bigint) AS INSERT INTO md_copy (id, kind) VALUES ($1, 'g'), ($2, 'g');
BEGIN;
EXECUTE md_generic(3001, 3002);
SELECT id, kind FROM md_copy WHERE id = 3001;
ROLLBACK;
RESET plan_cache_mode;
DEALLOCATE md_generic;

-- all or nothing: a shard's error (here a CHECK) changes nothing anywhere
\set VERBOSITY sqlstate
UPDATE md_accounts SET balance = CASE WHEN id = 40 THEN -1000 ELSE balance + 1 END;
DELETE FROM md_accounts WHERE 1 / (id - 17) > 5;
\set VERBOSITY default
SELECT count(*), sum(balance) FROM md_accounts;
-- several nodes wrote: two-phase commit, nothing left prepared
SELECT count(*) AS prepared FROM pg_prepared_xacts;
-- in a transaction block every statement runs in the transaction's remote
-- transactions (one per node) and sees what the ones before it wrote
BEGIN;
EXPLAIN (COSTS OFF) DELETE FROM md_copy WHERE kind = 'merged';
DELETE FROM md_copy WHERE kind = 'merged';
SELECT count(*) FROM md_copy WHERE kind = 'merged';
UPDATE md_copy SET balance = 0 WHERE id = 2;
SELECT count(*), sum(balance) FROM md_copy;
INSERT INTO md_copy SELECT id, owner, balance, 'again' FROM md_accounts WHERE id < 10 ON CONFLICT (id) DO NOTHING;
SELECT kind, count(*) FROM md_copy GROUP BY kind ORDER BY kind;
ROLLBACK;
SELECT kind, count(*), sum(balance) FROM md_copy GROUP BY kind ORDER BY kind;
-- savepoints: rolling back to one undoes the workers' part of it too
BEGIN;
UPDATE md_copy SET balance = balance + 1000 WHERE id = 4;
SAVEPOINT before_delete;
DELETE FROM md_copy WHERE kind = 'merged';
SELECT count(*) FROM md_copy WHERE kind = 'merged';
ROLLBACK TO SAVEPOINT before_delete;
SELECT count(*) FROM md_copy WHERE kind = 'merged';
SAVEPOINT failing;
\set VERBOSITY sqlstate
UPDATE md_copy SET balance = 1 / (id - 4);
\set VERBOSITY default
ROLLBACK TO SAVEPOINT failing;
UPDATE md_copy SET kind = 'touched' WHERE kind IS NULL;
RELEASE SAVEPOINT failing;
COMMIT;
SELECT kind, count(*), sum(balance) FROM md_copy GROUP BY kind ORDER BY kind;
SELECT count(*) AS prepared FROM pg_prepared_xacts;
-- a statement that needs postgres_fdw after writes through pg_shard's own
-- connections is refused (its connections would not see them), and one
-- after writes over postgres_fdw takes that path too
BEGIN;
UPDATE md_copy SET balance = balance WHERE kind = 'merged';
UPDATE md_accounts a SET owner = a.owner FROM md_other o WHERE o.account = a.id AND o.id = 1;
ROLLBACK;
BEGIN;
UPDATE md_accounts a SET owner = a.owner FROM md_other o WHERE o.account = a.id AND o.id = 1;
EXPLAIN (COSTS OFF) UPDATE md_copy SET balance = balance WHERE kind = 'merged';
UPDATE md_copy SET balance = balance WHERE kind = 'merged';
COMMIT;
-- privileges are the metadata node's, before anything runs
CREATE ROLE md_writer;
SET ROLE md_writer;
UPDATE md_accounts SET balance = 0;
DELETE FROM md_history;
RESET ROLE;
DROP ROLE md_writer;
-- off, statements across shard groups take postgres_fdw
SET pg_shard.enable_pushdown_executor = off;
EXPLAIN (COSTS OFF) DELETE FROM md_copy;
RESET pg_shard.enable_pushdown_executor;
DELETE FROM md_copy;
SELECT count(*) FROM md_copy;

DROP TABLE md_other, md_copy, md_history, md_accounts, md_kinds;
