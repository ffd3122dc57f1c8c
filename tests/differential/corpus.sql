-- Differential corpus: each block (separated by blank lines) runs on a plain
-- database and through the cluster's metadata node; results must agree.
-- A block marked '-- no-compare' only has to run; one marked '-- both-fail'
-- must fail on both; one marked '-- error' must fail with the same SQLSTATE
-- (any other block failing on the plain database is a broken test). Results
-- of blocks without ORDER BY are compared as sets of rows.

SELECT * FROM orders WHERE customer_id = 1 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 2 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 42 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 77 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 150 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 299 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 300 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = 301 ORDER BY order_id;

SELECT * FROM orders WHERE customer_id = -5 ORDER BY order_id;

SELECT name, country FROM customers WHERE customer_id = 3;

SELECT count(*), sum(total), min(ordered_at), max(ordered_at) FROM orders WHERE customer_id = 3;

SELECT name, country FROM customers WHERE customer_id = 99;

SELECT count(*), sum(total), min(ordered_at), max(ordered_at) FROM orders WHERE customer_id = 99;

SELECT name, country FROM customers WHERE customer_id = 250;

SELECT count(*), sum(total), min(ordered_at), max(ordered_at) FROM orders WHERE customer_id = 250;

SELECT customer_id, count(*) FROM orders WHERE customer_id IN (1, 2, 3, 150, 999) GROUP BY customer_id;

SELECT * FROM customers WHERE customer_id IN (10, 20, 30) ORDER BY customer_id;

SELECT count(*) FROM order_items WHERE customer_id = ANY (ARRAY[5, 6, 7]);

SELECT order_id, total FROM orders WHERE customer_id = 7 AND total > 100 ORDER BY order_id;

SELECT order_id FROM orders WHERE customer_id = 8 OR customer_id = 9 ORDER BY order_id;

SELECT count(*) FROM orders WHERE customer_id BETWEEN 10 AND 20;

SELECT count(*) FROM orders WHERE customer_id <> 10;

SELECT count(*) FROM orders WHERE customer_id IS NULL;

SELECT count(*) FROM customers WHERE country IS NULL;

SELECT count(*), sum(total), avg(total), min(total), max(total) FROM orders;

SELECT status, count(*), sum(total) FROM orders GROUP BY status;

SELECT status, count(*) FROM orders GROUP BY status HAVING count(*) > 100;

SELECT customer_id, sum(total) FROM orders GROUP BY customer_id HAVING sum(total) > 1000;

SELECT date_trunc('month', ordered_at) AS month, count(*) FROM orders GROUP BY 1 ORDER BY 1;

SELECT count(DISTINCT customer_id), count(DISTINCT status) FROM orders;

SELECT DISTINCT status FROM orders;

SELECT DISTINCT ON (customer_id) customer_id, order_id, total FROM orders ORDER BY customer_id, total DESC, order_id;

SELECT country, count(*) FROM customers GROUP BY ROLLUP (country);

SELECT status, country, count(*) FROM orders JOIN customers USING (customer_id) GROUP BY CUBE (status, country);

SELECT sku, sum(qty) FROM order_items GROUP BY sku;

SELECT sku, sum(qty * price) AS revenue FROM order_items GROUP BY sku ORDER BY revenue DESC, sku LIMIT 5;

SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY total) FROM orders;

SELECT string_agg(status, ',' ORDER BY order_id) FROM orders WHERE customer_id = 12;

SELECT array_agg(order_id ORDER BY order_id) FROM orders WHERE customer_id IN (13, 14);

SELECT bool_and(total >= 0), bool_or(status = 'cancelled') FROM orders;

SELECT count(*) FILTER (WHERE status = 'paid'), count(*) FILTER (WHERE total > 200) FROM orders;

SELECT customer_id, order_id, total FROM orders ORDER BY total DESC, customer_id, order_id LIMIT 10;

SELECT customer_id, order_id FROM orders ORDER BY customer_id, order_id LIMIT 5 OFFSET 100;

SELECT * FROM customers ORDER BY created DESC, customer_id LIMIT 3;

SELECT customer_id FROM customers ORDER BY customer_id DESC FETCH FIRST 4 ROWS ONLY;

SELECT order_id FROM orders WHERE customer_id = 42 ORDER BY order_id DESC LIMIT 2;

SELECT c.customer_id, c.name, count(o.order_id) FROM customers c LEFT JOIN orders o USING (customer_id) WHERE c.customer_id <= 20 GROUP BY 1, 2;

SELECT o.order_id, i.item_no, i.sku FROM orders o JOIN order_items i USING (customer_id, order_id) WHERE o.customer_id = 21 ORDER BY 1, 2;

SELECT count(*) FROM orders o JOIN order_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id;

SELECT o.status, sum(i.qty) FROM orders o JOIN order_items i USING (customer_id, order_id) GROUP BY o.status;

