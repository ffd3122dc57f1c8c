-- Where statements run: EXPLAIN through the coordinator shows the plan of
-- the node that ran it. A single-shard statement runs on its worker,
-- against the shard table (named <table>_<shard id>).
EXPLAIN (COSTS OFF) SELECT * FROM accounts WHERE id = 42;
SELECT id, owner, balance FROM accounts WHERE id = 42;
-- constants in other forms; aliases and qualified names
EXPLAIN (COSTS OFF) SELECT a.owner FROM public.accounts a WHERE a.id = '42';
SELECT a.owner FROM public.accounts a WHERE a.id = '42';
SELECT accounts.owner FROM accounts WHERE accounts.id = 42::bigint;
-- IN within one shard, and across shards (metadata node)
EXPLAIN (COSTS OFF) SELECT count(*) FROM accounts WHERE id IN (42, 42);
EXPLAIN (COSTS OFF) SELECT count(*) FROM accounts WHERE id IN (1, 2, 3, 4, 5, 6);
SELECT count(*) FROM accounts WHERE id IN (1, 2, 3, 4, 5, 6);
-- co-located join on the key, with a reference table
EXPLAIN (COSTS OFF)
SELECT a.owner, t.amount, c.name FROM accounts a JOIN transfers t ON t.account_id = a.id
  JOIN currencies c ON c.code = 'EUR' WHERE a.id = 7 ORDER BY t.transfer_no;
SELECT a.owner, t.amount, c.name FROM accounts a JOIN transfers t ON t.account_id = a.id
  JOIN currencies c ON c.code = 'EUR' WHERE a.id = 7 ORDER BY t.transfer_no;
-- no key, a range, an outer join, a subquery: the metadata node
EXPLAIN (COSTS OFF) SELECT count(*) FROM accounts;
SELECT count(*), sum(balance) FROM accounts;
SELECT count(*) FROM accounts WHERE id > 90;
SELECT count(*) FROM accounts a LEFT JOIN transfers t ON t.account_id = a.id WHERE a.id = 7;
SELECT owner FROM accounts WHERE id = (SELECT 42);
-- a uuid key
EXPLAIN (COSTS OFF) SELECT kind FROM events WHERE id = '123e4567-e89b-12d3-a456-426614174000';
SELECT kind FROM events WHERE id = '123e4567-e89b-12d3-a456-426614174000';
-- writes by key go to the worker; its triggers check them
EXPLAIN (COSTS OFF) UPDATE accounts SET balance = balance + 1 WHERE id = 42;
UPDATE accounts SET balance = balance + 1 WHERE id = 42 RETURNING id, balance;
INSERT INTO accounts VALUES (1001, 'new', 5) RETURNING *;
INSERT INTO accounts VALUES (1001, 'again', 6) ON CONFLICT (id) DO UPDATE SET owner = excluded.owner RETURNING *;
INSERT INTO accounts (id, owner) VALUES (1002, 'default balance') RETURNING balance;
DELETE FROM accounts WHERE id IN (1001) RETURNING owner;
-- a key change is not routed: the metadata node refuses it
UPDATE accounts SET id = 5000 WHERE id = 1002;
-- reference tables: reads anywhere, writes through the metadata node
SELECT name FROM currencies WHERE code = 'USD';
INSERT INTO currencies VALUES ('JPY', 'Yen');
SELECT count(*) FROM currencies;
-- tables the coordinator does not know (local tables) and sequences
INSERT INTO notes (body) VALUES ('a local table') RETURNING id, body;
SELECT nextval('notes_id_seq') > 1 AS sequence_on_metadata;
-- every row is where it belongs, checked on the metadata node
SELECT count(*), sum(balance) FROM accounts;
