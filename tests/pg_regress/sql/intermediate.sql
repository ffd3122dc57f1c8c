-- Intermediate results: a statement whose distributed tables are all in
-- sublinks compared with it by other columns than their key. Each such
-- sublink's rows are computed first by a statement of their own (pushed
-- down), and the rest runs on the metadata node. Every answer is checked
-- against local copies of the same rows.
CREATE TABLE im_parts (part_id int PRIMARY KEY, name text NOT NULL, kind text);
CREATE TABLE im_lines (order_id bigint, line int, part_id int, qty numeric(8,2), PRIMARY KEY (order_id, line));
CREATE TABLE im_kinds (kind text PRIMARY KEY, heavy bool NOT NULL);
SELECT pg_shard.create_distributed_table('im_lines', 'order_id', shard_count => 4);
SELECT pg_shard.create_reference_table('im_parts');
SELECT pg_shard.create_reference_table('im_kinds');
INSERT INTO im_kinds VALUES ('bolt', true), ('nut', false), ('gear', true);
INSERT INTO im_parts SELECT p, 'part ' || p, (ARRAY['bolt', 'nut', 'gear', NULL])[1 + p % 4] FROM generate_series(1, 30) p;
INSERT INTO im_lines SELECT o, l, 1 + (o * 7 + l * 3) % 24, ((o + l) % 9) + 0.5
  FROM generate_series(1, 60) o, generate_series(1, 3) l;
INSERT INTO im_lines VALUES (61, 1, NULL, 4), (62, 1, 5, NULL);
CREATE TABLE im_lines_local AS SELECT * FROM im_lines;
CREATE TABLE im_parts_local AS SELECT * FROM im_parts;

-- NOT EXISTS by part: parts no line names (25-30), read as an anti-join
EXPLAIN (COSTS OFF)
SELECT part_id FROM im_parts p WHERE NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = p.part_id AND l.qty > 1);
SELECT part_id FROM im_parts p WHERE NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = p.part_id AND l.qty > 1) ORDER BY 1;
SELECT part_id FROM im_parts_local p WHERE NOT EXISTS (SELECT 1 FROM im_lines_local l WHERE l.part_id = p.part_id AND l.qty > 1) ORDER BY 1;
-- EXISTS inside a subquery in FROM, grouped above it
SELECT kind, count(*) FROM (SELECT * FROM im_parts p WHERE EXISTS (SELECT FROM im_lines l WHERE l.part_id = p.part_id AND l.order_id < 10)) s GROUP BY kind ORDER BY kind;
SELECT kind, count(*) FROM (SELECT * FROM im_parts_local p WHERE EXISTS (SELECT FROM im_lines_local l WHERE l.part_id = p.part_id AND l.order_id < 10)) s GROUP BY kind ORDER BY kind;

-- a comparison with an aggregate of the matching lines: the aggregate
-- grouped by part and joined; the IN on a reference table restricts the
-- grouped statement too
EXPLAIN (COSTS OFF)
SELECT part_id, name FROM im_parts p
 WHERE p.kind IN (SELECT kind FROM im_kinds WHERE heavy)
   AND p.part_id / 2 < (SELECT 0.5 * sum(qty) FROM im_lines l WHERE l.part_id = p.part_id AND l.line < 3);
SELECT part_id, name FROM im_parts p
 WHERE p.kind IN (SELECT kind FROM im_kinds WHERE heavy)
   AND p.part_id / 2 < (SELECT 0.5 * sum(qty) FROM im_lines l WHERE l.part_id = p.part_id AND l.line < 3) ORDER BY 1;
SELECT part_id, name FROM im_parts_local p
 WHERE p.kind IN (SELECT kind FROM im_kinds WHERE heavy)
   AND p.part_id / 2 < (SELECT 0.5 * sum(qty) FROM im_lines_local l WHERE l.part_id = p.part_id AND l.line < 3) ORDER BY 1;
