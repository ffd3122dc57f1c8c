-- Schema changes of distributed and reference tables run once on the
-- metadata node and reach every shard table, in the same transaction (two
-- phases); what cannot be carried to the shards yet is refused before
-- anything changes.
CREATE TABLE sc_items (id bigint PRIMARY KEY, v text);
INSERT INTO sc_items SELECT g, 'v' || g FROM generate_series(1, 200) g;
SELECT pg_shard.create_distributed_table('sc_items', 'id', shard_count => 4, colocate_with => 'none');
CREATE TABLE sc_codes (code text PRIMARY KEY, label text);
INSERT INTO sc_codes VALUES ('a', 'A'), ('b', 'B');
SELECT pg_shard.create_reference_table('sc_codes');
-- a column with a default: existing rows on the shards get it
ALTER TABLE sc_items ADD COLUMN note text NOT NULL DEFAULT 'n';
SELECT count(*), count(*) FILTER (WHERE note = 'n') AS with_default FROM sc_items;
-- defaults apply where rows are routed from (the metadata node)
ALTER TABLE sc_items ALTER COLUMN note SET DEFAULT 'm';
INSERT INTO sc_items (id, v) VALUES (201, 'new');
SELECT id, note FROM sc_items WHERE id IN (1, 201) ORDER BY id;
ALTER TABLE sc_items RENAME COLUMN note TO remark;
ALTER TABLE sc_items ALTER COLUMN remark TYPE varchar(20), ALTER COLUMN remark DROP NOT NULL;
UPDATE sc_items SET remark = NULL WHERE id = 2;
ALTER TABLE sc_items ADD COLUMN qty integer, DROP COLUMN v;
UPDATE sc_items SET qty = id * 2 WHERE id <= 10;
SELECT id, remark, qty FROM sc_items WHERE id IN (1, 2, 201) ORDER BY id;
ALTER TABLE sc_codes ADD COLUMN rank int DEFAULT 0;
ALTER TABLE sc_codes RENAME COLUMN label TO title;
INSERT INTO sc_codes VALUES ('c', 'C', 3);
SELECT * FROM sc_codes ORDER BY code;
-- every shard table has the metadata node's columns, in its order
SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END,
                  ', ' ORDER BY attnum) AS items_layout
  FROM pg_attribute WHERE attrelid = 'sc_items'::regclass AND attnum > 0 AND NOT attisdropped \gset
SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN ' not null' ELSE '' END,
                  ', ' ORDER BY attnum) AS codes_layout
  FROM pg_attribute WHERE attrelid = 'sc_codes'::regclass AND attnum > 0 AND NOT attisdropped \gset
SELECT :'items_layout' AS items, :'codes_layout' AS codes;
\set layouts 'SELECT c.relname ~ ''^sc_items'' AS items, count(*) AS shards, count(*) FILTER (WHERE l = CASE WHEN c.relname ~ ''^sc_items'' THEN :''items_layout'' ELSE :''codes_layout'' END) AS same FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel CROSS JOIN LATERAL (SELECT string_agg(attname || '' '' || format_type(atttypid, atttypmod) || CASE WHEN attnotnull THEN '' not null'' ELSE '''' END, '', '' ORDER BY attnum) AS l FROM pg_attribute WHERE attrelid = c.oid AND attnum > 0 AND NOT attisdropped) x WHERE c.relname ~ ''^sc_(items|codes)'' GROUP BY 1 ORDER BY 1'
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:layouts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:layouts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:layouts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- renaming the table: the shards keep their names, routers get a new map
SELECT pg_shard.map_version() AS version_before \gset
ALTER TABLE sc_items RENAME TO sc_things;
SELECT pg_shard.map_version() = :version_before + 1 AS new_map, count(*) FROM sc_things;
ALTER TABLE sc_things RENAME TO sc_items;
-- renaming the distribution column: shard tables, their guards and
-- ownership records, the catalog and the map follow
ALTER TABLE sc_items RENAME COLUMN id TO ident;
SELECT pg_shard.map_version() = :version_before + 3 AS new_map, dist_column
  FROM pg_shard.logical_table WHERE table_rel = 'sc_items'::regclass;
INSERT INTO sc_items (ident, remark) VALUES (203, 'renamed');
SELECT ident, remark FROM sc_items WHERE ident IN (1, 203) ORDER BY ident;
\set guards 'SELECT count(*) AS shards, count(*) FILTER (WHERE s.dist_column = ''ident'') AS records, count(*) FILTER (WHERE pg_get_triggerdef(g.oid) LIKE ''%shard_guard_row(''''ident''''%'') AS guards FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel JOIN pg_trigger g ON g.tgrelid = c.oid AND g.tgname = ''pg_shard_guard_row'' WHERE c.relname ~ ''^sc_items_'''
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:guards;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:guards;
-- a row for another shard's range is still refused by the guard
SELECT format('%I.%I', n.nspname, c.relname) AS some_shard FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel
  JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relname ~ '^sc_items_' LIMIT 1 \gset