SELECT c.country, co.name, count(*) FROM customers c JOIN countries co ON co.code = c.country JOIN orders o USING (customer_id) GROUP BY 1, 2;

SELECT co.region, sum(o.total) FROM orders o JOIN customers c USING (customer_id) JOIN countries co ON co.code = c.country GROUP BY co.region;

SELECT s.category, sum(i.qty) FROM order_items i JOIN skus s USING (sku) GROUP BY s.category;

SELECT s.category, count(*) FROM order_items i JOIN skus s ON s.sku = i.sku WHERE i.customer_id = 33 GROUP BY 1;

SELECT c.customer_id FROM customers c LEFT JOIN orders o ON o.customer_id = c.customer_id WHERE o.order_id IS NULL;

SELECT count(*) FROM customers c RIGHT JOIN orders o USING (customer_id);

SELECT count(*) FROM customers c FULL JOIN countries co ON co.code = c.country WHERE co.code IS NULL OR c.customer_id IS NULL;

SELECT a.customer_id, a.order_id, b.order_id FROM orders a JOIN orders b ON a.customer_id = b.customer_id AND a.order_id < b.order_id WHERE a.customer_id = 35;

SELECT count(*) FROM orders a JOIN orders b ON a.order_id = b.order_id;

SELECT count(*) FROM orders a, customers c WHERE a.customer_id = c.customer_id AND c.country = 'DE';

SELECT co.code, count(c.customer_id) FROM countries co LEFT JOIN customers c ON c.country = co.code GROUP BY co.code;

SELECT c.name, x.n FROM customers c CROSS JOIN LATERAL (SELECT count(*) AS n FROM orders o WHERE o.customer_id = c.customer_id) x WHERE c.customer_id <= 5;

SELECT count(*) FROM orders WHERE customer_id IN (SELECT customer_id FROM customers WHERE country = 'FR');

SELECT count(*) FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.customer_id AND o.status = 'cancelled');

SELECT count(*) FROM customers c WHERE NOT EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.customer_id AND o.total > 240);

-- Sublinks on a distributed table by other columns than its key (its rows
-- read as an intermediate result): EXISTS / NOT EXISTS, NULLs on either side.
SELECT code FROM countries c WHERE EXISTS (SELECT 1 FROM customers cu WHERE cu.country = c.code AND cu.created > '2024-10-01') ORDER BY code;

SELECT code FROM countries c WHERE NOT EXISTS (SELECT 1 FROM customers cu WHERE cu.country = c.code AND cu.customer_id < 5) ORDER BY code;

SELECT sku FROM skus s WHERE NOT EXISTS (SELECT 1 FROM order_items i WHERE i.sku = s.sku AND i.qty > 4 AND i.price > 90) ORDER BY sku;

SELECT count(*) FROM (SELECT code FROM countries c WHERE NOT EXISTS (SELECT 1 FROM customers cu WHERE cu.country = c.code AND cu.created < '2024-01-05')) s;

SELECT x.code FROM (VALUES ('DE'), ('JP'), (NULL), ('XX')) x(code) WHERE NOT EXISTS (SELECT FROM customers cu WHERE cu.country = x.code);

-- A comparison with an aggregate of the matching rows (grouped and joined),
-- empty groups included, an IN on reference tables applied to both.
SELECT sku, category FROM skus s WHERE s.weight * 10 > (SELECT avg(price) FROM order_items i WHERE i.sku = s.sku) ORDER BY sku;

SELECT sku FROM skus s WHERE 0 < (SELECT sum(qty) FROM order_items i WHERE i.sku = s.sku AND i.qty > 4 AND i.price < 20) ORDER BY sku;

SELECT c.code FROM countries c WHERE c.code IN (SELECT code FROM countries WHERE region = 'EU') AND date '2024-12-01' < (SELECT max(created) FROM customers cu WHERE cu.country = c.code) ORDER BY 1;

SELECT code FROM countries c WHERE 30 < (SELECT count(*) FROM customers cu WHERE cu.country = c.code) ORDER BY 1;

SELECT sku FROM skus s WHERE (SELECT sum(qty) FROM order_items i WHERE i.sku = s.sku AND i.qty > 100) IS NULL ORDER BY sku;

SELECT s.category, count(*) FROM skus s WHERE s.weight > (SELECT min(price) / 10 FROM order_items i WHERE i.sku = s.sku) GROUP BY s.category ORDER BY 1;

