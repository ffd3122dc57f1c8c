-- Lookup tables: a column's values -> the keyspace ids of their rows'
-- keys, kept in the same transaction as every write of the table, on every
-- path that writes it (router, multi-shard DML, COPY, moves and splits).
CREATE TABLE lk_customers (id bigint PRIMARY KEY, email text, name text, region int);
CREATE TABLE lk_orders (customer_id bigint NOT NULL, n int NOT NULL, email text, PRIMARY KEY (customer_id, n));
INSERT INTO lk_customers SELECT g, 'user' || g || '@example.com', 'n' || g, g % 7 FROM generate_series(1, 500) g;
INSERT INTO lk_customers VALUES (501, NULL, 'no email', 1);
SELECT pg_shard.create_distributed_table('lk_customers', 'id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('lk_orders', 'customer_id', colocate_with => 'lk_customers');
-- What a lookup must hold: one (value, keyspace id) per row, counted.
CREATE FUNCTION lk_differences(base regclass, col text, key text, lookup regclass) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    EXECUTE format(
        'SELECT count(*) FROM (
            (SELECT %1$I AS value, pg_shard.keyspace_id(%2$I) AS keyspace_id, count(*) AS rows
               FROM %3$s WHERE %1$I IS NOT NULL GROUP BY 1, 2
             EXCEPT SELECT value, keyspace_id, rows FROM %4$s)
            UNION ALL
            (SELECT value, keyspace_id, rows FROM %4$s
             EXCEPT SELECT %1$I, pg_shard.keyspace_id(%2$I), count(*)
               FROM %3$s WHERE %1$I IS NOT NULL GROUP BY 1, 2)) d',
        col, key, base, lookup) INTO n;
    RETURN n;
END $$;

