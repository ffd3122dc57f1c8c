-- Values the metadata node computes for a statement that runs on the
-- workers: parts that read no row but mean something else on a worker
-- (now(), nextval, CURRENT_USER, a user's function) are computed once when
-- the statement runs and sent as parameters (router) or literals (one
-- statement per shard group). A volatile one only where it runs once: a
-- cell of an INSERT's VALUES.
CREATE TABLE cv_events (tenant int NOT NULL, id bigserial, kind text,
                        at timestamptz NOT NULL DEFAULT now(), by_role name DEFAULT current_user,
                        PRIMARY KEY (tenant, id));
SELECT pg_shard.create_distributed_table('cv_events', 'tenant', shard_count => 4);
CREATE TABLE cv_copies (tenant int NOT NULL, id bigint, kind text, at timestamptz DEFAULT now(),
                        marked int DEFAULT 7, PRIMARY KEY (tenant, id));
SELECT pg_shard.create_distributed_table('cv_copies', 'tenant', colocate_with => 'cv_events');

-- the commonest INSERT: defaults from the clock and a sequence, on one node
EXPLAIN (COSTS OFF) INSERT INTO cv_events (tenant, kind) VALUES (1, 'a');
BEGIN;
INSERT INTO cv_events (tenant, kind) VALUES (1, 'a') RETURNING tenant, id, kind, at = now() AS at_now, by_role = current_user AS by_me;
INSERT INTO cv_events (tenant, kind) VALUES (1, 'b') RETURNING id, at = now() AS at_now;
SELECT currval('cv_events_id_seq') AS last_id;
COMMIT;
-- nextval ran once per row inserted (nothing taken twice, none skipped)
SELECT count(*) AS events, max(id) = currval('cv_events_id_seq') AS last_is_max FROM cv_events;
-- a sequence in the key, a volatile value in a cell: computed once each;
-- the key's value picks the shard when the statement runs
EXPLAIN (COSTS OFF) INSERT INTO cv_events (tenant, kind) VALUES (nextval('cv_events_id_seq')::int % 5 + 2, 'k');
INSERT INTO cv_events (tenant, kind, at) VALUES (nextval('cv_events_id_seq')::int % 5 + 2, 'k', clock_timestamp())
  RETURNING tenant = (id - 1) % 5 + 2 AS tenant_from_sequence, at >= now() AS at_after_start;
-- stable values anywhere: WHERE, SET, the target list, RETURNING
EXPLAIN (COSTS OFF) SELECT count(*) FROM cv_events WHERE tenant = 1 AND at > now() - interval '1 hour';
SELECT count(*) AS recent FROM cv_events WHERE tenant = 1 AND at > now() - interval '1 hour';
EXPLAIN (COSTS OFF) UPDATE cv_events SET at = now(), kind = kind || '!' WHERE tenant = 1 AND id = 1;
UPDATE cv_events SET kind = kind || '!' WHERE tenant = 1 AND id = 1 RETURNING kind, at <= now() AS not_later;
SET application_name = 'cv_app';
SELECT current_setting('application_name') AS app, current_user = by_role AS same_role
  FROM cv_events WHERE tenant = 1 AND id = 2;
RESET application_name;
-- the same value twice is one parameter: GROUP BY still matches the
-- select list on the node
EXPLAIN (COSTS OFF) SELECT lower(kind || current_user) FROM cv_events WHERE tenant = 1 GROUP BY kind || current_user;
SELECT lower(kind || current_user) = 'a!' || current_user AS grouped
  FROM cv_events WHERE tenant = 1 AND id = 1 GROUP BY kind || current_user;
-- a volatile call in a branch PostgreSQL may not take is not computed
-- ahead (the branch not taken, the sequence untouched)
CREATE SEQUENCE cv_untouched;
INSERT INTO cv_events (tenant, kind) VALUES (1, COALESCE('given', nextval('cv_untouched')::text));
INSERT INTO cv_events (tenant, kind)
  SELECT 1, CASE WHEN g > 0 THEN 'case' ELSE nextval('cv_untouched')::text END FROM generate_series(1, 1) g;
SELECT is_called AS sequence_used FROM cv_untouched;
DROP SEQUENCE cv_untouched;
-- values travel in a form the node reads back the same, whatever the
-- session's DateStyle
SET DateStyle = 'SQL, DMY';
INSERT INTO cv_events (tenant, kind) VALUES (1, 'dmy') RETURNING at = now() AS same_instant;
RESET DateStyle;
-- volatile where it may run once per row: another path, as before
EXPLAIN (COSTS OFF) SELECT random() > 2 FROM cv_events WHERE tenant = 1;
EXPLAIN (COSTS OFF) UPDATE cv_events SET id = nextval('cv_events_id_seq') WHERE tenant = 1;

-- a user's function and type: computed here, sent as text, cast back by
-- name on the node
CREATE TYPE cv_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
CREATE TYPE cv_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
CREATE TYPE cv_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
CREATE TYPE cv_mood AS ENUM ('calm', 'cross');
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
CREATE FUNCTION cv_current_mood() RETURNS cv_mood LANGUAGE sql STABLE AS $$ SELECT 'cross'::cv_mood $$;
CREATE TABLE cv_moods (tenant int PRIMARY KEY, mood cv_mood DEFAULT cv_current_mood());
SELECT pg_shard.create_distributed_table('cv_moods', 'tenant', colocate_with => 'cv_events');
EXPLAIN (COSTS OFF) INSERT INTO cv_moods (tenant) VALUES (1);
INSERT INTO cv_moods (tenant) VALUES (1) RETURNING tenant, mood;
SELECT tenant FROM cv_moods WHERE tenant = 1 AND mood = cv_current_mood();

-- many rows across shard groups: each row's defaults are its own values,
-- and the VALUES keep the target's column order whatever the statement's
EXPLAIN (COSTS OFF) INSERT INTO cv_events (kind, tenant) VALUES ('m', 2), ('m', 3);
INSERT INTO cv_events (kind, tenant) VALUES ('m', 2), ('m', 3), ('m', 4), ('m', 5)
  RETURNING tenant, kind, at = statement_timestamp() AS at_start, by_role = current_user AS by_me;
SELECT count(DISTINCT id) AS distinct_ids, max(id) = currval('cv_events_id_seq') AS last_is_max,
       count(DISTINCT at) AS one_clock
  FROM cv_events WHERE kind = 'm';
-- (a constant default too: the column is still filled)
INSERT INTO cv_copies (id, tenant) VALUES (1, 2), (2, 3);
SELECT tenant, id, marked, at IS NOT NULL AS has_at FROM cv_copies ORDER BY tenant;
-- INSERT … SELECT between co-located tables, columns in another order
EXPLAIN (COSTS OFF) INSERT INTO cv_copies (kind, id, tenant) SELECT kind, id, tenant FROM cv_events WHERE kind = 'm';
INSERT INTO cv_copies (kind, id, tenant) SELECT kind, id, tenant FROM cv_events WHERE kind = 'm';
SELECT count(*) AS copied, count(*) FILTER (WHERE marked = 7) AS with_defaults
  FROM cv_copies c JOIN cv_events e USING (tenant, id) WHERE c.kind = e.kind AND c.at > e.at;
-- a value of a type with a length: sent without one (char(8), not char(1))
UPDATE cv_copies SET kind = current_user::char(8) WHERE marked = 7 RETURNING kind = current_user AS whole;
-- UPDATE across shard groups with the clock: one value for every row
UPDATE cv_copies SET at = now() + interval '1 day' WHERE marked = 7;
SELECT count(DISTINCT at) AS one_value FROM cv_copies;

-- bad input: a computed value that fails when the statement runs changes
-- nothing, on one node or across shard groups
CREATE SEQUENCE cv_short MAXVALUE 2;
INSERT INTO cv_events (tenant, kind, id) VALUES (9, 'bad', nextval('cv_short')) RETURNING id;
INSERT INTO cv_events (tenant, kind, id) VALUES (2, 'bad', nextval('cv_short')), (3, 'bad', nextval('cv_short'));
INSERT INTO cv_events (tenant, kind) VALUES (1, 'bad' || (1 / (extract(epoch FROM now()) * 0)::int)::text);
SELECT tenant, id FROM cv_events WHERE kind LIKE 'bad%';
DROP SEQUENCE cv_short;

DROP TABLE cv_moods, cv_copies, cv_events;
DROP FUNCTION cv_current_mood();
DROP TYPE cv_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25321'
DROP TYPE cv_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25322'
DROP TYPE cv_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25323'
DROP TYPE cv_mood;
\c 'dbname=pg_shard_regress host=127.0.0.1 port=25320'
