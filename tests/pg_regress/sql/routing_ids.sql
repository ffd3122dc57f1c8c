-- Self-routing ids: pg_shard.next_id(table, key) makes a bigint that carries
-- the top 10 bits of the key's keyspace id; set_routing_id declares a column
-- of them, and `column = id` is then pruned to the shard of that prefix.
CREATE TABLE rid_orders (customer_id bigint NOT NULL, order_id bigint NOT NULL,
                         amount int NOT NULL, PRIMARY KEY (customer_id, order_id));
SELECT pg_shard.create_distributed_table('rid_orders', 'customer_id', shard_count => 4,
                                         colocate_with => 'none');

-- The layout: 0 | 41 bits of ms since 2026-01-01 UTC | 10 bits prefix | 12 bits
-- sequence, the prefix being the top 10 bits of the key's keyspace id (whose
-- signed form has its top bit flipped: prefix = signed >> 54, plus 512).
SELECT pg_shard.next_id('rid_orders', 42::bigint) AS id \gset
SELECT :id > 0 AS positive,
       pg_shard.id_prefix(:id) = pg_shard.key_prefix(42::bigint) AS carries_key_prefix,
       pg_shard.key_prefix(42::bigint) = (pg_shard.keyspace_id(42::bigint) >> 54) + 512 AS top_ten_bits,
       :id = (((extract(epoch FROM pg_shard.id_time(:id)) * 1000)::bigint - 1767225600000) << 22)
             | (pg_shard.id_prefix(:id)::bigint << 12) | (:id & 4095) AS formula,
       pg_shard.id_time(:id) BETWEEN now() - interval '1 minute' AND clock_timestamp() AS made_now,
       :id & 31 AS generator;
-- the same layout for keys all over the keyspace
SELECT count(*) AS keys,
       count(*) FILTER (WHERE pg_shard.id_prefix(pg_shard.next_id('rid_orders', g))
                              = (pg_shard.keyspace_id(g) >> 54) + 512) AS right_prefix,
       count(DISTINCT pg_shard.key_prefix(g)) > 600 AS spread
  FROM generate_series(1::bigint, 2000) g;
-- decoding known ids
SELECT pg_shard.id_prefix(0), pg_shard.id_time(0),
       pg_shard.id_prefix((5::bigint << 22) | (1023 << 12) | 4095),
       pg_shard.id_time((1000::bigint << 22) | (7 << 12));
-- more than 128 ids per millisecond for one prefix (the counter's share of
-- the sequence) borrow the next milliseconds: all distinct and increasing
SELECT count(*) AS ids, count(DISTINCT id) AS distinct_ids,
       bool_and(id > previous) AS increasing
  FROM (SELECT id, lag(id) OVER (ORDER BY n) AS previous
          FROM (SELECT n, pg_shard.next_id('rid_orders', 7::bigint) AS id
                  FROM generate_series(1, 20000) n) ids) s;
-- integer keys of any width carry the same prefix; text keys are refused for
-- an integer table, and so are NULL keys and tables that are not distributed
SELECT pg_shard.id_prefix(pg_shard.next_id('rid_orders', 42::int)) = pg_shard.key_prefix(42::bigint) AS int4_key;
SELECT pg_shard.next_id('rid_orders', 'abc'::text);
SELECT pg_shard.next_id('rid_orders', NULL::bigint);
CREATE TABLE rid_local (id bigint);
SELECT pg_shard.next_id('rid_local', 1::bigint);
SELECT pg_shard.id_prefix(-1);

-- set_routing_id: refused for a column that is not bigint, the distribution
-- column, an unknown column, a reference table and a group whose shard
-- boundaries are not multiples of 2^54 (3 shards)
ALTER TABLE rid_orders ADD COLUMN note text;
SELECT pg_shard.set_routing_id('rid_orders', 'note');
SELECT pg_shard.set_routing_id('rid_orders', 'customer_id');
SELECT pg_shard.set_routing_id('rid_orders', 'nope');
SELECT pg_shard.set_routing_id('rid_local', 'id');
CREATE TABLE rid_three (k bigint PRIMARY KEY, id bigint);
SELECT pg_shard.create_distributed_table('rid_three', 'k', shard_count => 3, colocate_with => 'none');
SELECT pg_shard.set_routing_id('rid_three', 'id');
SELECT routing_attnum FROM pg_shard.logical_table WHERE table_rel = 'rid_three'::regclass;
DROP TABLE rid_three;

-- rows with ids of their own key's prefix, then the declaration: a CHECK on
-- every shard, and a new map version for the routers
INSERT INTO rid_orders (customer_id, order_id, amount)
SELECT c, pg_shard.next_id('rid_orders', c), c * 10 + n
  FROM generate_series(1::bigint, 200) c, generate_series(1, 5) n;
SELECT pg_shard.map_version() AS version_before \gset
SELECT pg_shard.set_routing_id('rid_orders', 'order_id');
SELECT pg_shard.map_version() = :version_before + 1 AS new_version;
SELECT pg_shard.set_routing_id('rid_orders', 'order_id');
-- a row whose id names another key's prefix would be lost to reads by id:
-- the shard refuses it
INSERT INTO rid_orders
VALUES (1, (1000::bigint << 22) | (((pg_shard.key_prefix(1::bigint) + 1) % 1024)::bigint << 12), 0);
-- a table whose rows break the rule cannot be declared
CREATE TABLE rid_bad (k bigint PRIMARY KEY, id bigint);
INSERT INTO rid_bad VALUES (1, 5), (2, pg_shard.next_id('rid_orders', 2::bigint));
SELECT pg_shard.create_distributed_table('rid_bad', 'k', shard_count => 4, colocate_with => 'none');
SELECT pg_shard.set_routing_id('rid_bad', 'id');
DROP TABLE rid_bad;

