-- Objects planted in a schema on the search_path are never run by pg_shard.
-- A role that may create objects in public (as a database owner can on
-- PostgreSQL 15) plants operators, functions and catalog views named like
-- the ones pg_shard's queries use (sql/include/plant.psql); the database's
-- search_path, and the caller's, put public first. Then a superuser
-- distributes, writes, changes, moves, splits and undistributes tables:
-- pg_shard's queries on every node (in the caller's backend, the job
-- runner, sessions on the workers) call none of the planted objects, and
-- names the caller wrote (colocate_with, COMMENT ON) still mean what they
-- mean in its search_path.
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE ROLE planter LOGIN;
GRANT CREATE ON SCHEMA public TO planter;
SET ROLE planter;
\set ECHO none
\i sql/include/plant.psql
\set ECHO all
RESET ROLE;
ALTER DATABASE pg_shard_regress SET search_path = public, pg_catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE ROLE planter LOGIN;
GRANT CREATE ON SCHEMA public TO planter;
SET ROLE planter;
\set ECHO none
\i sql/include/plant.psql
\set ECHO all
RESET ROLE;
ALTER DATABASE pg_shard_regress SET search_path = public, pg_catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE ROLE planter LOGIN;
GRANT CREATE ON SCHEMA public TO planter;
SET ROLE planter;
\set ECHO none
\i sql/include/plant.psql
\set ECHO all
RESET ROLE;
ALTER DATABASE pg_shard_regress SET search_path = public, pg_catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE ROLE planter LOGIN;
GRANT CREATE ON SCHEMA public TO planter;
SET ROLE planter;
\set ECHO none
\i sql/include/plant.psql
\set ECHO all
RESET ROLE;
ALTER DATABASE pg_shard_regress SET search_path = public, pg_catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- job runners start again, with the database's search_path
SET search_path = pg_catalog;
SELECT count(pg_terminate_backend(pid)) >= 0 AS runners_stopped FROM pg_stat_activity
  WHERE backend_type ~ '^pg_shard job runner';
-- the caller's search_path puts public first, too
SET search_path = public, pg_catalog;
SHOW search_path;
CREATE TABLE pl_items (id bigint PRIMARY KEY, v text);
INSERT INTO pl_items SELECT g, 'item ' || g FROM generate_series(1, 200) g;
SELECT pg_shard.create_distributed_table('pl_items', 'id', shard_count => 4, colocate_with => 'none');
CREATE TABLE pl_notes (id bigint NOT NULL, note text NOT NULL, PRIMARY KEY (id, note));
INSERT INTO pl_notes SELECT g, 'note ' || g FROM generate_series(1, 50) g;
SELECT pg_shard.create_distributed_table('pl_notes', 'id', colocate_with => 'pl_items');
CREATE TABLE pl_kinds (code text PRIMARY KEY, label text);
SELECT pg_shard.create_reference_table('pl_kinds');
INSERT INTO pl_kinds VALUES ('a', 'A'), ('b', 'B');
UPDATE pl_kinds SET label = upper(code);
INSERT INTO pl_items VALUES (1000, 'late');
UPDATE pl_items SET v = upper(v);
SELECT count(*), sum(id) FROM pl_items;
SELECT count(*) FROM pl_notes;
ALTER TABLE pl_items ADD COLUMN extra integer;
CREATE INDEX pl_items_v ON pl_items (v);
ALTER INDEX pl_items_v RENAME TO pl_items_by_v;
COMMENT ON TABLE pl_items IS 'planted objects test';
COMMENT ON COLUMN pl_items.v IS 'a value';
GRANT SELECT ON pl_items TO planter;
ALTER TABLE pl_items RENAME COLUMN extra TO spare;
-- a move and a split, by the job runner
SET search_path = pg_catalog;
SELECT s.shard_id AS pl_shard,
       (SELECT min(n.node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS pl_target
  FROM pg_shard.shards s WHERE s.table_name = 'public.pl_items'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET search_path = public, pg_catalog;
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(:pl_shard, :pl_target) AS pl_move \gset
SELECT pg_shard.wait_job(:pl_move, '2 minutes');
SELECT pg_shard.split_shard(:pl_shard) AS pl_split \gset
SELECT pg_shard.wait_job(:pl_split, '2 minutes');
SET search_path = pg_catalog;
SELECT kind, state, error FROM pg_shard.jobs WHERE job_id IN (:pl_move, :pl_split) ORDER BY job_id;
SET search_path = public, pg_catalog;
SELECT count(*), sum(id) FROM pl_items;
SELECT count(*) >= 0 AS planned FROM pg_shard.rebalance(dry_run => true);
SELECT pg_shard.recover_prepared_transactions() >= 0 AS recovered;
SELECT count(*) AS shards FROM pg_shard.shards;
TRUNCATE pl_notes;
SELECT pg_shard.undistribute_table('pl_notes');
SELECT count(*) FROM pl_notes;
DROP TABLE pl_items, pl_notes, pl_kinds;
-- the names the caller wrote meant its own tables
SET search_path = pg_catalog;
SELECT count(*) AS tables_left FROM pg_shard.logical_table WHERE table_rel::text ~ 'pl_';
-- none of the planted objects was called, on any node
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SET search_path = pg_catalog;
SELECT current_setting('port') AS node, count(*) AS planted_calls FROM public.plant_log;
SELECT DISTINCT what, called_by FROM public.plant_log ORDER BY 1, 2;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SET search_path = pg_catalog;
SELECT current_setting('port') AS node, count(*) AS planted_calls FROM public.plant_log;
SELECT DISTINCT what, called_by FROM public.plant_log ORDER BY 1, 2;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SET search_path = pg_catalog;
SELECT current_setting('port') AS node, count(*) AS planted_calls FROM public.plant_log;
SELECT DISTINCT what, called_by FROM public.plant_log ORDER BY 1, 2;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SET search_path = pg_catalog;
SELECT current_setting('port') AS node, count(*) AS planted_calls FROM public.plant_log;
SELECT DISTINCT what, called_by FROM public.plant_log ORDER BY 1, 2;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
ALTER DATABASE pg_shard_regress RESET search_path;
DROP OWNED BY planter;
DROP ROLE planter;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
ALTER DATABASE pg_shard_regress RESET search_path;
DROP OWNED BY planter;
DROP ROLE planter;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
ALTER DATABASE pg_shard_regress RESET search_path;
DROP OWNED BY planter;
DROP ROLE planter;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
ALTER DATABASE pg_shard_regress RESET search_path;
DROP OWNED BY planter;
DROP ROLE planter;
