-- Errors pass through with their SQLSTATE, detail and hint.
SELECT * FROM accounts WHERE id = 'not a number';
\echo :LAST_ERROR_SQLSTATE
INSERT INTO accounts VALUES (42, 'duplicate', 0);
\echo :LAST_ERROR_SQLSTATE
SELECT * FROM no_such_table;
\echo :LAST_ERROR_SQLSTATE
DO $$ BEGIN RAISE EXCEPTION 'custom' USING ERRCODE = 'P0042', DETAIL = 'some detail', HINT = 'some hint'; END $$;
\echo :LAST_ERROR_SQLSTATE
-- notices too
DO $$ BEGIN RAISE NOTICE 'a notice'; END $$;
-- COPY in and out through the coordinator
COPY accounts (id, owner, balance) FROM stdin;
2001	copied one	1
2002	copied two	2
\.
COPY (SELECT id, owner FROM accounts WHERE id > 2000 ORDER BY id) TO stdout;
SELECT owner FROM accounts WHERE id = 2002;
-- SQL-level PREPARE lives on one server connection: inside a transaction
-- (protocol-level prepared statements work anywhere: see the client tests)
BEGIN;
PREPARE by_id(bigint) AS SELECT owner FROM accounts WHERE id = $1;
EXECUTE by_id(2001);
DEALLOCATE by_id;
COMMIT;
-- multi-statement queries go to the metadata node as they are
SELECT 1 AS one; SELECT owner FROM accounts WHERE id = 2001;
-- empty query
;