-- A distributed table beside such a sublink (TPC-H q17's shape): its rows
-- are an intermediate result too, restricted through the reference table
-- it is joined with; conditions with parameters or outer joins keep it on
-- the postgres_fdw path.
SELECT sum(i.price * i.qty) FROM order_items i, skus s WHERE s.sku = i.sku AND s.category = 'books' AND i.qty < (SELECT 1.1 * avg(qty) FROM order_items i2 WHERE i2.sku = s.sku);

SELECT s.category, count(*), sum(i.qty) FROM order_items i JOIN skus s ON s.sku = i.sku WHERE s.weight < 5 AND i.price > (SELECT avg(price) FROM order_items i2 WHERE i2.sku = i.sku AND i2.qty > 1) GROUP BY s.category ORDER BY 1;

SELECT count(*), sum(o.total) FROM orders o WHERE o.status = 'paid' AND o.total * 2 > (SELECT max(i.price) FROM order_items i WHERE i.sku = 'sku-' || (o.order_id % 40));

SELECT c.country, count(*) FROM customers c, countries co WHERE co.code = c.country AND co.region = 'EU' AND c.created < (SELECT max(o.ordered_at)::date - 200 FROM orders o WHERE o.status = co.name) GROUP BY 1 ORDER BY 1;

SELECT c.customer_id, c.name FROM customers c WHERE c.customer_id < 60 AND NOT EXISTS (SELECT 1 FROM customers c2 WHERE c2.country = c.country AND c2.created < c.created - 300) ORDER BY 1;

SELECT s.sku, count(i.item_no) FROM skus s LEFT JOIN order_items i ON i.sku = s.sku AND i.qty = 5 WHERE s.weight < (SELECT min(price) FROM order_items i2 WHERE i2.sku = s.sku) GROUP BY s.sku ORDER BY 1;

-- TPC-H q22's shape: the reference table's rows restricted by a comparison
-- with an aggregate of reference tables alone (computed first), an
-- anti-join on a distributed table by another column than its key.
SELECT s.category, count(*), sum(s.weight) FROM skus s WHERE s.category IN ('books', 'toys') AND s.weight > (SELECT avg(weight) FROM skus WHERE weight > 2 AND category IN ('books', 'toys')) AND NOT EXISTS (SELECT 1 FROM order_items i WHERE i.sku = s.sku AND i.qty = 5 AND i.price > 60) GROUP BY 1 ORDER BY 1;

SELECT count(*) FROM skus s, countries c WHERE c.code = 'DE' AND (s.weight > (SELECT avg(weight) FROM skus) OR c.region = 'NA') AND NOT EXISTS (SELECT 1 FROM order_items i WHERE i.sku = s.sku AND i.qty = 5);

-- Joins of co-located tables with filtered reference tables (TPC-H q8's
-- shape): each node reads a filtered reference table once for all its
-- shard groups; outer joins, whole rows and two readings of one table.
SELECT co.region, count(*), sum(i.qty * i.price) FROM orders o JOIN order_items i USING (customer_id, order_id) JOIN skus s ON s.sku = i.sku JOIN customers c USING (customer_id) JOIN countries co ON co.code = c.country WHERE s.category = 'books' AND co.region IN ('EU', 'NA') GROUP BY 1 ORDER BY 1;

SELECT s.category, count(i.item_no) FROM orders o JOIN order_items i USING (customer_id, order_id) LEFT JOIN skus s ON s.sku = i.sku AND s.weight > 10 WHERE o.status = 'paid' GROUP BY 1 ORDER BY 1;

SELECT count(*), min(s::text) FROM orders o JOIN order_items i USING (customer_id, order_id), skus s WHERE s.sku = i.sku AND s.category = 'toys' AND o.total > 200;

SELECT s1.category, count(*) FROM order_items i JOIN orders o USING (customer_id, order_id), skus s1, skus s2 WHERE s1.sku = i.sku AND s2.sku = 'sku-' || ((i.item_no + 1) % 40) AND s1.category = 'food' AND s2.weight < 8 GROUP BY 1 ORDER BY 1;

SELECT c.country, count(*) FROM customers c JOIN orders o USING (customer_id), countries co WHERE co.code = c.country AND co.name LIKE '%a%' AND o.status IN (SELECT status FROM orders WHERE customer_id = 7) GROUP BY 1 ORDER BY 1;

SELECT customer_id, (SELECT max(total) FROM orders o WHERE o.customer_id = c.customer_id) FROM customers c WHERE customer_id BETWEEN 40 AND 45;

SELECT * FROM (SELECT customer_id, sum(total) AS s FROM orders GROUP BY customer_id) t WHERE s > 1200;

SELECT * FROM (SELECT * FROM orders WHERE customer_id = 46) t WHERE total > 50;

SELECT count(*) FROM orders WHERE total > (SELECT avg(total) FROM orders);

SELECT count(*) FROM order_items WHERE sku IN (SELECT sku FROM skus WHERE category = 'books');

SELECT code FROM countries WHERE code NOT IN (SELECT country FROM customers WHERE country IS NOT NULL);

SELECT customer_id FROM orders GROUP BY customer_id HAVING count(*) = (SELECT max(c) FROM (SELECT count(*) AS c FROM orders GROUP BY customer_id) m);

WITH t AS (SELECT customer_id, sum(total) AS s FROM orders GROUP BY customer_id) SELECT count(*), max(s) FROM t;

WITH big AS (SELECT * FROM orders WHERE total > 200) SELECT status, count(*) FROM big GROUP BY status;

WITH c AS (SELECT * FROM customers WHERE customer_id = 47) SELECT c.name, o.order_id FROM c JOIN orders o USING (customer_id) ORDER BY o.order_id;

WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 5) SELECT n.i, (SELECT count(*) FROM orders WHERE customer_id = n.i) FROM n;

