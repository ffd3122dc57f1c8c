-- The differential test's schema and data, loaded into a plain database and
-- into the cluster's metadata node (where distribute.sql then distributes it).
CREATE TABLE customers (customer_id bigint PRIMARY KEY, name text NOT NULL, country text, created date NOT NULL);
CREATE TABLE orders (customer_id bigint NOT NULL, order_id bigint NOT NULL, total numeric(12,2) NOT NULL,
                     status text NOT NULL, ordered_at timestamptz NOT NULL, PRIMARY KEY (customer_id, order_id));
CREATE TABLE order_items (customer_id bigint NOT NULL, order_id bigint NOT NULL, item_no int NOT NULL,
                          sku text NOT NULL, qty int NOT NULL, price numeric(10,2) NOT NULL,
                          PRIMARY KEY (customer_id, order_id, item_no));
CREATE TABLE countries (code text PRIMARY KEY, name text NOT NULL, region text NOT NULL);
CREATE TABLE skus (sku text PRIMARY KEY, category text NOT NULL, weight numeric(6,2));

INSERT INTO countries VALUES ('DE','Germany','EU'), ('FR','France','EU'), ('NL','Netherlands','EU'),
    ('US','United States','NA'), ('CA','Canada','NA'), ('JP','Japan','AS'), ('BR','Brazil','SA');
INSERT INTO skus SELECT 'sku-' || g, (ARRAY['tools','books','food','toys'])[1 + g % 4], (g % 50) / 3.0
    FROM generate_series(0, 39) g;
INSERT INTO customers SELECT g, 'customer ' || g,
    (ARRAY['DE','FR','NL','US','CA','JP','BR', NULL])[1 + g % 8], date '2024-01-01' + (g % 400)
    FROM generate_series(1, 300) g;
INSERT INTO orders SELECT c, c * 100 + o, ((c * 37 + o * 11) % 1000) / 4.0,
    (ARRAY['new','paid','shipped','cancelled'])[1 + (c + o) % 4],
    timestamptz '2025-01-01 00:00:00+00' + ((c * 7 + o) % 365) * interval '1 day'
    FROM generate_series(1, 300) c, generate_series(1, 1 + c % 6) o;
INSERT INTO order_items SELECT o.customer_id, o.order_id, i, 'sku-' || ((o.order_id + i) % 40),
    1 + (o.order_id + i) % 5, ((o.order_id * 13 + i) % 200) / 2.0
    FROM orders o, generate_series(1, 1 + o.order_id % 4) i;
