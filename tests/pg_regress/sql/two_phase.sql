-- Writes that reach several nodes commit on all or none: the metadata node
-- prepares every remote transaction before its own commit and commits them
-- after it (two-phase commit), and ends the ones a crash left prepared.
CREATE TABLE tp_ref (id int PRIMARY KEY, v text NOT NULL);
SELECT pg_shard.create_reference_table('tp_ref');
SELECT shard_table AS tp_copy FROM pg_shard.shards WHERE table_name = 'tp_ref'::regclass LIMIT 1 \gset
SELECT count(*) AS copies FROM pg_shard.shards WHERE table_name = 'tp_ref'::regclass;
-- the second worker refuses a row at commit time (a deferred constraint
-- trigger, run by PREPARE TRANSACTION), after the first has prepared it
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE FUNCTION tp_refuse() RETURNS trigger LANGUAGE plpgsql
    AS $$ BEGIN RAISE EXCEPTION 'tp_ref refuses %', NEW.v; END $$;
CREATE CONSTRAINT TRIGGER tp_refuse AFTER INSERT ON :tp_copy DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW WHEN (NEW.v = 'refuse') EXECUTE FUNCTION tp_refuse();
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
INSERT INTO tp_ref VALUES (1, 'ok');
\set VERBOSITY terse
INSERT INTO tp_ref VALUES (2, 'refuse');
\set VERBOSITY default
-- nothing of the refused write anywhere, nothing left prepared
SELECT id, v FROM tp_ref ORDER BY id;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT id, v FROM :tp_copy ORDER BY id;
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT id, v FROM :tp_copy ORDER BY id;
SELECT count(*) AS prepared FROM pg_prepared_xacts;
DROP TRIGGER tp_refuse ON :tp_copy;
DROP FUNCTION tp_refuse();
-- A crash between the phases, staged: remote transactions left prepared on
-- a worker, one of a local transaction that committed (its record exists),
-- one of a local transaction that rolled back (no record). The recovery
-- commits the first and rolls back the second.
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
BEGIN;
SELECT pg_shard.gid_prefix() || txid_current() || '_0_1' AS aborted_gid \gset
ROLLBACK;
BEGIN;
SELECT pg_shard.gid_prefix() || txid_current() || '_0_2' AS committed_gid \gset
INSERT INTO pg_shard.remote_transaction (gid, node_id) VALUES (:'committed_gid', 1);
COMMIT;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
BEGIN;
INSERT INTO :tp_copy VALUES (10, 'committed by the recovery');
PREPARE TRANSACTION :'committed_gid';
BEGIN;
INSERT INTO :tp_copy VALUES (11, 'rolled back by the recovery');
PREPARE TRANSACTION :'aborted_gid';
SELECT count(*) AS prepared FROM pg_prepared_xacts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT pg_shard.recover_prepared_transactions() AS ended;
SELECT count(*) AS records_left FROM pg_shard.remote_transaction;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT id, v FROM :tp_copy ORDER BY id;
SELECT count(*) AS prepared FROM pg_prepared_xacts;
DELETE FROM :tp_copy WHERE id = 10;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP TABLE tp_ref;