WITH m AS MATERIALIZED (SELECT customer_id FROM customers WHERE country = 'JP') SELECT count(*) FROM orders WHERE customer_id IN (SELECT customer_id FROM m);

SELECT customer_id, order_id, rank() OVER (PARTITION BY customer_id ORDER BY total DESC, order_id) FROM orders WHERE customer_id <= 10;

SELECT customer_id, order_id, sum(total) OVER (PARTITION BY customer_id ORDER BY order_id) FROM orders WHERE customer_id BETWEEN 50 AND 55;

SELECT order_id, total, lag(total) OVER (ORDER BY order_id), lead(total) OVER (ORDER BY order_id) FROM orders WHERE customer_id = 56 ORDER BY order_id;

SELECT status, total, row_number() OVER (PARTITION BY status ORDER BY total DESC, customer_id, order_id) AS rn FROM orders ORDER BY status, rn LIMIT 12;

SELECT customer_id, count(*) OVER () FROM customers WHERE customer_id <= 3;

SELECT ntile(4) OVER (ORDER BY total, customer_id, order_id) AS q, count(*) FROM orders GROUP BY total, customer_id, order_id ORDER BY total, customer_id, order_id LIMIT 7;

SELECT customer_id FROM orders WHERE status = 'new' INTERSECT SELECT customer_id FROM orders WHERE status = 'paid';

SELECT customer_id FROM customers WHERE country = 'US' UNION SELECT customer_id FROM orders WHERE total > 245;

SELECT customer_id FROM customers EXCEPT SELECT customer_id FROM orders;

SELECT 'orders', count(*) FROM orders UNION ALL SELECT 'items', count(*) FROM order_items;

SELECT customer_id, upper(name), length(name), country || '-' || customer_id FROM customers WHERE customer_id IN (60, 61);

SELECT count(*) FROM customers WHERE name LIKE 'customer 1%';

SELECT count(*) FROM customers WHERE name ~ '^customer [0-9]{2}$';

SELECT extract(dow FROM ordered_at) AS dow, count(*) FROM orders GROUP BY 1;

SELECT CASE WHEN total > 150 THEN 'high' WHEN total > 50 THEN 'mid' ELSE 'low' END AS band, count(*) FROM orders GROUP BY 1;

SELECT coalesce(country, 'none'), count(*) FROM customers GROUP BY 1;

SELECT round(avg(price), 2), round(stddev(price), 4) FROM order_items;

SELECT customer_id::text, total::int FROM orders WHERE customer_id = 62 ORDER BY order_id;

SELECT json_agg(json_build_object('id', order_id, 'total', total) ORDER BY order_id) FROM orders WHERE customer_id = 63;

SELECT count(*) FROM orders WHERE ordered_at >= '2025-06-01' AND ordered_at < '2025-07-01';

SELECT customer_id, name FROM customers WHERE customer_id = 64::int;

SELECT greatest(max(total), 0), least(min(total), 1000) FROM orders;

SELECT * FROM countries ORDER BY code;

SELECT region, count(*) FROM countries GROUP BY region;

SELECT category, count(*), sum(weight) FROM skus GROUP BY category;

PREPARE by_customer(bigint) AS SELECT order_id, total FROM orders WHERE customer_id = $1 ORDER BY order_id;

EXECUTE by_customer(1);

EXECUTE by_customer(65);

EXECUTE by_customer(66);

EXECUTE by_customer(67);

EXECUTE by_customer(68);

EXECUTE by_customer(69);

EXECUTE by_customer(70);

SET plan_cache_mode = force_generic_plan;

EXECUTE by_customer(71);

EXECUTE by_customer(72);

PREPARE by_two(bigint, bigint) AS SELECT count(*) FROM orders o JOIN order_items i USING (customer_id, order_id) WHERE o.customer_id IN ($1, $2);

EXECUTE by_two(73, 74);

PREPARE by_array(bigint[]) AS SELECT count(*) FROM orders WHERE customer_id = ANY ($1);

EXECUTE by_array(ARRAY[75, 76, 77]::bigint[]);

EXECUTE by_array(ARRAY[75, NULL, 75]::bigint[]);

