-- Rows into distributed tables: a table's own rows when it is distributed,
-- and COPY … FROM, which the metadata node parses (defaults evaluated
-- there) and streams to the shards, every node at once, in the
-- transaction's remote transactions.

-- rows a table holds when it is distributed reach their shards whole:
-- COPY's special characters, NULLs, a dropped column, a domain key, and
-- rows written earlier in the same transaction
-- (types are not propagated: the domain is made on every node)
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE DOMAIN public.cp_account_id AS bigint CHECK (VALUE > 0);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE DOMAIN public.cp_account_id AS bigint CHECK (VALUE > 0);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE DOMAIN public.cp_account_id AS bigint CHECK (VALUE > 0);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE DOMAIN public.cp_account_id AS bigint CHECK (VALUE > 0);
CREATE TABLE cp_notes (id cp_account_id, gone int, body text, tags text[]);
ALTER TABLE cp_notes DROP COLUMN gone;
ALTER TABLE cp_notes REPLICA IDENTITY FULL;
INSERT INTO cp_notes SELECT i, 'row ' || i, ARRAY['t' || i] FROM generate_series(1, 500) i;
INSERT INTO cp_notes VALUES (501, E'tab\there\nnew line\\backslash\rreturn', '{"a b","c,d",NULL}'),
                            (502, NULL, NULL), (503, '\N', '{}');
BEGIN;
INSERT INTO cp_notes VALUES (504, 'written in the same transaction', NULL);
SELECT count(*), md5(string_agg(format('%s|%s|%s', id, body, tags), ',' ORDER BY id)) FROM cp_notes;
SELECT pg_shard.create_distributed_table('cp_notes', 'id', shard_count => 4);
COMMIT;
-- the same rows, now read from the shards
SELECT count(*), md5(string_agg(format('%s|%s|%s', id, body, tags), ',' ORDER BY id)) FROM cp_notes;
SELECT id, body, tags FROM cp_notes WHERE id > 500 ORDER BY id;
SELECT count(*) AS left_on_metadata_node FROM ONLY cp_notes;

-- rows whose column types all have a portable binary form travel in COPY's
-- binary format (the others above as text): every such type, edge values,
-- NULLs, and text in the database's encoding even when the session's
-- client encoding is another (rows go in the database's encoding, not the session's)
CREATE TABLE cp_kinds (id int PRIMARY KEY, b bool, s smallint, big bigint, f4 real, f8 double precision,
                       n numeric, o oid, t text, vc varchar(20), c char(5), nm name, raw bytea,
                       d date, tm time, tz timetz, ts timestamp, tstz timestamptz,
                       iv interval, u uuid);
INSERT INTO cp_kinds VALUES
  (1, true, -32768, -9223372036854775808, 'NaN', '-Infinity', 'NaN', 4294967295,
   E'tab\there\nline\\ é ✓', 'vc', 'ab', 'a name', '\x00ff10', '-infinity', '24:00:00',
   '23:59:59.999999+14', 'infinity', '2026-12-04 12:34:56.789012+05:30', '-178000000 years',
   'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'),
  (2, false, 32767, 9223372036854775807, '-0', '1e-320', '-123456789012345678901234567890.000000000000000000001',
   0, '', '', '', '', '', '4713-11-24 BC', '00:00', '00:00-15:59', '294276-12-31 23:59:59.999999',
   '-infinity', '1 mon -2 days 00:00:00.000001', '00000000-0000-0000-0000-000000000000'),
  (3, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL);
INSERT INTO cp_kinds (id, f4, f8, n, t) SELECT i, i / 7.0, i / 3.0, i / 11.0, repeat('x', i * 50)
  FROM generate_series(4, 300) i;
CREATE TEMP TABLE cp_kinds_before AS
  SELECT md5(string_agg(k::text, ',' ORDER BY id)) AS rows, count(*) FROM cp_kinds k;
SET client_encoding TO 'LATIN1';
SELECT pg_shard.create_distributed_table('cp_kinds', 'id', shard_count => 4);
RESET client_encoding;
SELECT md5(string_agg(k::text, ',' ORDER BY id)) = (SELECT rows FROM cp_kinds_before) AS same_rows,
       count(*) FROM cp_kinds k;
SELECT id, t, c, octet_length(c::text) AS c_octets, nm, raw, f4, f8, tz, iv FROM cp_kinds WHERE id <= 3 ORDER BY id;
-- COPY … FROM into it goes binary too: the same rows again under new ids
CREATE TEMP TABLE cp_kinds_file AS SELECT * FROM cp_kinds WHERE id <= 300;
UPDATE cp_kinds_file SET id = id + 1000;
COPY cp_kinds_file TO '/tmp/pg_shard_regress_cp_kinds.txt';
SET client_encoding TO 'LATIN1';
COPY cp_kinds FROM '/tmp/pg_shard_regress_cp_kinds.txt' WITH (ENCODING 'UTF8');
RESET client_encoding;
SELECT count(*) AS copied, bool_and(to_jsonb(x) - 'id' = to_jsonb(y) - 'id') AS same_values
FROM cp_kinds x JOIN cp_kinds y ON y.id = x.id + 1000;

-- COPY … FROM STDIN: every row on its shard, defaults (a sequence too)
-- evaluated on the metadata node, the command tag counts the rows
CREATE SEQUENCE cp_serial START 1000;
CREATE TABLE cp_orders (id bigint PRIMARY KEY, seq bigint DEFAULT nextval('cp_serial'),
                        placed date, amount numeric(10,2) CHECK (amount >= 0),
                        note text DEFAULT 'none');
