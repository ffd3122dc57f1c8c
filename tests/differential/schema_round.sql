-- A round of schema changes, run on both databases between two runs of the
-- corpus (each statement on its own, as psql -c would run them). Net
-- effect on query results: none, but the distributed tables now have
-- dropped columns, new indexes and constraints, and changed types.
ALTER TABLE customers ADD COLUMN tier int NOT NULL DEFAULT 1;
ALTER TABLE customers RENAME COLUMN name TO full_name;
ALTER TABLE customers RENAME COLUMN full_name TO name;
CREATE INDEX customers_country_idx ON customers (country);
CREATE INDEX CONCURRENTLY orders_status_idx ON orders (status, ordered_at);
ALTER TABLE orders ALTER COLUMN status TYPE varchar(20);
ALTER TABLE orders ADD COLUMN note text;
ALTER TABLE order_items ADD CONSTRAINT order_items_qty_positive CHECK (qty > 0);
CREATE UNIQUE INDEX order_items_sku_idx ON order_items (customer_id, order_id, sku, item_no);
ALTER TABLE countries ADD COLUMN population bigint;
CREATE INDEX countries_region_idx ON countries (region);
COMMENT ON TABLE customers IS 'customers of the shop';
ALTER TABLE orders DROP COLUMN note;
ALTER TABLE countries DROP COLUMN population;
ALTER TABLE customers DROP COLUMN tier;
