-- Indexes, constraints, privileges, comments and TRUNCATE of distributed
-- and reference tables reach every shard table, or nothing changes; and
-- undistribute_table brings a table back to the metadata node.
CREATE TABLE so_orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, total numeric(10,2), status text,
                        PRIMARY KEY (customer_id, order_id));
INSERT INTO so_orders SELECT g % 50, g, g / 4.0, CASE WHEN g % 3 = 0 THEN 'paid' ELSE 'new' END
  FROM generate_series(1, 400) g;
SELECT pg_shard.create_distributed_table('so_orders', 'customer_id', shard_count => 4, colocate_with => 'none');
CREATE TABLE so_codes (code text PRIMARY KEY, label text, rank int);
INSERT INTO so_codes VALUES ('new', 'New', 1), ('paid', 'Paid', 2);
SELECT pg_shard.create_reference_table('so_codes');
-- On each worker: every shard table of a table and the indexes and
-- constraints it carries (shard id suffixes taken off); one row per
-- distinct set, with the number of shard tables that have it.
\set objects 'SELECT regexp_replace(t.relname, ''_[0-9]+$'', '''') AS tbl, x.objects, count(*) AS shards FROM pg_shard.local_shard s JOIN pg_class t ON t.oid = s.shard_rel CROSS JOIN LATERAL (SELECT string_agg(o, '', '' ORDER BY o) AS objects FROM (SELECT regexp_replace(c.relname, ''_[0-9]+$'', '''') || CASE WHEN i.indisunique THEN '' unique'' ELSE '''' END || CASE WHEN NOT i.indisvalid THEN '' INVALID'' ELSE '''' END AS o FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = t.oid UNION ALL SELECT conname || '' '' || pg_get_constraintdef(k.oid) FROM pg_constraint k WHERE k.conrelid = t.oid AND k.contype = ''c'') o) x WHERE t.relname ~ ''^so_(orders|codes)_'' GROUP BY 1, 2 ORDER BY 1, 2'
\set catalog 'SELECT kind, name, definition, unique_index FROM pg_shard.table_constraint WHERE table_rel = ''so_orders''::regclass ORDER BY name'
-- the primary key the table had is recorded
:catalog;
-- indexes: named, unnamed, on an expression, partial, unique with the
-- distribution column
CREATE INDEX so_orders_status ON so_orders (status);
CREATE INDEX ON so_orders (lower(status));
CREATE INDEX ON so_orders (total) WHERE status = 'paid';
CREATE UNIQUE INDEX so_orders_unique_total ON so_orders (customer_id, total, order_id);
CREATE INDEX IF NOT EXISTS so_orders_status ON so_orders (total);
-- constraints: CHECK (named, unnamed, NOT VALID then validated), UNIQUE
ALTER TABLE so_orders ADD CONSTRAINT so_total_positive CHECK (total > 0);
ALTER TABLE so_orders ADD CHECK (status <> '') NOT VALID;
ALTER TABLE so_orders VALIDATE CONSTRAINT so_orders_status_check;
ALTER TABLE so_orders ADD CONSTRAINT so_orders_status_key UNIQUE (customer_id, order_id, status);
:catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- column changes keep the recorded definitions true: a renamed column is
-- renamed in them, a dropped one takes its index along
ALTER TABLE so_orders ADD COLUMN note text;
CREATE INDEX so_orders_note ON so_orders (note, status);
ALTER TABLE so_orders RENAME COLUMN status TO state;
SELECT name, definition FROM pg_shard.table_constraint
 WHERE table_rel = 'so_orders'::regclass AND (name ~ 'note' OR definition ~ 'state') ORDER BY name;