EXECUTE by_array('{}');

EXECUTE by_array('{0,2,4,6,8,10,12,14,16,18,20,22,24,26,28,30,32,34,36,38,40,42,44,46,48,50,52,54,56,58,60,62,64,66,68,70,72,74,76,78,80,82,84,86,88,90,92,94,96,98,100,102,104,106,108,110,112,114,116,118,120,122,124,126,128,130,132,134,136,138,140,142,144,146,148,150,152,154,156,158,160,162,164,166,168,170,172,174,176,178,180,182,184,186,188,190,192,194,196,198,200,202,204,206,208,210,212,214,216,218,220,222,224,226,228,230,232,234,236,238,240,242,244,246,248,250,252,254,256,258,260,262,264,266,268,270,272,274,276,278,280,282,284,286,288,290,292,294,296,298}');

PREPARE items_by_array(bigint[]) AS SELECT o.customer_id, count(*), sum(i.qty) FROM orders o JOIN order_items i USING (customer_id, order_id) WHERE o.customer_id = ANY ($1) GROUP BY 1;

EXECUTE items_by_array('{3, 5, 8, 13, 21, 34}');

RESET plan_cache_mode;

DEALLOCATE ALL;

-- no-compare
EXPLAIN (COSTS OFF) SELECT * FROM orders WHERE customer_id = 1;

-- no-compare
EXPLAIN (COSTS OFF) SELECT count(*) FROM orders o JOIN order_items i USING (customer_id, order_id);

-- no-compare
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT count(*) FROM orders WHERE customer_id = 2;

INSERT INTO customers VALUES (1001, 'new one', 'DE', '2026-01-01'), (1002, 'new two', NULL, '2026-01-02') RETURNING customer_id, name;

INSERT INTO orders VALUES (1001, 100101, 12.50, 'new', '2026-01-05 10:00+00') RETURNING *;

INSERT INTO orders SELECT customer_id, order_id + 1000000, total + 1, 'copy', ordered_at FROM orders WHERE customer_id <= 5;

SELECT count(*), sum(total) FROM orders WHERE order_id > 1000000;

INSERT INTO order_items SELECT customer_id, order_id, 1, 'sku-1', 2, 9.99 FROM orders WHERE order_id > 1000000 RETURNING customer_id, order_id;

INSERT INTO orders VALUES (1002, 100201, 1, 'new', now()) ON CONFLICT DO NOTHING;

INSERT INTO orders VALUES (1002, 100201, 1, 'dup', now()) ON CONFLICT DO NOTHING;

SELECT status FROM orders WHERE customer_id = 1002;

UPDATE orders SET status = 'paid' WHERE customer_id = 1001 RETURNING order_id, status;

UPDATE orders SET total = total * 2 WHERE customer_id IN (1, 2, 3) AND order_id > 1000000;

SELECT customer_id, order_id, total FROM orders WHERE order_id > 1000000 ORDER BY 1, 2;

UPDATE orders SET status = 'archived' WHERE ordered_at < '2025-01-10' RETURNING customer_id, order_id;

UPDATE orders o SET total = total + 1 FROM customers c WHERE c.customer_id = o.customer_id AND c.country = 'BR' AND o.status = 'new';

SELECT sum(total) FROM orders;

UPDATE customers SET country = 'NL' WHERE customer_id = 1002;

UPDATE order_items SET qty = qty + 1 WHERE customer_id = 80 RETURNING item_no, qty;

DELETE FROM order_items WHERE order_id > 1000000 RETURNING customer_id, order_id, item_no;

DELETE FROM orders WHERE order_id > 1000000;

DELETE FROM orders WHERE customer_id = 1001 RETURNING order_id;

DELETE FROM orders o USING customers c WHERE c.customer_id = o.customer_id AND c.customer_id = 1002;

DELETE FROM customers WHERE customer_id > 1000 RETURNING customer_id;

SELECT count(*), sum(total) FROM orders;

WITH moved AS (DELETE FROM order_items WHERE customer_id = 81 AND item_no > 1 RETURNING *) SELECT count(*) FROM moved;

WITH ins AS (INSERT INTO customers VALUES (1003, 'cte', 'JP', '2026-02-02') RETURNING customer_id) INSERT INTO orders SELECT customer_id, 100301, 5, 'new', '2026-02-03+00' FROM ins;

SELECT c.name, o.total FROM customers c JOIN orders o USING (customer_id) WHERE c.customer_id = 1003;

INSERT INTO countries VALUES ('IT', 'Italy', 'EU');

UPDATE countries SET name = 'Deutschland' WHERE code = 'DE';

DELETE FROM countries WHERE code = 'BR';

SELECT * FROM countries ORDER BY code;

SELECT co.name, count(*) FROM customers c JOIN countries co ON co.code = c.country GROUP BY co.name;

