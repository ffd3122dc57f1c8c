-- Keyspace ids: BLAKE2b-64 of the canonical key encoding, shown in SQL in the
-- order-preserving signed form (unsigned id with its top bit flipped).
CREATE FUNCTION ks_unsigned(bigint) RETURNS numeric
    LANGUAGE sql IMMUTABLE AS $$ SELECT $1::numeric + 9223372036854775808 $$;

-- the design's vectors
SELECT ks_unsigned(pg_shard.keyspace_id(0::bigint))  AS "0",
       ks_unsigned(pg_shard.keyspace_id(1::bigint))  AS "1",
       ks_unsigned(pg_shard.keyspace_id(42::bigint)) AS "42",
       ks_unsigned(pg_shard.keyspace_id(-1::bigint)) AS "-1";
SELECT ks_unsigned(pg_shard.keyspace_id('acme'::text)) AS acme,
       ks_unsigned(pg_shard.keyspace_id(''::text))     AS empty,
       ks_unsigned(pg_shard.keyspace_id('123e4567-e89b-12d3-a456-426614174000'::uuid)) AS uuid;

-- integer widths agree; varchar agrees with text; an untyped literal is text
SELECT pg_shard.keyspace_id(42::int2) = pg_shard.keyspace_id(42::int8) AS int2_int8,
       pg_shard.keyspace_id(42::int4) = pg_shard.keyspace_id(42::int8) AS int4_int8,
       pg_shard.keyspace_id('acme'::varchar(10)) = pg_shard.keyspace_id('acme'::text) AS varchar_text,
       pg_shard.keyspace_id('acme') = pg_shard.keyspace_id('acme'::text) AS unknown_text;

-- bytea is hashed as is: 'acme' as bytes hashes like 'acme' as text
SELECT pg_shard.keyspace_id('\x61636d65'::bytea) = pg_shard.keyspace_id('acme'::text) AS bytea_as_is;

-- a domain hashes like its base type; a long (toasted) text works
CREATE DOMAIN customer_key AS bigint CHECK (VALUE > 0);
SELECT pg_shard.keyspace_id(42::customer_key) = pg_shard.keyspace_id(42::bigint) AS domain_key;
SELECT pg_shard.keyspace_id(repeat('x', 100000)) = pg_shard.keyspace_id(repeat('x', 100000)::varchar) AS long_text;

-- the signed form preserves the unsigned order
SELECT bool_and((a < b) = (ks_unsigned(a) < ks_unsigned(b))) AS order_preserved
FROM (SELECT pg_shard.keyspace_id(g::bigint) AS a, pg_shard.keyspace_id(g::bigint + 1) AS b
      FROM generate_series(1, 2000) g) pairs;

-- arrays of keys, element by element
SELECT pg_shard.keyspace_ids(ARRAY[42, NULL, 1]::bigint[]) =
       ARRAY[pg_shard.keyspace_id(42::bigint), NULL, pg_shard.keyspace_id(1::bigint)] AS keyspace_ids;
SELECT pg_shard.keyspace_ids(ARRAY['acme']) = ARRAY[pg_shard.keyspace_id('acme')] AS text_ids;
SELECT pg_shard.keyspace_ids(ARRAY[1.5]);

-- NULL in, NULL out
SELECT pg_shard.keyspace_id(NULL::bigint) IS NULL AS null_key;

-- unsupported types get a clear error naming the supported ones
SELECT pg_shard.keyspace_id(1.5);
SELECT pg_shard.keyspace_id(now());
SELECT pg_shard.keyspace_id('c'::char(3));
-- nth_keyspace_id: the n-th smallest distinct keyspace id of an array's
-- non-null elements (used for `key = ANY($1)` in generic plans)
SELECT n, pg_shard.nth_keyspace_id('{42, 1, NULL, 42}'::bigint[], n) IS NOT DISTINCT FROM
       (SELECT id FROM (SELECT DISTINCT pg_shard.keyspace_id(k) AS id FROM unnest('{42, 1}'::bigint[]) AS k) AS ids
        ORDER BY id OFFSET n - 1 LIMIT 1) AS agrees
FROM generate_series(1, 3) AS n;
SELECT pg_shard.nth_keyspace_id('{a, b}'::text[], 0) IS NULL AS zero,
       pg_shard.nth_keyspace_id('{}'::text[], 1) IS NULL AS empty,
       pg_shard.nth_keyspace_id('{a}'::text[], 1) = pg_shard.keyspace_id('a') AS text_key;