-- bad input changes nothing
SELECT pg_shard.create_lookup('pg_shard.node', 'host');
SELECT pg_shard.create_lookup('lk_customers', 'id');
SELECT pg_shard.create_lookup('lk_customers', 'nope');
CREATE TABLE lk_numbers (id bigint PRIMARY KEY, amount numeric);
SELECT pg_shard.create_distributed_table('lk_numbers', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_lookup('lk_numbers', 'amount');
-- a column whose collation is nondeterministic: values it calls equal
-- would hash apart (collations are per server: made on every node)
CREATE COLLATION lk_nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE COLLATION lk_nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE COLLATION lk_nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE COLLATION lk_nocase (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE TABLE lk_nocase_logins (id bigint PRIMARY KEY, login text COLLATE lk_nocase);
SELECT pg_shard.create_distributed_table('lk_nocase_logins', 'id', shard_count => 2, colocate_with => 'none');
INSERT INTO lk_nocase_logins VALUES (1, 'Ann'), (2, 'ANN');
SELECT pg_shard.create_lookup('lk_nocase_logins', 'login', "unique" => true);
SELECT count(*) AS lookups_of_nocase, to_regclass('lk_nocase_logins_login_lookup') AS lookup_table
  FROM pg_shard.lookups WHERE table_name = 'lk_nocase_logins'::regclass;
DROP TABLE lk_nocase_logins;
DROP COLLATION lk_nocase;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
DROP COLLATION lk_nocase;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
DROP COLLATION lk_nocase;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
DROP COLLATION lk_nocase;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT pg_shard.drop_lookup('lk_customers', 'email');
SELECT count(*) AS lookups FROM pg_shard.lookup;

-- create: filled from the rows, in its own co-location group, same shard count
SELECT pg_shard.create_lookup('lk_customers', 'email', "unique" => true);
SELECT * FROM pg_shard.lookups;
SELECT count(*) AS shards, count(DISTINCT node_id) > 1 AS spread
  FROM pg_shard.shards WHERE table_name = 'lk_customers_email_lookup'::regclass;
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS differences;
SELECT value, keyspace_id = pg_shard.keyspace_id(7::bigint) AS right_key, rows
  FROM lk_customers_email_lookup WHERE value = 'user7@example.com';
SELECT pg_shard.create_lookup('lk_customers', 'email');
SELECT pg_shard.create_lookup('lk_customers_email_lookup', 'keyspace_id');
-- a non-unique lookup counts rows per value and key
SELECT pg_shard.create_lookup('lk_customers', 'region');
SELECT sum(rows) AS region_rows, count(*) AS region_entries FROM lk_customers_region_lookup;

-- the metadata node prunes a read by a looked-up column to the shards the
-- lookup names for the value (read when the plan starts)
CREATE FUNCTION lk_scans(query text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    line text;
    scans bigint := 0;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
        IF line ~ 'Scan on lk_customers_[0-9]' THEN
            scans := scans + 1;
        END IF;
    END LOOP;
    RETURN scans;
END $$;
SELECT lk_scans('SELECT * FROM lk_customers WHERE email = ''user7@example.com''') AS by_email,
       lk_scans('SELECT * FROM lk_customers WHERE email = ''nobody@example.com''') AS by_missing_email,
       lk_scans('SELECT * FROM lk_customers WHERE name = ''n7''') AS by_other_column;
SELECT id, name FROM lk_customers WHERE email = 'user7@example.com';
SELECT count(*) FROM lk_customers WHERE email = 'nobody@example.com';
PREPARE lk_by_email(text) AS SELECT id FROM lk_customers WHERE email = $1;
EXECUTE lk_by_email('user1@example.com');
EXECUTE lk_by_email('user2@example.com');
EXECUTE lk_by_email('user3@example.com');
EXECUTE lk_by_email('user4@example.com');
EXECUTE lk_by_email('user5@example.com');
EXECUTE lk_by_email('user6@example.com');
-- (a generic plan by now: the lookup is read when it starts)
SELECT lk_scans('EXECUTE lk_by_email(''user7@example.com'')') AS prepared_by_email;
DEALLOCATE lk_by_email;
SELECT count(*) AS by_region, (SELECT count(*) FROM lk_customers WHERE region + 0 = 3) AS by_scan
  FROM lk_customers WHERE region = 3;

-- router writes (one key): INSERT, UPDATE of the column, DELETE
INSERT INTO lk_customers VALUES (1001, 'new@example.com', 'x', 1);
SELECT value FROM lk_customers_email_lookup WHERE value = 'new@example.com';
UPDATE lk_customers SET email = 'changed@example.com' WHERE id = 1001;
SELECT value FROM lk_customers_email_lookup WHERE value IN ('new@example.com', 'changed@example.com');
UPDATE lk_customers SET name = 'not the column' WHERE id = 1001;
DELETE FROM lk_customers WHERE id = 1001;
SELECT count(*) FROM lk_customers_email_lookup WHERE value IN ('new@example.com', 'changed@example.com');
-- a value taken elsewhere: 23505 naming the lookup and the value, nothing written
INSERT INTO lk_customers VALUES (1002, 'user7@example.com', 'dup', 1);
\echo :SQLSTATE
SELECT count(*) AS dup_rows FROM lk_customers WHERE id = 1002;
UPDATE lk_customers SET email = 'user8@example.com' WHERE id = 9;
SELECT email FROM lk_customers WHERE id = 9;
-- swapping two values in one statement (removals before additions)
UPDATE lk_customers SET email = CASE id WHEN 10 THEN 'user11@example.com' ELSE 'user10@example.com' END
 WHERE id IN (10, 11);
SELECT id, email FROM lk_customers WHERE id IN (10, 11) ORDER BY id;
-- multi-shard UPDATE and DELETE
UPDATE lk_customers SET email = upper(email), region = region + 1 WHERE id <= 20;
DELETE FROM lk_customers WHERE id BETWEEN 21 AND 30;
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS email_differences,
       lk_differences('lk_customers', 'region', 'id', 'lk_customers_region_lookup') AS region_differences;
-- a multi-shard UPDATE that would duplicate a value writes nothing
UPDATE lk_customers SET email = 'same@example.com' WHERE id IN (40, 41);
\echo :SQLSTATE
SELECT count(*) FROM lk_customers WHERE email = 'same@example.com';
-- transactions, savepoints and rollbacks
BEGIN;
INSERT INTO lk_customers VALUES (3000, 'tx@example.com', 'a', 1);
SAVEPOINT s;
INSERT INTO lk_customers VALUES (3001, 'savepoint@example.com', 'a', 1);
ROLLBACK TO s;
INSERT INTO lk_customers VALUES (3002, 'after@example.com', 'a', 1);
COMMIT;
BEGIN;
INSERT INTO lk_customers VALUES (3003, 'rolled-back@example.com', 'a', 1);
ROLLBACK;
SELECT value FROM lk_customers_email_lookup WHERE value LIKE '%@example.com' AND value NOT LIKE 'user%' AND value NOT LIKE 'USER%' ORDER BY 1;
-- INSERT … SELECT between co-located tables (the modify scan)
CREATE TABLE lk_staging (customer_id bigint NOT NULL, n int NOT NULL, email text, PRIMARY KEY (customer_id, n));
SELECT pg_shard.create_distributed_table('lk_staging', 'customer_id', colocate_with => 'lk_customers');
INSERT INTO lk_staging SELECT g, 1, 'order' || g || '@example.com' FROM generate_series(1, 5) g;
SELECT pg_shard.create_lookup('lk_orders', 'email');
INSERT INTO lk_orders SELECT * FROM lk_staging;
SELECT lk_differences('lk_orders', 'email', 'customer_id', 'lk_orders_email_lookup') AS order_differences,
       (SELECT count(*) FROM lk_orders_email_lookup) AS order_entries;
-- COPY, and a COPY with a value taken writes nothing
COPY lk_customers FROM stdin;
5000	copy1@example.com	a	1
5001	copy2@example.com	b	2
\.
COPY lk_customers FROM stdin;
5002	copy3@example.com	a	1
5003	copy1@example.com	b	2
\.
SELECT count(*) FROM lk_customers WHERE id BETWEEN 5000 AND 5003;
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS differences;
-- a multi-row INSERT across shards: one statement per shard group, each
-- with its group's rows; a value twice in one statement, or taken, writes
-- nothing
\o | grep -oE 'Class: .*|INSERT INTO' | sort | uniq -c
EXPLAIN (COSTS OFF) INSERT INTO lk_customers VALUES (6000, 'm1@example.com', 'a', 1), (6001, 'm2@example.com', 'b', 1),
                                                 (6003, 'm4@example.com', 'd', 2), (6004, NULL, 'e', 2);
\o
INSERT INTO lk_customers VALUES (6000, 'm1@example.com', 'a', 1), (6001, 'm2@example.com', 'b', 1),
                                (6003, 'm4@example.com', 'd', 2), (6004, NULL, 'e', 2);
INSERT INTO lk_customers VALUES (6005, 'm5@example.com', 'f', 1), (6006, 'm5@example.com', 'g', 1);
INSERT INTO lk_customers VALUES (6005, 'm5@example.com', 'f', 1), (6006, 'm2@example.com', 'g', 1);
SELECT id, email FROM lk_customers WHERE id BETWEEN 6000 AND 6009 ORDER BY id;
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS differences;
-- … with RETURNING, in the order of its rows, within a shard group and
-- across groups (with ON CONFLICT, within one group only: across groups it
-- would take the postgres_fdw path)
CREATE TEMP TABLE lk_ids AS
  SELECT i, (SELECT shard_id FROM pg_shard.shards WHERE table_name = 'lk_customers'::regclass AND state = 'active'
               AND pg_shard.keyspace_id(i::bigint) BETWEEN range_start AND range_end) AS shard
  FROM generate_series(6010, 6100) i;
SELECT a.i AS first_id, b.i AS second_id FROM lk_ids a JOIN lk_ids b ON a.shard = b.shard AND a.i < b.i
 ORDER BY 1, 2 LIMIT 1 \gset
INSERT INTO lk_customers VALUES (:second_id, 'r2@example.com', 'r', 1), (:first_id, 'r1@example.com', 'r', 1)
  RETURNING id = :second_id AS second_first, email;
SELECT min(i) AS third_id FROM lk_ids WHERE shard = (SELECT shard FROM lk_ids WHERE i = :first_id) AND i > :second_id \gset
SELECT min(i) AS other_id FROM lk_ids WHERE shard <> (SELECT shard FROM lk_ids WHERE i = :first_id) \gset
INSERT INTO lk_customers VALUES (:third_id, 'r3@example.com', 'r', 1), (:other_id, 'r4@example.com', 'r', 1)
  RETURNING id = :third_id AS third_first, email;
INSERT INTO lk_customers VALUES (6409, 'e9@example.com', 'e', 1), (6408, 'e8@example.com', 'e', 1),
    (6407, 'e7@example.com', 'e', 1), (6406, 'e6@example.com', 'e', 1), (6405, 'e5@example.com', 'e', 1),
    (6404, 'e4@example.com', 'e', 1), (6403, 'e3@example.com', 'e', 1), (6402, 'e2@example.com', 'e', 1)
  RETURNING id, email;
SELECT min(i) AS c1 FROM lk_ids WHERE shard = (SELECT shard FROM lk_ids WHERE i = :first_id) AND i > :third_id \gset
SELECT min(i) AS c2 FROM lk_ids WHERE shard <> (SELECT shard FROM lk_ids WHERE i = :first_id) AND i > :other_id \gset
INSERT INTO lk_customers VALUES (:c1, 'f1@example.com', 'f', 1), (:c2, 'f2@example.com', 'f', 1)
  ON CONFLICT DO NOTHING RETURNING id;
-- … and an upsert of many rows
INSERT INTO lk_customers VALUES (6000, 'm1-new@example.com', 'a', 1), (6003, 'm4@example.com', 'd', 3),
                                (6007, 'm7@example.com', 'h', 1)
  ON CONFLICT (id) DO UPDATE SET email = excluded.email, region = excluded.region;
SELECT id, email, region FROM lk_customers WHERE id IN (6000, 6003, 6007) ORDER BY id;
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS differences;
-- the lookup table is pg_shard's to write; writes over postgres_fdw (a
-- function's statements) cannot keep it and are refused
INSERT INTO lk_customers_email_lookup VALUES ('planted', 1, 1);
DO $$ BEGIN INSERT INTO lk_customers VALUES (6002, 'm3@example.com', 'c', 1); END $$;
-- (an SQL function's statements and a generic plan are planned without
-- their parameters' values, and refused when they start)
CREATE FUNCTION lk_sql_insert(bigint, text) RETURNS void LANGUAGE sql
  AS $$ INSERT INTO lk_customers VALUES ($1, $2, 'sql', 1) $$;
SELECT lk_sql_insert(6002, 'm3@example.com');
SET plan_cache_mode = force_generic_plan;
PREPARE lk_generic(bigint, text) AS INSERT INTO lk_customers VALUES ($1, $2, 'g', 1), ($1 + 1, $2 || '.2', 'g', 1);
EXECUTE lk_generic(6002, 'm3@example.com');
RESET plan_cache_mode;
DEALLOCATE lk_generic;
DROP FUNCTION lk_sql_insert(bigint, text);
SELECT count(*) FROM lk_customers WHERE id IN (6002, 6003) AND name IN ('c', 'sql', 'g');
DROP TABLE lk_ids;

-- moves and splits of the table and of its lookup keep every entry
SET pg_shard.move_drop_delay = 0;
SELECT s.shard_id AS lk_shard, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS lk_target
  FROM pg_shard.shards s WHERE s.table_name = 'lk_customers'::regclass ORDER BY range_start LIMIT 1 \gset
SELECT pg_shard.move_shard(:lk_shard, :lk_target) AS lk_job \gset
SELECT pg_shard.wait_job(:lk_job, '3 minutes');
SELECT shard_id AS lk_split FROM pg_shard.shards WHERE table_name = 'lk_customers'::regclass ORDER BY range_start DESC LIMIT 1 \gset
SELECT pg_shard.split_shard(:lk_split) AS lk_job \gset
SELECT pg_shard.wait_job(:lk_job, '3 minutes');
SELECT shard_id AS lk_lookup_shard FROM pg_shard.shards WHERE table_name = 'lk_customers_email_lookup'::regclass ORDER BY range_start LIMIT 1 \gset
SELECT pg_shard.split_shard(:lk_lookup_shard) AS lk_job \gset
SELECT pg_shard.wait_job(:lk_job, '3 minutes');
-- writes after them reach every new shard's triggers
SELECT format('INSERT INTO lk_customers VALUES (%s, %L, %L, 3)', g, 'late' || g || '@example.com', 'l')
  FROM generate_series(7000, 7040) g \gexec
UPDATE lk_customers SET email = 'moved-' || email WHERE id BETWEEN 100 AND 140;
DELETE FROM lk_customers WHERE id BETWEEN 141 AND 160;
INSERT INTO lk_customers VALUES (7100, 'user200@example.com', 'dup after split', 1);
\echo :SQLSTATE
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS email_differences,
       lk_differences('lk_customers', 'region', 'id', 'lk_customers_region_lookup') AS region_differences;

-- a router that does not know of the lookup is refused by the shards: the
-- epoch of every shard of the table was raised when it was made
SELECT format('dbname=%s host=127.0.0.1 port=%s', current_database(), n.port) AS lk_dsn,
       format('%I.%I', split_part(s.shard_table, '.', 1), split_part(s.shard_table, '.', 2)) AS lk_shard_table,
       (SELECT version FROM pg_shard.map_state) AS lk_version
  FROM pg_shard.shards s JOIN pg_shard.node n USING (node_id)
 WHERE s.table_name = 'lk_customers'::regclass AND s.state = 'active' LIMIT 1 \gset
\c :lk_dsn
\set SHOW_CONTEXT never
SELECT count(*) = 3 * 2 AS lookup_triggers FROM pg_trigger WHERE tgrelid = :'lk_shard_table'::regclass AND tgname LIKE 'pg_shard_lookup_%';
\set VERBOSITY sqlstate
SET pg_shard.map_version = 1;
DELETE FROM :lk_shard_table WHERE false;
RESET pg_shard.map_version;
-- and rows written on a shard without their lookup changes being taken
-- are refused at commit
BEGIN;
DELETE FROM :lk_shard_table WHERE id IN (SELECT id FROM :lk_shard_table LIMIT 1);
COMMIT;
\set VERBOSITY default
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS differences;

-- schema changes: a looked-up column (or the key) renamed keeps its
-- lookup; dropping it or changing its type is refused until drop_lookup
ALTER TABLE lk_customers RENAME COLUMN email TO mail;
SELECT table_name, column_name FROM pg_shard.lookups ORDER BY 1, 2;
INSERT INTO lk_customers VALUES (9000, 'renamed@example.com', 'r', 1);
INSERT INTO lk_customers VALUES (9001, 'renamed@example.com', 'r', 1);
ALTER TABLE lk_customers RENAME COLUMN id TO customer;
INSERT INTO lk_customers VALUES (9002, 'renamed-key@example.com', 'r', 1);
UPDATE lk_customers SET mail = 'renamed-again@example.com' WHERE customer = 9000;
SELECT lk_differences('lk_customers', 'mail', 'customer', 'lk_customers_email_lookup') AS differences;
ALTER TABLE lk_customers RENAME COLUMN customer TO id;
ALTER TABLE lk_customers RENAME COLUMN mail TO email;
ALTER TABLE lk_customers DROP COLUMN email;
ALTER TABLE lk_customers ALTER COLUMN email TYPE varchar(200);
SELECT pg_shard.undistribute_table('lk_customers');
SELECT pg_shard.undistribute_table('lk_customers_email_lookup');
DROP TABLE lk_customers_email_lookup;
TRUNCATE lk_customers_email_lookup;
SELECT count(*) > 0 AS still_there FROM lk_customers_email_lookup;
COPY lk_customers_email_lookup FROM '/dev/null';
ALTER TABLE lk_customers_email_lookup RENAME COLUMN value TO v;
ALTER TABLE lk_customers_email_lookup ADD COLUMN extra int;
-- rows a foreign key's action changes by themselves cannot keep a lookup
CREATE TABLE lk_parent (id bigint PRIMARY KEY);
CREATE TABLE lk_child (id bigint NOT NULL, n int NOT NULL, code int, PRIMARY KEY (id, n));
SELECT pg_shard.create_distributed_table('lk_parent', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('lk_child', 'id', colocate_with => 'lk_parent');
ALTER TABLE lk_child ADD FOREIGN KEY (id) REFERENCES lk_parent ON DELETE CASCADE;
SELECT pg_shard.create_lookup('lk_child', 'code');
SELECT count(*) AS lookups_of_refused FROM pg_shard.lookups WHERE table_name::text = 'lk_child';
DROP TABLE lk_child, lk_parent;
-- TRUNCATE empties the table's lookups with it
CREATE TABLE lk_scratch (id bigint PRIMARY KEY, code int);
SELECT pg_shard.create_distributed_table('lk_scratch', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_lookup('lk_scratch', 'code', "unique" => true);
INSERT INTO lk_scratch VALUES (1, 10);
INSERT INTO lk_scratch VALUES (2, 20);
TRUNCATE lk_scratch;
SELECT count(*) AS entries_after_truncate FROM lk_scratch_code_lookup;
INSERT INTO lk_scratch VALUES (3, 10);
SELECT lk_differences('lk_scratch', 'code', 'id', 'lk_scratch_code_lookup') AS differences;
-- … and TRUNCATE … CASCADE those of the tables whose keys reference it
CREATE TABLE lk_scratch_refs (id bigint NOT NULL, n int NOT NULL, code int, PRIMARY KEY (id, n));
SELECT pg_shard.create_distributed_table('lk_scratch_refs', 'id', colocate_with => 'lk_scratch');
ALTER TABLE lk_scratch_refs ADD FOREIGN KEY (id) REFERENCES lk_scratch;
SELECT pg_shard.create_lookup('lk_scratch_refs', 'code');
INSERT INTO lk_scratch_refs VALUES (3, 1, 77);
TRUNCATE lk_scratch CASCADE;
SELECT (SELECT count(*) FROM lk_scratch_refs) AS refs, (SELECT count(*) FROM lk_scratch_refs_code_lookup) AS ref_entries,
       (SELECT count(*) FROM lk_scratch_code_lookup) AS entries;
DROP TABLE lk_scratch_refs;
-- DROP TABLE drops its lookups, shards and all
DROP TABLE lk_scratch;
SELECT to_regclass('lk_scratch_code_lookup') AS lookup_gone,
       (SELECT count(*) FROM pg_shard.logical_table WHERE table_rel::text LIKE 'lk_scratch%') AS catalog_rows;

-- a lookup's owner and privileges follow its table's: whoever may write
-- the table writes its lookups with it, whoever may read it reads them
-- (roles are per server: they exist on every node)
CREATE ROLE lk_owner LOGIN;
CREATE ROLE lk_writer LOGIN;
CREATE ROLE lk_reader LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE ROLE lk_owner LOGIN;
CREATE ROLE lk_writer LOGIN;
CREATE ROLE lk_reader LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE ROLE lk_owner LOGIN;
CREATE ROLE lk_writer LOGIN;
CREATE ROLE lk_reader LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE ROLE lk_owner LOGIN;
CREATE ROLE lk_writer LOGIN;
CREATE ROLE lk_reader LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE TABLE lk_accounts (id bigint PRIMARY KEY, login text);
SELECT pg_shard.create_distributed_table('lk_accounts', 'id', shard_count => 2, colocate_with => 'none');
ALTER TABLE lk_accounts OWNER TO lk_owner;
GRANT SELECT ON lk_accounts TO lk_reader;
GRANT SELECT, INSERT, UPDATE, DELETE ON lk_accounts TO lk_writer;
INSERT INTO lk_accounts VALUES (1, 'ann');
SELECT pg_shard.create_lookup('lk_accounts', 'login', "unique" => true);
SELECT relowner::regrole AS owner, relacl FROM pg_class WHERE oid = 'lk_accounts_login_lookup'::regclass;
SET ROLE lk_writer;
INSERT INTO lk_accounts VALUES (2, 'bob');
INSERT INTO lk_accounts VALUES (3, 'cy');
UPDATE lk_accounts SET login = 'ann2' WHERE id = 1;
DELETE FROM lk_accounts WHERE id = 3;
INSERT INTO lk_accounts VALUES (4, 'bob');
SELECT pg_shard.lookup_keyspace_id('lk_accounts_login_lookup'::regclass, 'bob'::text, 1)
       = pg_shard.keyspace_id(2::bigint) AS writer_finds_bob;
RESET ROLE;
SET ROLE lk_reader;
SELECT pg_shard.lookup_keyspace_id('lk_accounts_login_lookup'::regclass, 'ann2'::text, 1)
       = pg_shard.keyspace_id(1::bigint) AS reader_finds_ann2;
SELECT id, login FROM lk_accounts WHERE id = 1;
SELECT value FROM lk_accounts_login_lookup ORDER BY 1;
INSERT INTO lk_accounts VALUES (5, 'dee');
RESET ROLE;
-- privileges of the lookup table itself are not a DBA's to set
GRANT INSERT ON lk_accounts_login_lookup TO lk_reader;
ALTER TABLE lk_accounts_login_lookup OWNER TO lk_reader;
-- only the table's owner sets its privileges (a role granted them WITH
-- GRANT OPTION is refused); GRANT … ON ALL TABLES IN SCHEMA gives the
-- lookup what the table's privileges imply, not the GRANT's
GRANT SELECT ON lk_accounts TO lk_reader WITH GRANT OPTION;
SET ROLE lk_reader;
GRANT SELECT ON lk_accounts TO lk_writer;
RESET ROLE;
REVOKE GRANT OPTION FOR SELECT ON lk_accounts FROM lk_reader;
GRANT TRUNCATE ON ALL TABLES IN SCHEMA public TO lk_reader;
SELECT relacl FROM pg_class WHERE oid = 'lk_accounts_login_lookup'::regclass;
REVOKE TRUNCATE ON ALL TABLES IN SCHEMA public FROM lk_reader;
-- REVOKE and OWNER TO on the table carry to its lookup and the lookup's shards
REVOKE INSERT, UPDATE, DELETE ON lk_accounts FROM lk_writer;
SET ROLE lk_writer;
INSERT INTO lk_accounts VALUES (5, 'dee');
RESET ROLE;
ALTER TABLE lk_accounts OWNER TO lk_writer;
SELECT relowner::regrole AS owner, relacl FROM pg_class WHERE oid = 'lk_accounts_login_lookup'::regclass;
SELECT (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(relacl) a)::text AS lookup_acl
  FROM pg_class WHERE oid = 'lk_accounts_login_lookup'::regclass \gset
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS checked1, count(*) FILTER (WHERE relowner <> 'lk_writer'::regrole OR (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(relacl) a)::text
                                                           IS DISTINCT FROM :'lookup_acl') AS wrong1
  FROM pg_class WHERE relname LIKE 'lk\_accounts\_login\_lookup\_%' AND relkind = 'r' \gset
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT count(*) AS checked2, count(*) FILTER (WHERE relowner <> 'lk_writer'::regrole OR (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(relacl) a)::text
                                                           IS DISTINCT FROM :'lookup_acl') AS wrong2
  FROM pg_class WHERE relname LIKE 'lk\_accounts\_login\_lookup\_%' AND relkind = 'r' \gset
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SELECT count(*) AS checked3, count(*) FILTER (WHERE relowner <> 'lk_writer'::regrole OR (SELECT array_agg(a::text ORDER BY a::text) FROM unnest(relacl) a)::text
                                                           IS DISTINCT FROM :'lookup_acl') AS wrong3
  FROM pg_class WHERE relname LIKE 'lk\_accounts\_login\_lookup\_%' AND relkind = 'r' \gset
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT :checked1 + :checked2 + :checked3 AS lookup_shards, :wrong1 + :wrong2 + :wrong3 AS wrong_owner_or_acl;
SELECT lk_differences('lk_accounts', 'login', 'id', 'lk_accounts_login_lookup') AS differences;
DROP TABLE lk_accounts;
DROP ROLE lk_owner, lk_writer, lk_reader;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
DROP ROLE lk_owner, lk_writer, lk_reader;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
DROP ROLE lk_owner, lk_writer, lk_reader;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
DROP ROLE lk_owner, lk_writer, lk_reader;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- drop_lookup drops the table and the shards' triggers
SELECT pg_shard.drop_lookup('lk_customers', 'region');
SELECT to_regclass('lk_customers_region_lookup') AS gone;
SELECT column_name FROM pg_shard.lookups WHERE table_name = 'lk_customers'::regclass;
INSERT INTO lk_customers VALUES (8000, 'after-drop@example.com', 'a', 99);
SELECT lk_differences('lk_customers', 'email', 'id', 'lk_customers_email_lookup') AS differences;
SELECT pg_shard.drop_lookup('lk_customers', 'email');
SELECT pg_shard.drop_lookup('lk_orders', 'email');
INSERT INTO lk_customers VALUES (8001, 'user300@example.com', 'no lookup, no uniqueness', 1);
SELECT count(*) AS lookups FROM pg_shard.lookup;
DROP FUNCTION lk_differences(regclass, text, text, regclass);
DROP FUNCTION lk_scans(text);
DROP TABLE lk_orders, lk_staging, lk_customers, lk_numbers;