SELECT pg_shard.create_distributed_table('cp_orders', 'id', shard_count => 6);
COPY cp_orders (id, placed, amount) FROM STDIN;
1	2026-01-02	10.50
2	2026-02-03	\N
3	2026-03-04	0
4	\N	99999999.99
\.
COPY cp_orders (id, note, amount) FROM STDIN WITH (FORMAT csv, HEADER true);
id,note,amount
5,"comma, and ""quotes""",1
6,,2
7,"multi
line",3
\.
SELECT * FROM cp_orders ORDER BY id;
-- the rows are on the shards that own them (the guards checked each one),
-- spread over the workers, and nothing stays prepared
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT sum((xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %s', shard_rel),
                                                 false, true, '')))[1]::text::int) AS rows_here
FROM pg_shard.local_shard WHERE shard_rel::text LIKE 'cp_orders%';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT sum((xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %s', shard_rel),
                                                 false, true, '')))[1]::text::int) AS rows_here
FROM pg_shard.local_shard WHERE shard_rel::text LIKE 'cp_orders%';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SELECT sum((xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %s', shard_rel),
                                                 false, true, '')))[1]::text::int) AS rows_here
FROM pg_shard.local_shard WHERE shard_rel::text LIKE 'cp_orders%';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- dates are read as the session's DateStyle says, whatever the workers'
SET DateStyle = 'SQL, DMY';
COPY cp_orders (id, placed, amount) FROM STDIN;
8	04/03/2026	1
\.
RESET DateStyle;
SELECT id, placed FROM cp_orders WHERE id = 8;

-- a bad row names its line, and nothing is written anywhere
COPY cp_orders (id, amount) FROM STDIN;
20	1
21	one
22	3
\.
COPY cp_orders (id, amount) FROM STDIN;
23	1
\N	2
\.
-- a row a worker refuses (a duplicate key, a CHECK) rolls back every node
COPY cp_orders (id, amount) FROM STDIN;
24	1
25	1
1	1
\.
COPY cp_orders (id, amount) FROM STDIN;
26	1
27	-1
\.
-- named by its line as PostgreSQL's COPY names it (a header and a quoted
-- value's newline count)
COPY cp_orders (id, amount, note) FROM STDIN (FORMAT csv, HEADER);
id,amount,note
28,1,"two
lines"
29,1,plain
1,1,dup
\.
SELECT count(*), max(id) FROM cp_orders;
SELECT count(*) AS prepared FROM pg_prepared_xacts;

-- in a transaction block: later statements read the copied rows, and a
-- rollback removes them from every node
BEGIN;
COPY cp_orders (id, amount) FROM STDIN;
30	1
31	1
32	1
33	1
\.
SELECT count(*) FROM cp_orders WHERE id >= 30;
SELECT amount FROM cp_orders WHERE id = 31;
ROLLBACK;
SELECT count(*) FROM cp_orders WHERE id >= 30;
BEGIN;
COPY cp_orders (id, amount) FROM STDIN;
30	1
31	1
\.
SAVEPOINT before_more;
COPY cp_orders (id, amount) FROM STDIN;
32	1
\.
ROLLBACK TO SAVEPOINT before_more;
COMMIT;
SELECT id FROM cp_orders WHERE id >= 30 ORDER BY id;

-- COPY … WHERE goes through the foreign partitions (the path before)
COPY cp_orders (id, amount) FROM STDIN WHERE id > 40;
40	1
41	1
\.
SELECT id FROM cp_orders WHERE id >= 40 ORDER BY id;

-- privileges: INSERT on the table is needed (no password mapping), and a
-- server file needs pg_read_server_files
CREATE ROLE cp_writer LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE ROLE cp_writer LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE ROLE cp_writer LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE ROLE cp_writer LOGIN;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SET ROLE cp_writer;
COPY cp_orders (id, amount) FROM STDIN;
50	1
\.
COPY cp_orders (id, amount) FROM '/dev/null';
RESET ROLE;
GRANT INSERT ON cp_orders TO cp_writer;
GRANT USAGE ON SEQUENCE cp_serial TO cp_writer;
SET ROLE cp_writer;
COPY cp_orders (id, amount) FROM STDIN;
50	1
51	2
\.
RESET ROLE;
SELECT id, amount FROM cp_orders WHERE id >= 50 ORDER BY id;
REVOKE ALL ON cp_orders FROM cp_writer;
REVOKE ALL ON SEQUENCE cp_serial FROM cp_writer;
DROP ROLE cp_writer;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
DROP ROLE cp_writer;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
DROP ROLE cp_writer;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
DROP ROLE cp_writer;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- (dropped: later suites count the cluster's placements)
DROP TABLE cp_orders, cp_notes;
DROP SEQUENCE cp_serial;

-- a row that a node refuses while a reference table's rows are copied to
-- every node is named by its row in the table (not by how many copies of
-- rows were sent), and no node keeps any: the third node's enum lacks a
-- label
CREATE TYPE cp_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE TYPE cp_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE TYPE cp_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE TYPE cp_mood AS ENUM ('calm');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE TABLE cp_moods (id int PRIMARY KEY, mood cp_mood NOT NULL);
INSERT INTO cp_moods SELECT g, (CASE WHEN g = 2500 THEN 'cross' ELSE 'calm' END)::cp_mood FROM generate_series(1, 3000) g;
SELECT pg_shard.create_reference_table('cp_moods');
SELECT count(*) AS logical_tables FROM pg_shard.logical_table WHERE table_rel = 'cp_moods'::regclass;
SELECT count(*) AS rows_kept FROM cp_moods;
DROP TABLE cp_moods;
DROP TYPE cp_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS shard_tables FROM pg_class WHERE relname LIKE 'cp\_moods\_%';
DROP TYPE cp_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
DROP TYPE cp_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
DROP TYPE cp_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
