-- Reference tables: a full copy on every worker; the metadata node keeps its rows.
CREATE TABLE countries (code text PRIMARY KEY, name text NOT NULL);
INSERT INTO countries VALUES ('DE', 'Germany'), ('FR', 'France'), ('NL', 'Netherlands');
SELECT pg_shard.create_reference_table('countries');
SELECT shard_id, shard_table, range_start, range_end, node_id, port, state
FROM pg_shard.shards WHERE table_name = 'countries'::regclass;
SELECT * FROM countries ORDER BY code;
SELECT table_rel, kind, dist_column FROM pg_shard.logical_table WHERE kind = 'reference';

\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT * FROM countries_100068 ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT * FROM countries_100068 ORDER BY code;
SELECT shard_rel, dist_column, range_start, range_end, state FROM pg_shard.local_shard WHERE shard_id = 100068;

-- a second reference table shares the reference group
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE TABLE currencies (code char(3) PRIMARY KEY, country text);
INSERT INTO currencies VALUES ('EUR', 'DE');
SELECT pg_shard.create_reference_table('currencies');
SELECT count(DISTINCT colocation_id) AS reference_groups FROM pg_shard.logical_table WHERE kind = 'reference';

-- a node added later receives a copy of every reference table, and the map changes
SELECT pg_shard.map_version() AS version_before \gset
SELECT pg_shard.add_node('127.0.0.1', 25323);
SELECT pg_shard.map_version() = :version_before + 1 AS map_bumped;
SELECT table_name, shard_table, node_id, port FROM pg_shard.shards
WHERE table_name IN ('countries'::regclass, 'currencies'::regclass) ORDER BY table_name::oid, node_id;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SELECT * FROM countries_100068 ORDER BY code;
SELECT * FROM currencies_100069;
-- distributed tables did not move to the new node
SELECT count(*) AS shard_tables FROM pg_shard.local_shard;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- writes on the metadata node reach every copy in the same transaction;
-- reads are served locally
INSERT INTO countries VALUES ('ES', 'Spain'), ('IT', 'Italy');
UPDATE countries SET name = 'Deutschland' WHERE code = 'DE';
DELETE FROM countries WHERE code = 'FR';
BEGIN;
INSERT INTO countries VALUES ('XX', 'rolled back');
ROLLBACK;
EXPLAIN (COSTS OFF) SELECT * FROM countries WHERE code = 'DE';
SELECT * FROM countries ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT * FROM countries_100068 ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SELECT * FROM countries_100068 ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
COPY countries FROM stdin;
PT	Portugal
\.
TRUNCATE currencies;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT * FROM countries_100068 WHERE code = 'PT';
SELECT count(*) AS currencies_left FROM currencies_100069;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
INSERT INTO currencies VALUES ('EUR', 'DE');