INSERT INTO :some_shard (ident) SELECT g FROM generate_series(1000, 1100) g;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
ALTER TABLE sc_items RENAME COLUMN ident TO id;
-- moving the table to another schema: the shards stay, routers get a new
-- map; the indexes recorded for it (its primary key) must be free there
CREATE SCHEMA sc_other;
CREATE TABLE sc_other.sc_blocker (a int);
CREATE INDEX sc_items_pkey ON sc_other.sc_blocker (a);
SELECT pg_shard.map_version() AS version_before \gset
ALTER TABLE sc_items SET SCHEMA sc_other;
SELECT pg_shard.map_version() = :version_before AS same_map;
DROP TABLE sc_other.sc_blocker;
ALTER TABLE sc_items SET SCHEMA sc_other;
ALTER TABLE sc_codes SET SCHEMA sc_other;
SELECT pg_shard.map_version() = :version_before + 2 AS new_map, count(*) FROM sc_other.sc_items;
INSERT INTO sc_other.sc_items (id, remark) VALUES (204, 'moved');
SELECT id, remark FROM sc_other.sc_items WHERE id = 204;
SELECT table_rel FROM pg_shard.logical_table WHERE table_rel::text ~ '^sc_other' ORDER BY 1;
ALTER TABLE sc_other.sc_items SET SCHEMA public;
ALTER TABLE sc_other.sc_codes SET SCHEMA public;
DROP SCHEMA sc_other;
-- refused, with nothing changed: the distribution column, constraints on
-- a new column, and actions not carried to the shards yet
SELECT pg_shard.map_version() AS version_before \gset
ALTER TABLE sc_items DROP COLUMN id;
ALTER TABLE sc_items ALTER COLUMN id TYPE integer;
ALTER TABLE sc_items ADD COLUMN code text REFERENCES sc_codes;
ALTER TABLE sc_items ENABLE ROW LEVEL SECURITY;
ALTER TABLE sc_items ADD COLUMN extra int, ALTER COLUMN id TYPE integer;
SELECT attname FROM pg_attribute WHERE attrelid = 'sc_items'::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum;
SELECT pg_shard.map_version() = :version_before AS same_map;
-- storage parameters and statistics settings reach every shard table (the
-- metadata node's partitioned table holds no storage parameters); a bad
-- one changes nothing
ALTER TABLE sc_items SET (fillfactor = 80, autovacuum_vacuum_scale_factor = 0.02);
ALTER TABLE sc_items RESET (fillfactor);
ALTER TABLE sc_items ALTER COLUMN remark SET STATISTICS 500;
ALTER TABLE sc_items ALTER COLUMN remark SET (n_distinct = -0.5);
ALTER TABLE sc_codes SET (fillfactor = 70);
\set VERBOSITY terse
ALTER TABLE sc_items SET (no_such_parameter = 1);
ALTER TABLE sc_items SET (fillfactor = 5);
\set VERBOSITY default
ALTER TABLE sc_items SET (fillfactor = 90), ADD COLUMN extra int;
SELECT reloptions FROM pg_class WHERE oid = 'sc_codes'::regclass;
\set settings 'SELECT regexp_replace(c.relname, ''_[0-9]+$'', '''') AS tbl, c.reloptions, (SELECT string_agg(a.attname || '' '' || a.attstattarget || coalesce('' '' || (SELECT string_agg(o, '','') FROM unnest(a.attoptions) o WHERE o LIKE ''n_distinct%''), ''''), ''; '' ORDER BY a.attnum) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attstattarget >= 0) AS columns, count(*) AS shard_tables FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel WHERE c.relname ~ ''^sc_(items|codes)_'' GROUP BY 1, 2, 3 ORDER BY 1'
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:settings;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a failure on a shard (here: a value that does not fit the new type on
-- one node) changes no node
UPDATE sc_items SET remark = 'much too long' WHERE id = 3;
\set VERBOSITY terse
ALTER TABLE sc_items ALTER COLUMN remark TYPE varchar(2);
\set VERBOSITY default
SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'sc_items'::regclass AND attname = 'remark';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:layouts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:layouts;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- while a shard of the table moves, schema changes wait for it: refused
SELECT s.shard_id AS moving_shard,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS moving_target
  FROM pg_shard.shards s WHERE s.table_name = 'sc_items'::regclass ORDER BY s.range_start LIMIT 1 \gset
SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('copy'));
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.move_shard(:moving_shard, :moving_target) AS job \gset
ALTER TABLE sc_items ADD COLUMN during_move int;
SELECT pg_shard.cancel_job(:job);
SELECT pg_advisory_unlock(hashtext('pg_shard job phase'), hashtext('copy'));
SELECT pg_shard.wait_job(:job, '2 minutes');
-- after a round of changes (a dropped column included) a shard still moves
-- (logical replication matches the columns by name)
SELECT pg_shard.move_shard(:moving_shard, :moving_target) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT count(*), sum(qty) FROM sc_items;
INSERT INTO sc_items (id, remark, qty) VALUES (202, 'after', 7);
SELECT id, remark, qty FROM sc_items WHERE id = 202;
-- the moved shard kept its settings
SELECT port AS target_port FROM pg_shard.node WHERE node_id = :moving_target \gset
\c pg_shard_regress - 127.0.0.1 :target_port
SELECT count(*) AS moved_shard_here FROM pg_shard.local_shard s JOIN pg_class c ON c.oid = s.shard_rel
 WHERE c.relname = (SELECT 'sc_items_' || :moving_shard);
:settings;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP TABLE sc_items, sc_codes;