-- avg, parts without lines included (no group: the comparison is NULL)
SELECT count(*), sum(part_id) FROM im_parts p WHERE 4 < (SELECT avg(qty) FROM im_lines l WHERE l.part_id = p.part_id);
SELECT count(*), sum(part_id) FROM im_parts_local p WHERE 4 < (SELECT avg(qty) FROM im_lines_local l WHERE l.part_id = p.part_id);
-- the intermediate result read again for every outer row (a rescan)
SELECT count(*) FROM generate_series(1, 3) g, LATERAL (SELECT part_id FROM im_parts p WHERE g < p.part_id AND NOT EXISTS (SELECT FROM im_lines l WHERE l.part_id = p.part_id)) x;
SELECT count(*) FROM generate_series(1, 3) g, LATERAL (SELECT part_id FROM im_parts_local p WHERE g < p.part_id AND NOT EXISTS (SELECT FROM im_lines_local l WHERE l.part_id = p.part_id)) x;

-- not taken: count is 0 over no rows (a join would drop those parts); still
-- right over postgres_fdw. A distributed table outside the sublinks is read
-- as an intermediate result of its own (below).
CREATE FUNCTION im_reads_intermediate(statement text) RETURNS bool LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || statement LOOP
        IF line LIKE '%pg_shard Intermediate Result%' THEN
            RETURN true;
        END IF;
    END LOOP;
    RETURN false;
END
$$;
SELECT im_reads_intermediate('SELECT part_id FROM im_parts p WHERE 1 > (SELECT count(*) FROM im_lines l WHERE l.part_id = p.part_id)');
SELECT im_reads_intermediate('SELECT count(*) FROM im_lines a WHERE NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = a.part_id)');
SELECT im_reads_intermediate('SELECT count(*) FROM im_parts p WHERE NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = p.part_id)');
SELECT part_id FROM im_parts p WHERE 1 > (SELECT count(*) FROM im_lines l WHERE l.part_id = p.part_id) ORDER BY 1;
SELECT part_id FROM im_parts_local p WHERE 1 > (SELECT count(*) FROM im_lines_local l WHERE l.part_id = p.part_id) ORDER BY 1;
SELECT count(*) FROM im_lines a WHERE a.line = 1 AND NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = a.part_id AND l.line = 2);
SELECT count(*) FROM im_lines_local a WHERE a.line = 1 AND NOT EXISTS (SELECT 1 FROM im_lines_local l WHERE l.part_id = a.part_id AND l.line = 2);

-- a distributed table beside the sublink (TPC-H q17's shape): its rows are
-- an intermediate result too, restricted by its own conditions and, through
-- its equality with im_parts, by the conditions on im_parts; the whole
-- statement then runs on the metadata node
EXPLAIN (COSTS OFF, VERBOSE)
SELECT sum(l.qty), count(*) FROM im_lines l, im_parts p
 WHERE p.part_id = l.part_id AND p.kind = 'bolt' AND l.line <> 3
   AND l.qty < (SELECT 1.2 * avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id);
SELECT sum(l.qty), count(*) FROM im_lines l, im_parts p
 WHERE p.part_id = l.part_id AND p.kind = 'bolt' AND l.line <> 3
   AND l.qty < (SELECT 1.2 * avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id);
SELECT sum(l.qty), count(*) FROM im_lines_local l, im_parts_local p
 WHERE p.part_id = l.part_id AND p.kind = 'bolt' AND l.line <> 3
   AND l.qty < (SELECT 1.2 * avg(qty) FROM im_lines_local l2 WHERE l2.part_id = p.part_id);
-- the sublink compared with the outer distributed table's own column: every
-- group computed, the outer table read whole
SELECT count(*), sum(order_id) FROM im_lines a WHERE a.qty > (SELECT avg(qty) FROM im_lines l WHERE l.part_id = a.part_id);
SELECT count(*), sum(order_id) FROM im_lines_local a WHERE a.qty > (SELECT avg(qty) FROM im_lines_local l WHERE l.part_id = a.part_id);
SELECT count(*) FROM im_lines a WHERE a.line = 1 AND NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = a.part_id AND l.line = 2);
SELECT count(*) FROM im_lines_local a WHERE a.line = 1 AND NOT EXISTS (SELECT 1 FROM im_lines_local l WHERE l.part_id = a.part_id AND l.line = 2);
-- a parameter in a condition on the outer table: applied on the metadata node
PREPARE im_lines_above(int) AS
  SELECT count(*) FROM im_lines l, im_parts p WHERE p.part_id = l.part_id AND p.kind = 'nut' AND l.order_id > $1
     AND l.qty <= (SELECT avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id);
