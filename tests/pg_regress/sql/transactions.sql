-- pg_shard functions inside transactions: the workers' changes commit and
-- roll back with the metadata node's transaction.
CREATE TABLE tx_table (id bigint PRIMARY KEY, v text);
INSERT INTO tx_table SELECT g, 'v' || g FROM generate_series(1, 50) g;
SELECT pg_shard.map_version() AS version_before \gset

-- a transaction that distributes a table and then rolls back leaves nothing
BEGIN;
SELECT pg_shard.create_distributed_table('tx_table', 'id', shard_count => 2);
SELECT count(*) AS shards_inside FROM pg_shard.shards WHERE table_name = 'tx_table'::regclass;
ROLLBACK;
SELECT count(*) AS shards_after FROM pg_shard.shard WHERE table_rel = 'tx_table'::regclass;
SELECT count(*) AS rows_local FROM tx_table;
SELECT pg_shard.map_version() = :version_before AS version_unchanged;

-- rolling back to a savepoint undoes the workers' part of it too (their
-- remote transactions roll back to savepoints of their own)
BEGIN;
SAVEPOINT before_distribution;
SELECT pg_shard.create_distributed_table('tx_table', 'id', shard_count => 2);
ROLLBACK TO SAVEPOINT before_distribution;
COMMIT;
SELECT count(*) AS shards_after FROM pg_shard.shard WHERE table_rel = 'tx_table'::regclass;
SELECT count(*) AS rows_local FROM tx_table;
-- (the workers rolled back to the savepoint too: no shard table left)
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS shard_tables_worker1 FROM pg_class WHERE relname LIKE 'tx\_table\_%';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT count(*) AS shard_tables_worker2 FROM pg_class WHERE relname LIKE 'tx\_table\_%';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- an unrelated savepoint rolled back after the distribution does not matter
BEGIN;
SAVEPOINT distribution;
SELECT pg_shard.create_distributed_table('tx_table', 'id', shard_count => 2);
RELEASE SAVEPOINT distribution;
SAVEPOINT unrelated;
SELECT 1 / 0;
ROLLBACK TO SAVEPOINT unrelated;
COMMIT;
SELECT count(*) AS shards_after FROM pg_shard.shard WHERE table_rel = 'tx_table'::regclass;
SELECT count(*) AS rows_left_local FROM ONLY tx_table;
SELECT pg_shard.map_version() = :version_before + 1 AS version_bumped_once;

-- the workers hold exactly the shards of the committed attempt, and all rows
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT relname, (xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM %I', relname), false, true, '')))[1]::text::int AS rows
FROM pg_class WHERE relname LIKE 'tx_table%' AND relkind = 'r' ORDER BY relname;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT relname, (xpath('/row/n/text()', query_to_xml(format('SELECT count(*) AS n FROM %I', relname), false, true, '')))[1]::text::int AS rows
FROM pg_class WHERE relname LIKE 'tx_table%' AND relkind = 'r' ORDER BY relname;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'

-- rows must be moved under READ COMMITTED: an older snapshot could miss some
CREATE TABLE tx_rr (id bigint PRIMARY KEY);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT pg_shard.create_distributed_table('tx_rr', 'id');
ROLLBACK;
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT pg_shard.create_reference_table('tx_rr');
ROLLBACK;

-- PREPARE TRANSACTION cannot carry work on the workers along
BEGIN;
SELECT pg_shard.create_distributed_table('tx_rr', 'id', shard_count => 2);
PREPARE TRANSACTION 'pg_shard_regress_prepare';
SELECT count(*) AS tx_rr_shards FROM pg_shard.shard WHERE table_rel = 'tx_rr'::regclass;