UPDATE skus SET weight = weight + 1 WHERE category = 'toys';

SELECT category, sum(weight) FROM skus GROUP BY category;

BEGIN;

INSERT INTO orders VALUES (90, 999901, 1, 'tx', '2026-03-01+00');

SELECT count(*) FROM orders WHERE order_id = 999901;

ROLLBACK;

SELECT count(*) FROM orders WHERE order_id = 999901;

BEGIN;

INSERT INTO orders VALUES (91, 999902, 1, 'tx', '2026-03-01+00');

UPDATE orders SET total = 2 WHERE order_id = 999902;

COMMIT;

SELECT customer_id, total FROM orders WHERE order_id = 999902;

COPY orders (customer_id, order_id, total, status, ordered_at) FROM stdin;
92	999903	3.00	copy	2026-03-02 00:00:00+00
93	999904	4.00	copy	2026-03-02 00:00:00+00
\.

SELECT customer_id, order_id, total FROM orders WHERE status = 'copy' ORDER BY order_id;

COPY (SELECT customer_id, order_id, total FROM orders WHERE customer_id = 94 ORDER BY order_id) TO stdout;

COPY countries TO stdout;

-- error: division by zero (same SQLSTATE expected)
SELECT 1 / (count(*) - count(*)) FROM orders;

-- error: duplicate key: nothing inserted (same SQLSTATE expected)
INSERT INTO orders VALUES (95, 9500, 1, 'x', now()), (95, 9500, 2, 'y', now());

SELECT count(*) FROM orders WHERE customer_id = 95;

-- error: invalid input for the key (same SQLSTATE expected)
SELECT * FROM orders WHERE customer_id = 'abc';

-- both-fail: a NULL key is refused (plain: not-null violation; cluster: no partition for the row)
INSERT INTO orders (customer_id, order_id, total, status, ordered_at) VALUES (NULL, 1, 1, 'x', now());

SELECT count(*) FROM orders;

-- Pushdown shapes (issue 16): each aggregate merged from partial results,
-- grouping, HAVING, DISTINCT, ORDER BY and LIMIT across shard groups.
SELECT count(*), count(status), sum(total), avg(total), min(total), max(total) FROM orders;

SELECT avg(qty), avg(item_no::int2), avg(order_id), sum(qty), sum(qty::int2), sum(qty::int8 * 1000000000000) FROM order_items;

SELECT round(avg(price::float8)::numeric, 6), round(avg(qty::float4)::numeric, 6), round(sum(price::float8)::numeric, 4) FROM order_items;

SELECT avg(total), avg(total * 3 / 7), sum(total / 3) FROM orders;

SELECT status, bool_and(total > 10), bool_or(total > 240), every(total >= 0) FROM orders GROUP BY status ORDER BY status;

SELECT status, round(stddev(total), 6), round(variance(total), 6), round(stddev_pop(total), 6), round(var_samp(total), 6) FROM orders GROUP BY status ORDER BY status;

-- variance and standard deviation merged from the workers' transition
-- states: integers and numeric exactly as one server computes them (no
-- rounding here), floats as a parallel plan would (last digits rounded off).
SELECT status, stddev(total), variance(total), stddev_pop(total), var_pop(total), stddev_samp(total), var_samp(total) FROM orders GROUP BY status ORDER BY status;

SELECT variance(qty), stddev(qty::int2), var_pop(qty::int8 * 1000003), stddev_pop(order_id), stddev(price) FILTER (WHERE qty > 2), var_samp(item_no::int2) FROM order_items;

SELECT round(variance(price::float8)::numeric, 6), round(stddev(qty::float4)::numeric, 6), round(stddev_pop(price::float8)::numeric, 6), round(var_pop(qty::float8)::numeric, 6) FROM order_items;

SELECT customer_id % 4 AS r, variance(total), stddev(total) FROM orders WHERE customer_id = 3 GROUP BY 1;

SELECT variance(total), stddev(total), var_pop(total), stddev_pop(total), variance(customer_id), stddev(total::float8) FROM orders WHERE total < 0;

SELECT variance(qty), var_pop(qty), stddev_pop(price), stddev(qty) FROM order_items WHERE customer_id = 1 AND order_id = 1 AND item_no = 1;

SELECT status, stddev(total) FROM orders GROUP BY status HAVING variance(total) > 1 ORDER BY stddev(total) DESC, status LIMIT 2;

-- string_agg and array_agg without ORDER BY: the workers' strings and
-- arrays joined (their order is unspecified: compared by what does not
-- depend on it).
SELECT status, length(string_agg(order_id::text, ',')), cardinality(array_agg(order_id)), array_length(array_agg(total) FILTER (WHERE total > 100), 1), string_agg(NULL, ','), array_agg(NULL::int) IS NULL FROM orders GROUP BY status ORDER BY status;

