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

-- not taken: count is 0 over no rows (a join would drop those parts), and a
-- distributed table outside the sublinks; both still right over postgres_fdw
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