ALTER TABLE so_orders RENAME COLUMN state TO status;
ALTER TABLE so_orders DROP COLUMN note;
SELECT count(*) AS note_index FROM pg_shard.table_constraint WHERE name = 'so_orders_note';
-- the shards enforce them
INSERT INTO so_orders VALUES (7, 7, -1, 'new');
INSERT INTO so_orders VALUES (7, 7, 1, 'new');
-- refused, with nothing changed: unique without the distribution column,
-- exclusion constraints, an existing index, constraint
-- changes mixed with column changes, two indexes in one DROP
CREATE UNIQUE INDEX so_orders_order_id ON so_orders (order_id);
ALTER TABLE so_orders ADD CONSTRAINT so_order_id_key UNIQUE (order_id);
ALTER TABLE so_orders ADD PRIMARY KEY (order_id);
ALTER TABLE so_orders ADD CONSTRAINT so_no_overlap EXCLUDE USING btree (customer_id WITH =);
ALTER TABLE so_orders ADD CONSTRAINT so_pk2 UNIQUE USING INDEX so_orders_status;
ALTER TABLE so_orders ADD CONSTRAINT so_small CHECK (total < 1000), ADD COLUMN extra int;
DROP INDEX so_orders_status, so_orders_lower_idx;
-- the name of an index is taken in the schema
CREATE INDEX so_codes_pkey ON so_orders (status);
-- a constraint that existing rows violate on one shard changes no shard
ALTER TABLE so_orders ADD CONSTRAINT so_total_small CHECK (total < 99);
:catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- dropping: an index, constraints, the primary key (and adding another)
DROP INDEX so_orders_lower_idx;
DROP INDEX IF EXISTS so_orders_no_such_index;
ALTER TABLE so_orders DROP CONSTRAINT so_orders_status_check, DROP CONSTRAINT so_orders_status_key;
ALTER TABLE so_orders DROP CONSTRAINT IF EXISTS so_no_such_constraint;
ALTER TABLE so_orders DROP CONSTRAINT so_orders_pkey;
ALTER TABLE so_orders ADD PRIMARY KEY (order_id, customer_id);
-- CONCURRENTLY: built shard by shard without blocking writes; one that
-- fails on a shard (division by zero for customer 5) is undone on every
-- shard; neither runs inside a transaction block
CREATE INDEX CONCURRENTLY so_orders_total_conc ON so_orders (total, status);
CREATE INDEX CONCURRENTLY so_orders_bad ON so_orders ((1 / (customer_id - 5)));
BEGIN;
CREATE INDEX CONCURRENTLY so_orders_in_block ON so_orders (status);
ROLLBACK;
DROP INDEX CONCURRENTLY so_orders_status;
:catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a reference table runs the statement itself; its copies follow
CREATE INDEX ON so_codes (label);
CREATE UNIQUE INDEX CONCURRENTLY so_codes_rank ON so_codes (rank);
ALTER TABLE so_codes ADD CONSTRAINT so_codes_rank_positive CHECK (rank > 0);
ALTER TABLE so_codes ADD UNIQUE (label, rank);
DROP INDEX so_codes_label_idx;
CREATE INDEX so_codes_lower_label ON so_codes (lower(label));
DROP INDEX CONCURRENTLY so_codes_lower_label;
\d so_codes
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- renaming indexes and constraints: the catalog (of a distributed table)
-- or the table itself (a reference table) and every shard's own object,
-- which keeps its shard id suffix
ALTER INDEX so_orders_total_conc RENAME TO so_orders_by_total;
ALTER INDEX so_orders_pkey RENAME TO so_orders_pk;
ALTER TABLE so_orders RENAME CONSTRAINT so_total_positive TO so_total_above_zero;
ALTER INDEX so_codes_rank RENAME TO so_codes_by_rank;
ALTER TABLE so_codes_by_rank RENAME TO so_codes_rank_order;
ALTER TABLE so_codes RENAME CONSTRAINT so_codes_rank_positive TO so_codes_rank_above_zero;
ALTER TABLE so_codes RENAME CONSTRAINT so_codes_pkey TO so_codes_pk;
-- refused, with nothing changed: names taken in the schema or by the
-- table, constraints that do not exist (a plain index is not one)
ALTER INDEX so_orders_by_total RENAME TO so_codes_pk;
ALTER INDEX so_orders_by_total RENAME TO so_orders_pk;
ALTER TABLE so_orders RENAME CONSTRAINT so_total_above_zero TO so_orders_pk;
ALTER TABLE so_orders RENAME CONSTRAINT so_orders_pk TO so_codes_rank_order;
ALTER TABLE so_orders RENAME CONSTRAINT so_no_such_check TO so_whatever;
ALTER TABLE so_orders RENAME CONSTRAINT so_orders_by_total TO so_whatever;
-- a constraint's index is not dropped on its own
DROP INDEX so_orders_pk;
:catalog;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- REINDEX rebuilds every shard's indexes (one shard at a time, each in its
-- own transaction); a reference table rebuilds its own and its copies'
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT array_agg(pg_relation_filenode(i.indexrelid)) AS before_nodes FROM pg_shard.local_shard s
  JOIN pg_class c ON c.oid = s.shard_rel JOIN pg_index i ON i.indrelid = c.oid WHERE c.relname ~ '^so_(orders|codes)_' \gset
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
REINDEX TABLE so_orders;
REINDEX (VERBOSE false) TABLE CONCURRENTLY so_codes;
REINDEX INDEX CONCURRENTLY so_orders_by_total;
REINDEX INDEX so_codes_pk;
-- refused, with nothing changed: tablespaces (per server), CONCURRENTLY in
-- a transaction block
REINDEX (TABLESPACE pg_default) TABLE so_orders;
BEGIN;
REINDEX TABLE CONCURRENTLY so_orders;
ROLLBACK;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) FILTER (WHERE pg_relation_filenode(i.indexrelid) = ANY (:'before_nodes'::oid[])) AS not_rebuilt,
       count(*) FILTER (WHERE NOT i.indisvalid) AS invalid, count(*) > 0 AS some_indexes
  FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel JOIN pg_index i ON i.indrelid = c.oid
 WHERE c.relname ~ '^so_(orders|codes)_';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a renamed index is dropped on every shard too