EXECUTE im_lines_above(10);
EXECUTE im_lines_above(40);
SELECT count(*) FROM im_lines_local l, im_parts_local p WHERE p.part_id = l.part_id AND p.kind = 'nut' AND l.order_id > 40
   AND l.qty <= (SELECT avg(qty) FROM im_lines_local l2 WHERE l2.part_id = p.part_id);
DEALLOCATE im_lines_above;
-- a condition that reads the outer table and another one (OR) stays in the
-- statement on the metadata node; only conditions on the table alone, or a
-- whole IN on a reference table, go into its intermediate statement
SELECT count(*), sum(l.qty) FROM im_lines l, im_parts p
 WHERE p.part_id = l.part_id AND (l.part_id IN (SELECT part_id FROM im_parts WHERE kind = 'gear') OR p.kind = 'nut')
   AND l.qty <= (SELECT avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id);
SELECT count(*), sum(l.qty) FROM im_lines_local l, im_parts_local p
 WHERE p.part_id = l.part_id AND (l.part_id IN (SELECT part_id FROM im_parts_local WHERE kind = 'gear') OR p.kind = 'nut')
   AND l.qty <= (SELECT avg(qty) FROM im_lines_local l2 WHERE l2.part_id = p.part_id);
-- the whole IN goes into the outer table's intermediate statement
CREATE FUNCTION im_intermediate_queries(statement text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF, VERBOSE) ' || statement LOOP
        IF line LIKE '%FROM public.im_lines l' OR line LIKE '%WHERE%' THEN
            RETURN NEXT btrim(line);
        END IF;
    END LOOP;
END
$$;
SELECT im_intermediate_queries($$SELECT count(*), sum(l.qty) FROM im_lines l, im_parts p
 WHERE p.part_id = l.part_id AND l.part_id IN (SELECT part_id FROM im_parts WHERE kind = 'gear')
   AND l.qty <= (SELECT avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id)$$);
SELECT count(*), sum(l.qty) FROM im_lines l, im_parts p
 WHERE p.part_id = l.part_id AND l.part_id IN (SELECT part_id FROM im_parts WHERE kind = 'gear')
   AND l.qty <= (SELECT avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id);
SELECT count(*), sum(l.qty) FROM im_lines_local l, im_parts_local p
 WHERE p.part_id = l.part_id AND l.part_id IN (SELECT part_id FROM im_parts_local WHERE kind = 'gear')
   AND l.qty <= (SELECT avg(qty) FROM im_lines_local l2 WHERE l2.part_id = p.part_id);
-- a column of a NOT NULL domain the statement does not read (the result
-- holds NULL there)
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE DOMAIN public.im_grade AS int NOT NULL CHECK (VALUE > 0);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE DOMAIN public.im_grade AS int NOT NULL CHECK (VALUE > 0);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE DOMAIN public.im_grade AS int NOT NULL CHECK (VALUE > 0);
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE DOMAIN public.im_grade AS int NOT NULL CHECK (VALUE > 0);
CREATE TABLE im_graded (id bigint PRIMARY KEY, part_id int, grade im_grade);
SELECT pg_shard.create_distributed_table('im_graded', 'id', shard_count => 4);
INSERT INTO im_graded SELECT g, 1 + g % 30, 1 + g % 5 FROM generate_series(1, 100) g;
SELECT im_reads_intermediate('SELECT count(*) FROM im_graded g, im_parts p WHERE p.part_id = g.part_id AND p.kind = ''bolt'' AND g.id > (SELECT min(id) FROM im_graded g2 WHERE g2.part_id = p.part_id)');
SELECT count(*), sum(g.id) FROM im_graded g, im_parts p WHERE p.part_id = g.part_id AND p.kind = 'bolt' AND g.id > (SELECT min(id) FROM im_graded g2 WHERE g2.part_id = p.part_id);
CREATE TABLE im_graded_local AS SELECT * FROM im_graded;
SELECT count(*), sum(g.id) FROM im_graded_local g, im_parts_local p WHERE p.part_id = g.part_id AND p.kind = 'bolt' AND g.id > (SELECT min(id) FROM im_graded_local g2 WHERE g2.part_id = p.part_id);
DROP TABLE im_graded, im_graded_local;

