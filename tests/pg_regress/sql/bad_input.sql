-- Bad input gets a clear error and changes nothing.
SELECT pg_shard.map_version() AS version_before \gset
CREATE TEMP TABLE catalog_before AS
SELECT (SELECT count(*) FROM pg_shard.logical_table) AS tables,
       (SELECT count(*) FROM pg_shard.shard) AS shards,
       (SELECT count(*) FROM pg_shard.placement) AS placements,
       (SELECT count(*) FROM pg_shard.node) AS nodes,
       (SELECT count(*) FROM pg_shard.colocation_group) AS groups;

-- unknown table or column
SELECT pg_shard.create_distributed_table('no_such_table', 'id');
CREATE TABLE widgets (id bigint PRIMARY KEY, price numeric, tags text[]);
INSERT INTO widgets SELECT g, g FROM generate_series(1, 10) g;
SELECT pg_shard.create_distributed_table('widgets', 'no_such_column');
-- a key type without an encoding
SELECT pg_shard.create_distributed_table('widgets', 'price');
SELECT pg_shard.create_distributed_table('widgets', 'tags');
-- bad shard counts
SELECT pg_shard.create_distributed_table('widgets', 'id', shard_count => 0);
SELECT pg_shard.create_distributed_table('widgets', 'id', shard_count => 100000);
-- already distributed, or a reference table
SELECT pg_shard.create_distributed_table('orders', 'customer_id');
SELECT pg_shard.create_reference_table('countries');
SELECT pg_shard.create_distributed_table('countries', 'code');
-- co-location with a table of another key type, another shard count, a non-distributed table
CREATE TABLE labels (name text PRIMARY KEY);
SELECT pg_shard.create_distributed_table('labels', 'name', colocate_with => 'orders');
SELECT pg_shard.create_distributed_table('widgets', 'id', shard_count => 4, colocate_with => 'orders');
SELECT pg_shard.create_distributed_table('widgets', 'id', colocate_with => 'labels');
SELECT pg_shard.create_distributed_table('widgets', 'id', colocate_with => 'countries');
SELECT pg_shard.create_distributed_table('widgets', 'id', colocate_with => 'no_such_table');
-- no primary key or replica identity
CREATE TABLE logs (at timestamptz, line text, customer_id bigint);
SELECT pg_shard.create_distributed_table('logs', 'customer_id');
SELECT pg_shard.create_reference_table('logs');
-- REPLICA IDENTITY FULL is enough
ALTER TABLE logs REPLICA IDENTITY FULL;
-- other relation kinds
CREATE VIEW widget_view AS SELECT * FROM widgets;
SELECT pg_shard.create_distributed_table('widget_view', 'id');
CREATE TABLE parted (id bigint PRIMARY KEY) PARTITION BY RANGE (id);
SELECT pg_shard.create_distributed_table('parted', 'id');
CREATE TEMP TABLE temp_widgets (id bigint PRIMARY KEY);
SELECT pg_shard.create_distributed_table('temp_widgets', 'id');
SELECT pg_shard.create_distributed_table('pg_shard.node', 'node_id');
-- foreign keys, in either direction
CREATE TABLE fk_parent (id bigint PRIMARY KEY);
CREATE TABLE fk_child (id bigint PRIMARY KEY, parent_id bigint REFERENCES fk_parent);
SELECT pg_shard.create_distributed_table('fk_child', 'id');
SELECT pg_shard.create_reference_table('fk_parent');
-- a NULL distribution key in existing rows
CREATE TABLE nullable_keys (id bigserial PRIMARY KEY, customer_id bigint);
INSERT INTO nullable_keys (customer_id) VALUES (1), (NULL);
SELECT pg_shard.create_distributed_table('nullable_keys', 'customer_id');

-- inheritance, in either direction
CREATE TABLE inh_parent (id bigint PRIMARY KEY);
CREATE TABLE inh_child (extra text) INHERITS (inh_parent);
SELECT pg_shard.create_distributed_table('inh_parent', 'id');
SELECT pg_shard.create_distributed_table('inh_child', 'id');

-- nodes: unreachable, duplicate, bad port, the metadata node itself
SELECT pg_shard.add_node('127.0.0.1', 55399);
SELECT pg_shard.add_node('127.0.0.1', 25321);
-- the same worker under other addresses: its name, its socket folder
SELECT pg_shard.add_node('localhost', 25321);
SELECT setting AS socket_folder FROM pg_settings WHERE name = 'unix_socket_directories' \gset
SELECT pg_shard.add_node(split_part(:'socket_folder', ',', 1), 25321);
SELECT pg_shard.add_node('127.0.0.1', 0);
SELECT pg_shard.add_node('', 25324);
SELECT pg_shard.add_node('127.0.0.1', 25320);
-- a server without the pg_shard extension installed (tests/bare_server.sh)
SELECT pg_shard.add_node('127.0.0.1', 25324);

-- nothing changed: same catalog, same map version, rows still local
SELECT pg_shard.map_version() = :version_before AS version_unchanged;
SELECT c.* = b.* AS catalog_unchanged
FROM catalog_before b,
     (SELECT (SELECT count(*) FROM pg_shard.logical_table) AS tables,
             (SELECT count(*) FROM pg_shard.shard) AS shards,
             (SELECT count(*) FROM pg_shard.placement) AS placements,
             (SELECT count(*) FROM pg_shard.node) AS nodes,
             (SELECT count(*) FROM pg_shard.colocation_group) AS groups) c;
SELECT count(*) AS widgets_still_local FROM widgets;
SELECT count(*) AS nullable_keys_still_local FROM nullable_keys;
-- no stray shard tables were left on the workers
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
SELECT count(*) AS stray_tables FROM pg_class
WHERE relname LIKE 'widgets%' OR relname LIKE 'labels%' OR relname LIKE 'nullable_keys%';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