CREATE INDEX so_orders_scratch ON so_orders (status, total);
CREATE INDEX so_codes_scratch ON so_codes (label, rank);
ALTER INDEX so_orders_scratch RENAME TO so_orders_scratch_renamed;
ALTER INDEX so_codes_scratch RENAME TO so_codes_scratch_renamed;
DROP INDEX so_orders_scratch_renamed;
DROP INDEX so_codes_scratch_renamed;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS scratch_indexes FROM pg_class WHERE relname ~ '_scratch';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a moved shard keeps the indexes and constraints it had
SELECT s.shard_id AS moving_shard,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS moving_target
  FROM pg_shard.shards s WHERE s.table_name = 'so_orders'::regclass ORDER BY s.range_start LIMIT 1 \gset
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(:moving_shard, :moving_target) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
-- while a job of the table is queued, index and constraint changes wait:
-- refused
SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('copy'));
SELECT pg_shard.move_shard(:moving_shard, (SELECT min(node_id) FROM pg_shard.node n WHERE n.state = 'active'
  AND n.node_id <> (SELECT node_id FROM pg_shard.shards WHERE shard_id = :moving_shard))) AS job \gset
CREATE INDEX so_orders_during_move ON so_orders (status);
ALTER TABLE so_orders ADD CONSTRAINT so_during_move CHECK (total > -5);
DROP INDEX so_orders_by_total;
SELECT pg_shard.cancel_job(:job);
SELECT pg_advisory_unlock(hashtext('pg_shard job phase'), hashtext('copy'));
SELECT pg_shard.wait_job(:job, '2 minutes');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:objects;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- privileges and comments: roles must exist on every node
CREATE ROLE so_reader;
CREATE ROLE so_writer;
CREATE ROLE so_auditor;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE ROLE so_reader;
CREATE ROLE so_writer;
CREATE ROLE so_auditor;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE ROLE so_reader;
CREATE ROLE so_writer;
CREATE ROLE so_auditor;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE ROLE so_reader;
CREATE ROLE so_writer;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
GRANT SELECT ON so_orders, so_codes TO so_reader;
GRANT INSERT, UPDATE ON so_orders TO so_writer WITH GRANT OPTION;
REVOKE UPDATE ON so_orders FROM so_writer;
COMMENT ON TABLE so_orders IS 'orders by customer';
COMMENT ON COLUMN so_orders.total IS 'in euros';
COMMENT ON TABLE so_codes IS 'order states';
-- so_auditor does not exist on the third worker: nothing changes
GRANT SELECT ON so_codes TO so_auditor;
GRANT SELECT ON so_orders TO so_nobody;
-- column privileges are not carried to the shards yet
GRANT SELECT (total) ON so_orders TO so_writer;
SELECT relname, relacl, obj_description(oid, 'pg_class') FROM pg_class
 WHERE oid IN ('so_orders'::regclass, 'so_codes'::regclass) ORDER BY 1;