-- not taken: the outer table inside a join (an outer join's conditions must
-- not move), or read as a whole row; still right over postgres_fdw
SELECT im_reads_intermediate('SELECT count(*) FROM im_parts p LEFT JOIN im_lines l ON l.part_id = p.part_id WHERE p.part_id < (SELECT max(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id)');
SELECT im_reads_intermediate('SELECT l FROM im_lines l, im_parts p WHERE p.part_id = l.part_id AND l.qty > (SELECT avg(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id)');
SELECT count(*) FROM im_parts p LEFT JOIN im_lines l ON l.part_id = p.part_id AND l.line = 2 WHERE p.part_id < (SELECT max(qty) FROM im_lines l2 WHERE l2.part_id = p.part_id);
SELECT count(*) FROM im_parts_local p LEFT JOIN im_lines_local l ON l.part_id = p.part_id AND l.line = 2 WHERE p.part_id < (SELECT max(qty) FROM im_lines_local l2 WHERE l2.part_id = p.part_id);

-- the values a restriction takes are computed first, on the metadata node:
-- up to 5,000 passed as an array, up to 50,000 as a set, more lift it
CREATE TABLE im_keys (k int PRIMARY KEY, band int NOT NULL);
CREATE TABLE im_hits (id bigint PRIMARY KEY, k int);
SELECT pg_shard.create_reference_table('im_keys');
SELECT pg_shard.create_distributed_table('im_hits', 'id', shard_count => 4);
INSERT INTO im_keys SELECT g, CASE WHEN g <= 100 THEN 1 WHEN g <= 6000 THEN 2 ELSE 3 END FROM generate_series(1, 60000) g;
INSERT INTO im_hits SELECT g, (g * 7) % 70000 FROM generate_series(1, 20000) g;
CREATE TABLE im_hits_local AS SELECT * FROM im_hits;
CREATE FUNCTION im_restrictions(statement text) RETURNS SETOF text LANGUAGE plpgsql AS $$
DECLARE
    line text;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) ' || statement LOOP
        IF line LIKE '%Restriction Values%' THEN
            RETURN NEXT regexp_replace(line, ' in [0-9.]+ ms', '');
        END IF;
    END LOOP;
