-- Foreign keys of distributed tables: to a co-located table on the
-- distribution column, and to reference tables. Each shard table's key
-- points at the referenced shard on its own node; moves and splits keep it.
CREATE TABLE fk_customers (customer_id bigint PRIMARY KEY, name text);
CREATE TABLE fk_orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, status text NOT NULL,
                        PRIMARY KEY (customer_id, order_id));
CREATE TABLE fk_states (code text PRIMARY KEY, label text);
CREATE TABLE fk_elsewhere (id bigint PRIMARY KEY);
CREATE TABLE fk_plain (id bigint PRIMARY KEY);
INSERT INTO fk_customers SELECT g, 'customer ' || g FROM generate_series(1, 60) g;
INSERT INTO fk_orders SELECT 1 + g % 60, g, CASE WHEN g % 4 = 0 THEN 'paid' ELSE 'new' END FROM generate_series(1, 300) g;
INSERT INTO fk_states VALUES ('new', 'New'), ('paid', 'Paid'), ('void', 'Void');
SELECT pg_shard.create_distributed_table('fk_customers', 'customer_id', shard_count => 3, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('fk_orders', 'customer_id', colocate_with => 'fk_customers');
SELECT pg_shard.create_distributed_table('fk_elsewhere', 'id', shard_count => 5, colocate_with => 'none');
SELECT pg_shard.create_reference_table('fk_states');
ALTER TABLE fk_orders ADD FOREIGN KEY (customer_id) REFERENCES fk_customers;
ALTER TABLE fk_orders ADD CONSTRAINT fk_orders_state FOREIGN KEY (status) REFERENCES fk_states (code)
  ON UPDATE CASCADE NOT VALID;
ALTER TABLE fk_orders VALIDATE CONSTRAINT fk_orders_state;
SELECT name, definition, referenced_rel::regclass FROM pg_shard.table_constraint
 WHERE kind = 'f' AND table_rel = 'fk_orders'::regclass ORDER BY name;
-- refused, with nothing changed
ALTER TABLE fk_orders ADD FOREIGN KEY (order_id) REFERENCES fk_elsewhere (id);
ALTER TABLE fk_orders ADD FOREIGN KEY (order_id) REFERENCES fk_customers (customer_id);
ALTER TABLE fk_orders ADD FOREIGN KEY (order_id) REFERENCES fk_plain (id);
ALTER TABLE fk_states ADD FOREIGN KEY (code) REFERENCES fk_states (code);
ALTER TABLE fk_orders ADD FOREIGN KEY (status) REFERENCES fk_states (code), ADD CHECK (order_id > 0);
SELECT count(*) AS foreign_keys FROM pg_shard.table_constraint WHERE kind = 'f' AND table_rel = 'fk_orders'::regclass;
-- the shards enforce them, on their own node
INSERT INTO fk_orders VALUES (61, 1000, 'new');
INSERT INTO fk_orders VALUES (5, 1000, 'lost');
INSERT INTO fk_orders VALUES (5, 1000, 'void');
DELETE FROM fk_customers WHERE customer_id = 5;
-- a reference table's UPDATE reaches its copies as an UPDATE: ON UPDATE
-- CASCADE runs on every node
UPDATE fk_states SET code = 'open' WHERE code = 'new';
SELECT status, count(*) FROM fk_orders GROUP BY status ORDER BY status;
UPDATE fk_states SET label = 'Paid in full' WHERE code = 'paid';
DELETE FROM fk_states WHERE code = 'paid';
-- each shard table references the shard of its own range, or the node's
-- reference copy
\set keys 'SELECT count(*) AS keys, count(*) FILTER (WHERE r.relname ~ ''^fk_states_'' OR ((SELECT range_start FROM pg_shard.local_shard WHERE shard_rel = k.conrelid) = (SELECT range_start FROM pg_shard.local_shard WHERE shard_rel = k.confrelid) AND (SELECT range_end FROM pg_shard.local_shard WHERE shard_rel = k.conrelid) = (SELECT range_end FROM pg_shard.local_shard WHERE shard_rel = k.confrelid))) AS same_range_or_copy, count(*) FILTER (WHERE (SELECT state FROM pg_shard.local_shard WHERE shard_rel = k.confrelid) = ''active'') AS to_active FROM pg_constraint k JOIN pg_class r ON r.oid = k.confrelid JOIN pg_class t ON t.oid = k.conrelid WHERE k.contype = ''f'' AND t.relname ~ ''^fk_orders_[0-9]+$'' AND (SELECT state FROM pg_shard.local_shard WHERE shard_rel = k.conrelid) = ''active'''
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:keys;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
-- a split and a move keep them: the halves reference each other's halves
SET pg_shard.move_drop_delay = 0;
SELECT shard_id AS fk_shard FROM pg_shard.shards WHERE table_name = 'fk_customers'::regclass
 ORDER BY range_start LIMIT 1 \gset
SELECT pg_shard.split_shard(:fk_shard) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
SELECT s.shard_id AS fk_shard,
       (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id AND n.state = 'active') AS fk_target
  FROM pg_shard.shards s WHERE s.table_name = 'fk_customers'::regclass ORDER BY s.range_start LIMIT 1 \gset
SELECT pg_shard.move_shard(:fk_shard, :fk_target) AS job \gset
SELECT pg_shard.wait_job(:job, '2 minutes');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
:keys;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
:keys;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:keys;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
INSERT INTO fk_orders SELECT customer_id, 2000 + customer_id, 'void' FROM fk_customers;
INSERT INTO fk_orders VALUES (99, 3000, 'void');
SELECT count(*) FROM fk_orders;
-- column changes keep the recorded keys true: renamed in them, gone with
-- a dropped column
ALTER TABLE fk_orders RENAME COLUMN status TO state;
ALTER TABLE fk_orders ADD COLUMN other_state text;
ALTER TABLE fk_orders ADD CONSTRAINT fk_orders_other FOREIGN KEY (other_state) REFERENCES fk_states (code);
ALTER TABLE fk_orders DROP COLUMN other_state;
SELECT name, definition FROM pg_shard.table_constraint
 WHERE kind = 'f' AND table_rel = 'fk_orders'::regclass ORDER BY name;
ALTER TABLE fk_orders RENAME COLUMN state TO status;
-- TRUNCATE: a referenced table only with the tables referencing it
TRUNCATE fk_customers;
SELECT count(*) FROM fk_customers;
-- undistribute_table waits for the foreign keys to go
SELECT pg_shard.undistribute_table('fk_customers');
ALTER TABLE fk_orders DROP CONSTRAINT fk_orders_customer_id_fkey;
ALTER TABLE fk_orders DROP CONSTRAINT fk_orders_state;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS keys_left FROM pg_constraint k JOIN pg_class t ON t.oid = k.conrelid
 WHERE k.contype = 'f' AND t.relname ~ '^fk_orders_';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT pg_shard.undistribute_table('fk_customers');
TRUNCATE fk_orders, fk_customers;
DROP TABLE fk_customers, fk_orders, fk_states, fk_elsewhere, fk_plain;
-- dropping a table that a foreign key references: refused alone, done
-- together with the referencing table (in either order)
CREATE TABLE fk_parents (id bigint PRIMARY KEY);
CREATE TABLE fk_children (parent_id bigint NOT NULL, n int, PRIMARY KEY (parent_id, n));
SELECT pg_shard.create_distributed_table('fk_parents', 'id', shard_count => 2, colocate_with => 'none');
SELECT pg_shard.create_distributed_table('fk_children', 'parent_id', colocate_with => 'fk_parents');
ALTER TABLE fk_children ADD FOREIGN KEY (parent_id) REFERENCES fk_parents;
INSERT INTO fk_parents VALUES (1), (2);
INSERT INTO fk_children VALUES (1, 1), (2, 1);
DROP TABLE fk_parents;
SELECT count(*) FROM fk_parents;
DROP TABLE fk_parents, fk_children;
SELECT count(*) AS catalog_rows FROM pg_shard.logical_table WHERE table_rel::text LIKE 'fk\_%';
-- between reference tables: on the metadata node's tables and every copy
CREATE TABLE fk_regions (code text PRIMARY KEY);
CREATE TABLE fk_countries (code text PRIMARY KEY, region text);
INSERT INTO fk_regions VALUES ('EU'), ('NA');
INSERT INTO fk_countries VALUES ('DE', 'EU'), ('FR', 'EU'), ('US', 'NA');
SELECT pg_shard.create_reference_table('fk_regions');
SELECT pg_shard.create_reference_table('fk_countries');
ALTER TABLE fk_countries ADD FOREIGN KEY (region) REFERENCES fk_regions ON DELETE CASCADE;
CREATE TABLE fk_dist (code text PRIMARY KEY);
SELECT pg_shard.create_distributed_table('fk_dist', 'code', shard_count => 2, colocate_with => 'none');
ALTER TABLE fk_regions ADD FOREIGN KEY (code) REFERENCES fk_dist (code);
INSERT INTO fk_countries VALUES ('XX', 'nowhere');
DELETE FROM fk_regions WHERE code = 'EU';
SELECT * FROM fk_countries ORDER BY code;
\set reference_keys 'SELECT c.conrelid::regclass::text ~ ''^fk_countries_'' AS on_copy, c.confrelid::regclass::text ~ ''^fk_regions_'' AS to_copy, (SELECT count(*) FROM pg_class r JOIN pg_shard.local_shard s ON s.shard_rel = r.oid WHERE r.relname ~ ''^fk_countries_'') AS copies FROM pg_constraint c WHERE c.contype = ''f'' AND c.conrelid::regclass::text ~ ''^fk_countries_'''
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:reference_keys;
SELECT format('%I.%I', n.nspname, c.relname) AS countries_copy FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 JOIN pg_shard.local_shard s ON s.shard_rel = c.oid WHERE c.relname ~ '^fk_countries_' \gset
SELECT * FROM :countries_copy ORDER BY code;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
SELECT pg_shard.undistribute_table('fk_regions');
ALTER TABLE fk_countries DROP CONSTRAINT fk_countries_region_fkey;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
:reference_keys;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP TABLE fk_countries, fk_regions, fk_dist;