\set grants 'SELECT regexp_replace(t.relname, ''_[0-9]+$'', '''') AS tbl, t.relacl, obj_description(t.oid, ''pg_class'') AS comment, col_description(t.oid, 3) AS column_3, count(*) AS shards FROM pg_shard.local_shard s JOIN pg_class t ON t.oid = s.shard_rel WHERE t.relname ~ ''^so_(orders|codes)_'' GROUP BY 1, 2, 3, 4 ORDER BY 1'
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:grants;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:grants;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- TRUNCATE of a distributed, a reference and a local table together, with
-- RESTART IDENTITY; a role without the privilege is refused
CREATE TABLE so_local (id serial PRIMARY KEY, note text);
INSERT INTO so_local (note) VALUES ('a'), ('b');
CREATE SEQUENCE so_orders_seq OWNED BY so_orders.order_id;
SELECT nextval('so_orders_seq'), nextval('so_orders_seq');
SET ROLE so_reader;
TRUNCATE so_orders;
-- (schema changes of its own tables are no business of pg_shard's)
CREATE TEMPORARY TABLE so_mine (a int);
CREATE INDEX ON so_mine (a);
TRUNCATE so_mine;
RESET ROLE;
SELECT count(*) FROM so_orders;
TRUNCATE so_orders, so_codes, so_local RESTART IDENTITY;
SELECT (SELECT count(*) FROM so_orders) AS orders, (SELECT count(*) FROM so_codes) AS codes,
       (SELECT count(*) FROM so_local) AS local, nextval('so_orders_seq') AS orders_seq;
INSERT INTO so_local (note) VALUES ('c') RETURNING id;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
WITH shard_tables AS MATERIALIZED (
  SELECT s.shard_rel FROM pg_shard.local_shard s JOIN pg_class t ON t.oid = s.shard_rel
   WHERE t.relname ~ '^so_(orders|codes)_')
SELECT count(*) AS shard_tables,
       sum((xpath('/row/c/text()', query_to_xml(format('SELECT count(*) AS c FROM %s', shard_rel), false, true, '')))[1]::text::int) AS rows_left
  FROM shard_tables;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- undistribute_table: back to an ordinary table with every row, its
-- indexes, constraints, privileges and comments; the shards are dropped
INSERT INTO so_orders SELECT g % 50, g, g / 4.0, 'new' FROM generate_series(1, 300) g;
INSERT INTO so_codes VALUES ('new', 'New', 1);
SELECT count(*), sum(total), sum(order_id * customer_id) FROM so_orders;
SELECT pg_shard.map_version() AS version_before \gset
SELECT pg_shard.undistribute_table('so_orders');
SELECT pg_shard.undistribute_table('so_codes');
SELECT pg_shard.map_version() > :version_before AS new_map;
SELECT count(*), sum(total), sum(order_id * customer_id) FROM so_orders;
\d so_orders
SELECT relname, relkind, relacl, obj_description(oid, 'pg_class') FROM pg_class
 WHERE oid IN ('so_orders'::regclass, 'so_codes'::regclass) ORDER BY 1;
SELECT count(*) FROM pg_shard.logical_table WHERE table_rel IN ('so_orders'::regclass, 'so_codes'::regclass);
SELECT count(*) FROM pg_shard.table_constraint WHERE name LIKE 'so\_%';
INSERT INTO so_codes VALUES ('paid', 'Paid', 2);
-- an ordinary table cannot be undistributed
SELECT pg_shard.undistribute_table('so_orders');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS so_tables_left FROM pg_class WHERE relname ~ '^so_(orders|codes)_[0-9]+$';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SELECT count(*) AS so_tables_left FROM pg_class WHERE relname ~ '^so_(orders|codes)_[0-9]+$';
DROP ROLE so_reader, so_writer;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
DROP ROLE so_reader, so_writer, so_auditor;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
DROP ROLE so_reader, so_writer, so_auditor;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP TABLE so_orders, so_codes, so_local;
DROP ROLE so_reader, so_writer, so_auditor;
