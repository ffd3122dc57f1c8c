-- Schema changes sent to the coordinator run on the metadata node and reach
-- every shard; routed statements see them at once.
CREATE TABLE sc_orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, status text NOT NULL,
                        PRIMARY KEY (customer_id, order_id));
SELECT pg_shard.create_distributed_table('sc_orders', 'customer_id', colocate_with => 'accounts');
INSERT INTO sc_orders SELECT id, id * 10, 'new' FROM generate_series(1, 50) id;
ALTER TABLE sc_orders ADD COLUMN note text NOT NULL DEFAULT 'none';
SELECT customer_id, order_id, status, note FROM sc_orders WHERE customer_id = 42;
ALTER TABLE sc_orders ADD CONSTRAINT sc_orders_status_known CHECK (status IN ('new', 'paid'));
INSERT INTO sc_orders VALUES (42, 421, 'lost', 'x');
ALTER TABLE sc_orders ADD FOREIGN KEY (customer_id) REFERENCES accounts (id);
INSERT INTO sc_orders VALUES (4242, 1, 'new', 'x');
ALTER TABLE sc_orders ADD CONSTRAINT sc_orders_currency FOREIGN KEY (note) REFERENCES currencies (code) NOT VALID;
ALTER TABLE sc_orders DROP CONSTRAINT sc_orders_currency;
CREATE INDEX CONCURRENTLY sc_orders_status ON sc_orders (status);
CREATE UNIQUE INDEX sc_orders_order ON sc_orders (order_id);
CREATE UNIQUE INDEX sc_orders_order ON sc_orders (customer_id, order_id, status);
SELECT kind, name FROM pg_shard.table_constraint WHERE table_rel = 'sc_orders'::regclass ORDER BY name;
COMMENT ON TABLE sc_orders IS 'orders';
-- renaming the distribution column: the coordinator routes by the new name
-- once its map reloads (NOTIFY pg_shard_map)
ALTER TABLE sc_orders RENAME COLUMN customer_id TO client_id;
SELECT pg_sleep(1);
UPDATE sc_orders SET status = 'paid' WHERE client_id = 42 AND order_id = 420;
SELECT client_id, order_id, status FROM sc_orders WHERE client_id = 42;
ALTER TABLE sc_orders RENAME TO sc_purchases;
SELECT pg_sleep(1);
SELECT count(*) FROM sc_purchases WHERE client_id = 7;
-- another schema: the old name stops resolving, the new one routes
CREATE SCHEMA sc_shop;
ALTER TABLE sc_purchases SET SCHEMA sc_shop;
SELECT pg_sleep(1);
SELECT count(*) FROM sc_purchases WHERE client_id = 7;
SELECT count(*) FROM sc_shop.sc_purchases WHERE client_id = 7;
ALTER TABLE sc_shop.sc_purchases SET SCHEMA public;
DROP SCHEMA sc_shop;
SELECT pg_sleep(1);
-- refused, with nothing changed
ALTER TABLE sc_purchases ALTER COLUMN client_id TYPE integer;
ALTER TABLE sc_purchases DROP COLUMN client_id;
-- emptied on every shard in one two-phase transaction
TRUNCATE sc_purchases;
SELECT count(*) FROM sc_purchases;
DROP INDEX sc_orders_status;
SELECT pg_shard.undistribute_table('sc_purchases');
ALTER TABLE sc_purchases DROP CONSTRAINT sc_orders_customer_id_fkey;
SELECT pg_shard.undistribute_table('sc_purchases');
SELECT relkind, obj_description(oid, 'pg_class') FROM pg_class WHERE oid = 'sc_purchases'::regclass;
DROP TABLE sc_purchases;
-- a table owned by an application role: through the coordinator the role
-- reads and writes its rows on the workers and changes its table; roles
-- (and their rights on the schema) exist on every node
\c 'dbname=coordinator_test host=127.0.0.1 port=28321 user=postgres'
CREATE ROLE sc_app LOGIN;
GRANT CREATE ON SCHEMA public TO sc_app;
\c 'dbname=coordinator_test host=127.0.0.1 port=28322 user=postgres'
CREATE ROLE sc_app LOGIN;
GRANT CREATE ON SCHEMA public TO sc_app;
\c 'dbname=coordinator_test host=127.0.0.1 port=28420 user=postgres'
CREATE ROLE sc_app LOGIN;
GRANT CREATE ON SCHEMA public TO sc_app;
CREATE TABLE sc_notes (note_id bigint PRIMARY KEY, body text);
ALTER TABLE sc_notes OWNER TO sc_app;
SELECT pg_shard.create_distributed_table('sc_notes', 'note_id', shard_count => 4, colocate_with => 'none');
\c 'dbname=coordinator_test host=127.0.0.1 port=28420 user=sc_app'
INSERT INTO sc_notes VALUES (1, 'one');
INSERT INTO sc_notes VALUES (3, 'three');
UPDATE sc_notes SET body = 'uno' WHERE note_id = 1;
SELECT note_id, body FROM sc_notes WHERE note_id = 1;
ALTER TABLE sc_notes ADD COLUMN tag text;
CREATE INDEX sc_notes_tag ON sc_notes (tag);
UPDATE sc_notes SET tag = 'x' WHERE note_id = 3;
SELECT note_id, body, tag FROM sc_notes WHERE note_id = 3;
-- a SELECT across shards runs over pg_shard's own connections, as the role
SELECT count(*) FROM sc_notes;
-- over postgres_fdw, whose PUBLIC user mapping a non-superuser may use only
-- with a password (docs/sql-api.md: add per-role user mappings)
SET pg_shard.enable_pushdown_executor = off;
SELECT count(*) FROM sc_notes;
RESET pg_shard.enable_pushdown_executor;
DROP TABLE sc_notes;
\c 'dbname=coordinator_test host=127.0.0.1 port=28420 user=postgres'
REVOKE CREATE ON SCHEMA public FROM sc_app;
DROP ROLE sc_app;
\c 'dbname=coordinator_test host=127.0.0.1 port=28321 user=postgres'
REVOKE CREATE ON SCHEMA public FROM sc_app;
DROP ROLE sc_app;
\c 'dbname=coordinator_test host=127.0.0.1 port=28322 user=postgres'
REVOKE CREATE ON SCHEMA public FROM sc_app;
DROP ROLE sc_app;