END
$$;
SELECT im_restrictions('SELECT count(*) FROM im_keys x WHERE x.band = 1 AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k)');
SELECT im_restrictions('SELECT count(*) FROM im_keys x WHERE x.band <= 2 AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k)');
SELECT im_restrictions('SELECT count(*) FROM im_keys x WHERE NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k)');
SELECT band, count(*) FROM im_keys x WHERE x.band <= 2 AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k) GROUP BY band ORDER BY band;
SELECT band, count(*) FROM im_keys x WHERE x.band <= 2 AND NOT EXISTS (SELECT 1 FROM im_hits_local h WHERE h.k = x.k) GROUP BY band ORDER BY band;
SELECT band, count(*) FROM im_keys x WHERE EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k) GROUP BY band ORDER BY band;
SELECT band, count(*) FROM im_keys x WHERE EXISTS (SELECT 1 FROM im_hits_local h WHERE h.k = x.k) GROUP BY band ORDER BY band;
-- an EXISTS whose level reads reference tables alone is restricted by all
-- of that level's other conditions (TPC-H q22: a comparison with an
-- average of reference tables; an OR with another table): the 2,950 keys
-- of band 2 above its average key, and those or the 99 below 100
SELECT im_restrictions('SELECT count(*) FROM im_keys x WHERE x.band <= 2 AND x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k)');
SELECT count(*), sum(k) FROM im_keys x WHERE x.band <= 2 AND x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k);
SELECT count(*), sum(k) FROM im_keys x WHERE x.band <= 2 AND x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) AND NOT EXISTS (SELECT 1 FROM im_hits_local h WHERE h.k = x.k);
SELECT im_restrictions('SELECT count(*) FROM im_keys x, im_keys y WHERE y.k = x.k + 1 AND (x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) OR y.band = 1) AND x.band <= 2 AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k)');
SELECT count(*) FROM im_keys x, im_keys y WHERE y.k = x.k + 1 AND (x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) OR y.band = 1) AND x.band <= 2 AND NOT EXISTS (SELECT 1 FROM im_hits h WHERE h.k = x.k);
SELECT count(*) FROM im_keys x, im_keys y WHERE y.k = x.k + 1 AND (x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) OR y.band = 1) AND x.band <= 2 AND NOT EXISTS (SELECT 1 FROM im_hits_local h WHERE h.k = x.k);
-- a distributed table beside a sublink, restricted through a reference
-- table whose own conditions hold such a comparison: 2,950 values for
-- both intermediate statements; not the OR with another table's column
SELECT im_restrictions('SELECT count(*), sum(h.id) FROM im_hits h, im_keys x WHERE x.k = h.k AND x.band = 2 AND x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) AND h.id > (SELECT min(id) FROM im_hits h2 WHERE h2.k = x.k)');
SELECT count(*), sum(h.id) FROM im_hits h, im_keys x WHERE x.k = h.k AND x.band = 2 AND x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) AND h.id > (SELECT min(id) FROM im_hits h2 WHERE h2.k = x.k);
SELECT count(*), sum(h.id) FROM im_hits_local h, im_keys x WHERE x.k = h.k AND x.band = 2 AND x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) AND h.id > (SELECT min(id) FROM im_hits_local h2 WHERE h2.k = x.k);
SELECT im_restrictions('SELECT count(*) FROM im_hits h, im_keys x, im_keys y WHERE x.k = h.k AND y.k = x.k + 1 AND x.band = 2 AND (x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) OR y.band = 3) AND h.id > (SELECT min(id) FROM im_hits h2 WHERE h2.k = x.k)');
SELECT count(*) FROM im_hits h, im_keys x, im_keys y WHERE x.k = h.k AND y.k = x.k + 1 AND x.band = 2 AND (x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) OR y.band = 3) AND h.id > (SELECT min(id) FROM im_hits h2 WHERE h2.k = x.k);
SELECT count(*) FROM im_hits_local h, im_keys x, im_keys y WHERE x.k = h.k AND y.k = x.k + 1 AND x.band = 2 AND (x.k > (SELECT avg(k) FROM im_keys WHERE band = 2) OR y.band = 3) AND h.id > (SELECT min(id) FROM im_hits_local h2 WHERE h2.k = x.k);
-- a table beside the sublink, restricted through im_keys by 5,900 values
SELECT count(*), sum(h.id) FROM im_hits h, im_keys x WHERE x.k = h.k AND x.band = 2
   AND h.id > (SELECT min(id) FROM im_hits h2 WHERE h2.k = x.k);
SELECT count(*), sum(h.id) FROM im_hits_local h, im_keys x WHERE x.k = h.k AND x.band = 2
   AND h.id > (SELECT min(id) FROM im_hits_local h2 WHERE h2.k = x.k);
DROP FUNCTION im_restrictions(text);
DROP TABLE im_keys, im_hits, im_hits_local;

-- in a transaction: the intermediate statement sees the transaction's own
-- writes; an error in it (division by zero in the aggregate) is the statement's
BEGIN;
INSERT INTO im_lines VALUES (70, 1, 30, 8);
SELECT part_id FROM im_parts p WHERE NOT EXISTS (SELECT 1 FROM im_lines l WHERE l.part_id = p.part_id) ORDER BY 1;
ROLLBACK;
SELECT part_id FROM im_parts p WHERE 1 < (SELECT sum(qty) / (sum(qty) - sum(qty)) FROM im_lines l WHERE l.part_id = p.part_id);
-- a prepared statement, its parameter outside the sublink
PREPARE im_heavier(numeric) AS
  SELECT count(*) FROM im_parts p WHERE $1 < (SELECT max(qty) FROM im_lines l WHERE l.part_id = p.part_id);
EXECUTE im_heavier(5);
EXECUTE im_heavier(8);
SELECT count(*) FROM im_parts_local p WHERE 8 < (SELECT max(qty) FROM im_lines_local l WHERE l.part_id = p.part_id);
DEALLOCATE im_heavier;

DROP FUNCTION im_reads_intermediate(text);
DROP TABLE im_lines, im_parts, im_kinds, im_lines_local, im_parts_local;