SELECT (SELECT string_agg(x, ',' ORDER BY x) FROM unnest(string_to_array(string_agg(sku, ','), ',')) x), (SELECT sum(x) FROM unnest(array_agg(qty)) x), length(string_agg(sku::bytea, '|'::bytea)) FROM order_items WHERE qty > 1;

SELECT status, string_agg(order_id::text, ',' ORDER BY order_id) FROM orders WHERE customer_id < 5 GROUP BY status ORDER BY status;

SELECT customer_id % 3 AS r, array_agg(order_id ORDER BY order_id DESC) FROM orders WHERE customer_id BETWEEN 10 AND 14 GROUP BY 1 ORDER BY 1;

SELECT count(DISTINCT status), count(DISTINCT customer_id), count(*) FROM orders;

SELECT status, count(DISTINCT customer_id), sum(total), count(*) FROM orders GROUP BY status ORDER BY 1;

SELECT count(DISTINCT status) FILTER (WHERE total > 100), count(DISTINCT customer_id % 7) FROM orders;

SELECT count(*) FILTER (WHERE status = 'paid'), sum(total) FILTER (WHERE status <> 'new'), avg(total) FILTER (WHERE total > 100), max(total) FILTER (WHERE status = 'nope') FROM orders;

SELECT sku, count(*), array_agg(DISTINCT qty ORDER BY qty) FROM order_items GROUP BY sku ORDER BY 1 LIMIT 5;

SELECT customer_id, order_id, total FROM orders ORDER BY total DESC, order_id LIMIT 7;

SELECT customer_id, order_id, total FROM orders ORDER BY total DESC, order_id LIMIT 5 OFFSET 3;

SELECT total FROM orders ORDER BY total DESC FETCH FIRST 5 ROWS WITH TIES;

SELECT order_id FROM orders ORDER BY total DESC, order_id LIMIT 4;

SELECT customer_id, sum(total) AS s FROM orders GROUP BY customer_id ORDER BY s DESC, customer_id LIMIT 5;

SELECT customer_id FROM orders GROUP BY customer_id HAVING sum(total) > 1000 ORDER BY 1;

SELECT status, count(*) FROM orders GROUP BY status HAVING count(*) > 200 ORDER BY 1;

SELECT status FROM orders GROUP BY status HAVING avg(total) > 120 ORDER BY 1;

SELECT DISTINCT status FROM orders ORDER BY 1;

SELECT DISTINCT ON (status) status, order_id, total FROM orders ORDER BY status, total DESC, order_id;

SELECT DISTINCT count(*) FROM orders GROUP BY customer_id ORDER BY 1;

SELECT customer_id, order_id, rank() OVER (PARTITION BY customer_id ORDER BY total DESC, order_id), sum(total) OVER (PARTITION BY customer_id) FROM orders WHERE customer_id < 20 ORDER BY 1, 2;

SELECT status, rank() OVER (ORDER BY count(*) DESC, status) FROM orders GROUP BY status ORDER BY 1;

SELECT k.region, count(*), sum(o.total) FROM orders o JOIN customers cu USING (customer_id) JOIN countries k ON k.code = cu.country GROUP BY k.region ORDER BY 1;

SELECT o.status, count(*), sum(i.qty * i.price) FROM orders o JOIN order_items i ON i.customer_id = o.customer_id AND i.order_id = o.order_id GROUP BY o.status ORDER BY 1;

SELECT count(*), count(o.order_id) FROM customers c LEFT JOIN orders o ON o.customer_id = c.customer_id AND o.total > 200;

SELECT k.code, count(cu.customer_id) FROM countries k LEFT JOIN customers cu ON cu.country = k.code GROUP BY k.code ORDER BY 1;

SELECT count(*) FROM orders o JOIN order_items i ON i.order_id = o.order_id;

SELECT status, count(*) FROM (SELECT o.status, o.total FROM orders o JOIN customers c ON c.customer_id = o.customer_id WHERE c.country = 'DE') s GROUP BY status ORDER BY 1;

SELECT count(*), max(n), min(n) FROM (SELECT customer_id, count(*) AS n FROM orders GROUP BY customer_id) s;

SELECT status, sum(total) / count(*) AS mean, max(total) - min(total) AS spread FROM orders GROUP BY status ORDER BY 1;

SELECT date_trunc('month', ordered_at) AS m, count(*), sum(total) FROM orders GROUP BY 1 ORDER BY 1;

SELECT count(*), sum(total), avg(total), max(total), bool_and(true) FROM orders WHERE total < 0;

SELECT status, count(*) FROM orders WHERE total < 0 GROUP BY status;

SELECT country, count(*) FROM customers GROUP BY country ORDER BY country NULLS FIRST;

SELECT min(name), max(name), min(created), max(created) FROM customers;

