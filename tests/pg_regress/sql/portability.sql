-- values travel in a portable text form whatever the session's settings,
-- and names are schema-qualified whatever the search_path
CREATE SCHEMA app;
CREATE TYPE app.status AS ENUM ('new', 'paid');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE SCHEMA app;
CREATE TYPE app.status AS ENUM ('new', 'paid');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE SCHEMA app;
CREATE TYPE app.status AS ENUM ('new', 'paid');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SET search_path = app, public;
CREATE TABLE invoices (id int PRIMARY KEY, status status NOT NULL, due date,
                       late interval, ratio float8, raw bytea);
INSERT INTO invoices VALUES
    (1, 'new', '2026-03-04', '-1 day 02:03:04', 0.1, '\x00ff'),
    (2, 'paid', '2026-12-31', '1 year 2 mons', 1e-300, '\xdeadbeef'),
    (3, 'new', '2026-01-02', '-00:00:01.5', 2.0/3, '\x');
-- as they are, in the default settings
SELECT * FROM invoices ORDER BY id;
SET DateStyle = 'SQL, DMY';
SET IntervalStyle = 'sql_standard';
SET extra_float_digits = -3;
SET bytea_output = 'escape';
SELECT pg_shard.create_distributed_table('invoices', 'id', shard_count => 2);
RESET DateStyle;
RESET IntervalStyle;
RESET extra_float_digits;
RESET bytea_output;
RESET search_path;
SELECT shard_table, port FROM pg_shard.shards WHERE table_name = 'app.invoices'::regclass;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a
WHERE a.attrelid = (SELECT shard_rel FROM pg_shard.local_shard WHERE shard_rel::text LIKE 'app.invoices%')
  AND a.attnum > 0 ORDER BY a.attnum;
SELECT * FROM app.invoices_100119 ORDER BY id;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT * FROM app.invoices_100120 ORDER BY id;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- rows are matched by the key columns only (not INCLUDE columns), and values
-- travel in a fixed text form whatever the session's settings
CREATE TABLE plans (code text, note text, period interval, PRIMARY KEY (code) INCLUDE (note));
SELECT pg_shard.create_reference_table('plans');
SET IntervalStyle = 'sql_standard';
INSERT INTO plans VALUES ('basic', NULL, '-1 day -02:00:00'), ('pro', 'n', '1 mon');
RESET IntervalStyle;
UPDATE plans SET period = period * 2 WHERE code = 'basic';
DELETE FROM plans WHERE code = 'pro';
SELECT * FROM plans ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT * FROM plans_100121 ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
