-- Every generated statement quotes identifiers and literals.
\pset null (null)
CREATE SCHEMA "Sales Data";
CREATE TABLE "Sales Data"."Order Items" (
    "select" text,
    "Line No" int,
    "it's" text CHECK ("it's" <> 'forbidden'),
    PRIMARY KEY ("select", "Line No"));
CREATE INDEX "Lower ""It's""" ON "Sales Data"."Order Items" (lower("it's")) WHERE "Line No" > 0;
CREATE UNIQUE INDEX ON "Sales Data"."Order Items" ("select", "it's");
INSERT INTO "Sales Data"."Order Items" VALUES
    ('back\slash', 1, E'tab\there'),
    (E'new\nline', 2, NULL),
    ('quote''s', 3, 'it''s "fine"'),
    ('"; DROP TABLE orders; --', 4, '\N'),
    ('ünïcødé', 5, E'cr\rlf');
CREATE TEMP TABLE quoted_before AS SELECT * FROM "Sales Data"."Order Items";
SELECT pg_shard.create_distributed_table('"Sales Data"."Order Items"', 'select', shard_count => 4);
SELECT table_name, shard_table, node_id FROM pg_shard.shards
WHERE table_name = '"Sales Data"."Order Items"'::regclass;
SELECT count(*) FROM ONLY "Sales Data"."Order Items";
-- SQL through the metadata node with a text key and quoted names
EXPLAIN (COSTS OFF) SELECT * FROM "Sales Data"."Order Items" WHERE "select" = 'quote''s';
SELECT "Line No", "it's" FROM "Sales Data"."Order Items" WHERE "select" IN ('quote''s', 'ünïcødé') ORDER BY 1;
-- orders still exists
SELECT count(*) > 0 AS orders_intact FROM pg_shard.shards WHERE table_name = 'orders'::regclass;

-- the shard tables hold exactly the original values, each row once
-- (4 shards round-robin over 3 workers: 100102 and 100105 on the first)
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
\d "Sales Data"."Order Items_100102"
SELECT * FROM "Sales Data"."Order Items_100102" UNION ALL SELECT * FROM "Sales Data"."Order Items_100105" ORDER BY 2;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
SELECT * FROM "Sales Data"."Order Items_100104" ORDER BY 2;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
SELECT * FROM "Sales Data"."Order Items_100103" ORDER BY 2;
-- the row trigger resolves the quoted column name: 'x' is in this shard's range, 'z' is not
INSERT INTO "Sales Data"."Order Items_100103" VALUES ('x', 99, 'y');
INSERT INTO "Sales Data"."Order Items_100103" VALUES ('z', 99, 'y');
\echo :SQLSTATE
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