SELECT count(*) FROM customers WHERE country IN (SELECT code FROM countries WHERE region = 'EU');

SELECT count(*) FROM customers c WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = c.customer_id AND o.total > 240);

SELECT s.category, sum(i.qty) FROM order_items i JOIN skus s USING (sku) GROUP BY 1 ORDER BY 1;

SELECT c.country, count(DISTINCT o.status), sum(o.total) FILTER (WHERE o.status = 'paid') FROM customers c JOIN orders o ON o.customer_id = c.customer_id GROUP BY c.country ORDER BY 1 NULLS LAST;

SELECT o.customer_id, count(*) FROM orders o JOIN order_items i USING (customer_id, order_id) GROUP BY o.customer_id ORDER BY 2 DESC, 1 LIMIT 3;

-- error: division by zero in the final query (same SQLSTATE expected)
SELECT status, 1 / (count(*) - count(*)) FROM orders GROUP BY status;

-- Row locks (issue 16): by key the statement runs whole on the worker and
-- locks there; across shards it runs over postgres_fdw, which locks remotely.
SELECT order_id, total FROM orders WHERE customer_id = 42 ORDER BY order_id FOR UPDATE;

SELECT o.order_id, c.name, k.region FROM orders o JOIN customers c USING (customer_id) JOIN countries k ON k.code = c.country WHERE o.customer_id = 7 ORDER BY 1 FOR UPDATE OF o;

SELECT order_id, status FROM orders WHERE customer_id = 99 ORDER BY order_id FOR SHARE NOWAIT;

SELECT customer_id, count(*) FROM (SELECT customer_id FROM orders WHERE customer_id = 150 FOR UPDATE SKIP LOCKED) locked GROUP BY customer_id;

SELECT customer_id, order_id FROM orders WHERE total > 400 ORDER BY customer_id, order_id FOR UPDATE;

SELECT customer_id, order_id FROM orders WHERE status = 'paid' AND total < 20 ORDER BY 1, 2 FOR KEY SHARE;

BEGIN;
SELECT order_id, total FROM orders WHERE customer_id = 3 ORDER BY order_id FOR UPDATE;
UPDATE orders SET total = total + 1 WHERE customer_id = 3 RETURNING order_id, total;
SELECT order_id, total FROM orders WHERE customer_id = 3 ORDER BY order_id FOR NO KEY UPDATE;
ROLLBACK;

-- Multi-shard DML shapes (issue 16): one statement per shard group, all
-- nodes at once; each block's effect is checked by the block after it.
UPDATE orders SET total = total + 0.5 WHERE status = 'paid' AND total < 50 RETURNING customer_id, order_id, total;

SELECT status, count(*), sum(total) FROM orders GROUP BY status ORDER BY 1;

UPDATE orders o SET status = 'eu' FROM customers c, countries k WHERE c.customer_id = o.customer_id AND k.code = c.country AND k.region = 'EU' AND o.total > 200;

SELECT status, count(*), sum(total) FROM orders GROUP BY status ORDER BY 1;

UPDATE order_items i SET qty = i.qty * 2 WHERE EXISTS (SELECT 1 FROM orders o WHERE o.customer_id = i.customer_id AND o.order_id = i.order_id AND o.status = 'eu');

SELECT count(*), sum(qty) FROM order_items;

UPDATE customers c SET name = name || '*' WHERE customer_id IN (SELECT customer_id FROM orders GROUP BY customer_id HAVING count(*) > 5);

SELECT count(*) FROM customers WHERE name LIKE '%*';

INSERT INTO order_items SELECT o.customer_id, o.order_id, 9, 'sku-9', 1, o.total / 10 FROM orders o WHERE o.status = 'eu' RETURNING customer_id, order_id, price;

SELECT count(*), sum(price) FROM order_items WHERE item_no = 9;

INSERT INTO order_items SELECT customer_id, order_id, 9, 'sku-9', 5, 1 FROM order_items WHERE item_no = 9 ON CONFLICT (customer_id, order_id, item_no) DO UPDATE SET qty = order_items.qty + excluded.qty;

SELECT count(*), sum(qty) FROM order_items WHERE item_no = 9;

DELETE FROM order_items i USING orders o WHERE o.customer_id = i.customer_id AND o.order_id = i.order_id AND o.status = 'eu' AND i.item_no = 9 RETURNING i.customer_id, i.order_id;

DELETE FROM order_items WHERE item_no = 9;

UPDATE orders SET status = 'paid' WHERE status = 'eu';

SELECT status, count(*), sum(total) FROM orders GROUP BY status ORDER BY 1;

-- error: a CHECK-like failure on one shard changes nothing (same SQLSTATE expected)
UPDATE orders SET total = total / (CASE WHEN customer_id = 77 THEN 0 ELSE 1 END);

SELECT count(*), sum(total) FROM orders;