-- pruning on the metadata node: `order_id = value` scans one shard
SELECT order_id AS some_order, customer_id AS its_customer, amount AS its_amount
  FROM rid_orders WHERE customer_id = 77 ORDER BY order_id LIMIT 1 \gset
CREATE FUNCTION rid_partitions(query text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    line text;
    scans bigint := 0;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || query LOOP
        IF line ~ 'Scan on rid_orders_' THEN
            scans := scans + 1;
        END IF;
    END LOOP;
    RETURN scans;
END $$;
SELECT rid_partitions(format('SELECT * FROM rid_orders WHERE order_id = %s', :some_order)) AS by_id,
       rid_partitions('SELECT * FROM rid_orders WHERE amount = 5') AS by_other_column;
SELECT customer_id = :its_customer AS found, amount = :its_amount AS same_row
  FROM rid_orders WHERE order_id = :some_order;
PREPARE rid_by_id(bigint) AS SELECT customer_id FROM rid_orders WHERE order_id = $1;
EXECUTE rid_by_id(:some_order);
-- a negative id matches no row (no generator makes one)
SELECT count(*) FROM rid_orders WHERE order_id = -5;
-- every order is found by its id
SELECT count(*) AS orders,
       count(*) FILTER (WHERE (SELECT count(*) FROM rid_orders i WHERE i.order_id = o.order_id) = 1) AS found
  FROM rid_orders o;

-- splits keep boundaries at multiples of 2^54: the middle is rounded to
-- one, and another split point is refused with a hint
SELECT shard_id AS rid_shard, range_start AS rid_start, range_end AS rid_end
  FROM pg_shard.shards WHERE table_name = 'rid_orders'::regclass ORDER BY range_start LIMIT 1 \gset
SELECT pg_shard.split_shard(:rid_shard, :rid_start + 12345);
SET pg_shard.move_drop_delay = 0;
SELECT pg_shard.split_shard(:rid_shard) AS rid_job \gset
SELECT pg_shard.wait_job(:rid_job, '2 minutes');
SELECT state, split_at % (2::numeric ^ 54) = 0 AS aligned FROM pg_shard.jobs WHERE job_id = :rid_job;
SELECT count(*) AS shards, bool_and(range_start % 18014398509481984 = 0) AS all_aligned
  FROM pg_shard.shards WHERE table_name = 'rid_orders'::regclass;
SELECT count(*) AS orders,
       count(*) FILTER (WHERE (SELECT count(*) FROM rid_orders i WHERE i.order_id = o.order_id) = 1) AS found
  FROM rid_orders o;
SELECT rid_partitions(format('SELECT * FROM rid_orders WHERE order_id = %s', :some_order)) AS by_id_after_split;

-- the routing column's DDL: a rename keeps the declaration (a new map for
-- the routers); dropping it or changing its type is refused
SELECT pg_shard.map_version() AS version_before \gset
ALTER TABLE rid_orders RENAME COLUMN order_id TO id;
SELECT pg_shard.map_version() = :version_before + 1 AS new_version;
SELECT rid_partitions(format('SELECT * FROM rid_orders WHERE id = %s', :some_order)) AS by_renamed_id;
ALTER TABLE rid_orders DROP COLUMN id;
ALTER TABLE rid_orders ALTER COLUMN id TYPE numeric;
-- NULL removes the declaration and the CHECK
SELECT pg_shard.set_routing_id('rid_orders', NULL);
SELECT routing_attnum FROM pg_shard.logical_table WHERE table_rel = 'rid_orders'::regclass;
SELECT rid_partitions(format('SELECT * FROM rid_orders WHERE id = %s', :some_order)) AS scatter_again;
INSERT INTO rid_orders VALUES (1, 5, 0);
SELECT count(*) FROM rid_orders WHERE id = 5;

-- a worker makes ids with its own generator number (its node id) in the
-- sequence's low 5 bits, so no two nodes make the same id
SELECT node_id AS rid_node, format('dbname=%s host=127.0.0.1 port=%s', current_database(), port) AS rid_dsn
  FROM pg_shard.node ORDER BY node_id LIMIT 1 \gset
\c :rid_dsn
SELECT shard_rel AS rid_shard_table FROM pg_shard.local_shard WHERE shard_rel::text LIKE 'rid_orders%' LIMIT 1 \gset
SELECT pg_shard.next_id(:'rid_shard_table', 42::bigint) & 31 = :rid_node AS workers_generator,
       pg_shard.id_prefix(pg_shard.next_id(:'rid_shard_table', 42::bigint)) = pg_shard.key_prefix(42::bigint) AS same_prefix;
SELECT node_id = :rid_node AS recorded FROM pg_shard.local_node;
-- the shards no longer hold the CHECK after set_routing_id(…, NULL)
SELECT count(*) AS routing_checks FROM pg_constraint
 WHERE conrelid IN (SELECT shard_rel FROM pg_shard.local_shard) AND conname LIKE 'rid_orders%routes';
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
DROP FUNCTION rid_partitions(text);
DROP TABLE rid_orders, rid_local;
