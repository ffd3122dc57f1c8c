-- Tables owned by an ordinary role: their shard tables, copies and foreign
-- partitions belong to the same role, so the owner may use and change them
-- (and other roles only as granted); OWNER TO follows; moves keep it.
-- Roles are per server: they exist on every node, with the same rights on
-- the schema (CREATE INDEX needs CREATE there, on the workers too).
CREATE ROLE to_owner LOGIN;
CREATE ROLE to_other LOGIN;
GRANT CREATE ON SCHEMA public TO to_owner;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE ROLE to_owner LOGIN;
CREATE ROLE to_other LOGIN;
GRANT CREATE ON SCHEMA public TO to_owner;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE ROLE to_owner LOGIN;
CREATE ROLE to_other LOGIN;
GRANT CREATE ON SCHEMA public TO to_owner;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE ROLE to_owner LOGIN;
CREATE ROLE to_other LOGIN;
GRANT CREATE ON SCHEMA public TO to_owner;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE TABLE to_orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, total numeric,
                        PRIMARY KEY (customer_id, order_id));
CREATE TABLE to_states (code text PRIMARY KEY, label text);
ALTER TABLE to_orders OWNER TO to_owner;
ALTER TABLE to_states OWNER TO to_owner;
INSERT INTO to_orders SELECT g % 20, g, g FROM generate_series(1, 100) g;
SELECT pg_shard.create_distributed_table('to_orders', 'customer_id', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.create_reference_table('to_states');
-- the routing table's foreign partitions belong to the owner
SELECT DISTINCT pg_get_userbyid(c.relowner) AS partition_owner FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'to_orders'::regclass;
\set owners 'SELECT regexp_replace(c.relname, ''_[0-9]+$'', '''') AS tbl, pg_get_userbyid(c.relowner) AS owner, count(*) AS shard_tables FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel WHERE c.relname ~ ''^to_'' GROUP BY 1, 2 ORDER BY 1, 2'
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:owners;
-- as a router would: the owner reads and writes its shard tables
SELECT format('%I.%I', n.nspname, c.relname) AS some_shard FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel
  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname ~ '^to_orders_' ORDER BY 1 LIMIT 1 \gset
SET ROLE to_owner;
SELECT count(*) > 0 AS owner_reads FROM :some_shard;
UPDATE :some_shard SET total = total WHERE order_id < 10;
RESET ROLE;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- the owner changes its tables: columns, indexes, constraints, renames,
-- grants, writes to the reference table, TRUNCATE
SET ROLE to_owner;
ALTER TABLE to_orders ADD COLUMN note text;
CREATE INDEX to_orders_total ON to_orders (total);
ALTER INDEX to_orders_total RENAME TO to_orders_by_total;
ALTER TABLE to_orders ADD CONSTRAINT to_total_positive CHECK (total > 0);
ALTER TABLE to_states ADD COLUMN rank int;
CREATE INDEX to_states_rank ON to_states (rank);
INSERT INTO to_states VALUES ('new', 'New', 1), ('paid', 'Paid', 2);
UPDATE to_states SET rank = 3 WHERE code = 'paid';
GRANT SELECT ON to_orders, to_states TO to_other;
RESET ROLE;
SELECT kind, name FROM pg_shard.table_constraint WHERE table_rel = 'to_orders'::regclass ORDER BY name;
-- another role may read as granted, and change nothing
SET ROLE to_other;
SELECT pg_shard.map_version() AS version_before \gset
CREATE INDEX to_orders_note ON to_orders (note);
ALTER TABLE to_orders ADD CONSTRAINT to_note_known CHECK (note <> '');
ALTER TABLE to_orders DROP CONSTRAINT to_total_positive;
ALTER INDEX to_orders_by_total RENAME TO to_orders_hijacked;
DROP INDEX to_orders_by_total;
ALTER TABLE to_orders ADD COLUMN extra int;
ALTER TABLE to_orders OWNER TO to_other;
INSERT INTO to_states VALUES ('void', 'Void', 4);
TRUNCATE to_orders;
SELECT code, label, rank FROM to_states ORDER BY code;
RESET ROLE;
SELECT pg_shard.map_version() = :version_before AS same_map;
SELECT kind, name FROM pg_shard.table_constraint WHERE table_rel = 'to_orders'::regclass ORDER BY name;
\set objects 'SELECT regexp_replace(t.relname, ''_[0-9]+$'', '''') AS tbl, string_agg(DISTINCT regexp_replace(x.relname, ''_[0-9]+$'', ''''), '', '') AS indexes, bool_and(has_table_privilege(''to_other'', t.oid, ''SELECT'')) AS other_reads, bool_or(has_table_privilege(''to_other'', t.oid, ''INSERT'')) AS other_writes FROM pg_shard.local_shard s JOIN pg_class t ON t.oid = s.shard_rel LEFT JOIN pg_index i ON i.indrelid = t.oid LEFT JOIN pg_class x ON x.oid = i.indexrelid WHERE t.relname ~ ''^to_'' GROUP BY 1 ORDER BY 1'
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- OWNER TO reaches the shard tables, copies and partitions; a moved shard
-- keeps its owner
ALTER TABLE to_orders OWNER TO to_other;
ALTER TABLE to_states OWNER TO to_other;
ALTER TABLE to_orders OWNER TO to_owner, ADD COLUMN extra int;
SELECT DISTINCT pg_get_userbyid(c.relowner) AS partition_owner FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'to_orders'::regclass;
SELECT s.shard_id AS moving_shard,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS moving_target
  FROM pg_shard.shards s WHERE s.table_name = 'to_orders'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(:moving_shard, :moving_target) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT DISTINCT pg_get_userbyid(c.relowner) AS partition_owner FROM pg_inherits i
  JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'to_orders'::regclass;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:owners;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:owners;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:owners;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- the owner empties and drops its tables, shards and all
SET ROLE to_other;
TRUNCATE to_orders;
RESET ROLE;
SELECT count(*) AS rows_left FROM to_orders;
SET ROLE to_other;
DROP TABLE to_orders, to_states;
RESET ROLE;
SELECT count(*) AS catalog_rows FROM pg_shard.logical_table WHERE table_rel::text ~ '^to_';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS shard_tables FROM pg_class WHERE relname ~ '^to_(orders|states)_';
-- A role granted the DBA functions distributes, references and
-- undistributes the tables it owns, and only those; a role granted the job
-- functions moves and splits shards. Without a grant nothing runs, the
-- internal functions included; add_node stays with superusers.
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE TABLE to_not_theirs (id bigint PRIMARY KEY);
SET ROLE to_owner;
CREATE TABLE to_granted (id bigint PRIMARY KEY, v text);
INSERT INTO to_granted SELECT g, 'v' || g FROM generate_series(1, 50) g;
CREATE TABLE to_granted_ref (code int PRIMARY KEY, label text);
INSERT INTO to_granted_ref VALUES (1, 'one');
SELECT pg_shard.create_distributed_table('to_granted', 'id', shard_count => 2);
SELECT pg_shard.create_distributed_table_internal('to_granted'::regclass, 'id', 2, 'default');
SELECT pg_shard.move_shard(0, 1);
RESET ROLE;
GRANT EXECUTE ON FUNCTION pg_shard.create_distributed_table, pg_shard.create_reference_table,
    pg_shard.undistribute_table, pg_shard.move_shard, pg_shard.split_shard,
    pg_shard.cancel_job, pg_shard.add_node TO to_owner;
SET ROLE to_owner;
SELECT pg_shard.create_distributed_table('to_not_theirs', 'id');
SELECT pg_shard.add_node('127.0.0.1', 25324);
SELECT pg_shard.create_distributed_table('to_granted', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_reference_table('to_granted_ref');
INSERT INTO to_granted_ref VALUES (2, 'two');
ALTER TABLE to_granted RENAME COLUMN id TO key;
SELECT s.shard_id AS granted_shard FROM pg_shard.shard s JOIN pg_shard.shard_group g USING (shard_group_id)
 WHERE s.table_rel = 'to_granted'::regclass ORDER BY g.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.split_shard(:granted_shard) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SET client_min_messages = warning;
SELECT pg_shard.cancel_job(:job) AS canceled_after_done;
RESET client_min_messages;
RESET ROLE;
SELECT count(*) AS granted_shards FROM pg_shard.shards WHERE table_name = 'to_granted'::regclass;
SELECT dist_column FROM pg_shard.logical_table WHERE table_rel = 'to_granted'::regclass;
SELECT count(*) AS granted_rows, count(*) FILTER (WHERE key <= 50) AS old_rows FROM to_granted;
SELECT code, label FROM to_granted_ref ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
-- the ownership records: written for their owner, renamed column included;
-- another role's shard or table is refused
SELECT regexp_replace(c.relname, '_[0-9]+$', '') AS tbl, pg_get_userbyid(c.relowner) AS owner,
       s.dist_column, count(*) AS records
  FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel
 WHERE c.relname ~ '^to_granted' AND s.state = 'active' GROUP BY 1, 2, 3 ORDER BY 1;
SELECT s.shard_id AS their_shard, format('%I.%I', n.nspname, c.relname) AS own_shard
  FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relname ~ '^to_granted_ref' \gset
CREATE TABLE to_foreign_rel (id int);
SET ROLE to_owner;
CREATE TABLE to_own_rel (id int);
SELECT pg_shard.record_local_shard('to_foreign_rel'::regclass, 999999, NULL, 0, 0, 'active', 1);
\set VERBOSITY sqlstate
SELECT pg_shard.record_local_shard('to_own_rel'::regclass, :their_shard, NULL, 0, 0, 'active', 1);
\set VERBOSITY default
DELETE FROM pg_shard.local_shard;
RESET ROLE;
SELECT count(*) AS ref_records FROM pg_shard.local_shard WHERE shard_id = :their_shard;
DROP TABLE to_foreign_rel, to_own_rel;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SET ROLE to_owner;
SELECT pg_shard.undistribute_table('to_granted');
SELECT pg_shard.undistribute_table('to_granted_ref');
SELECT count(*) AS rows_back FROM to_granted;
SELECT count(*) AS refs_back FROM to_granted_ref;
DROP TABLE to_granted, to_granted_ref;
RESET ROLE;
REVOKE EXECUTE ON FUNCTION pg_shard.create_distributed_table, pg_shard.create_reference_table,
    pg_shard.undistribute_table, pg_shard.move_shard, pg_shard.split_shard,
    pg_shard.cancel_job, pg_shard.add_node FROM to_owner;
DROP TABLE to_not_theirs;
SELECT count(*) AS catalog_rows FROM pg_shard.logical_table WHERE table_rel::text ~ '^to_';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS shard_tables FROM pg_class WHERE relname ~ '^to_granted';
REVOKE CREATE ON SCHEMA public FROM to_owner;
DROP ROLE to_owner;
DROP ROLE to_other;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
REVOKE CREATE ON SCHEMA public FROM to_owner;
DROP ROLE to_owner;
DROP ROLE to_other;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
REVOKE CREATE ON SCHEMA public FROM to_owner;
DROP ROLE to_owner;
DROP ROLE to_other;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
REVOKE CREATE ON SCHEMA public FROM to_owner;
DROP ROLE to_owner;
DROP ROLE to_other;
