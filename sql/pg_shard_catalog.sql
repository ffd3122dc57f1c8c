-- pg_shard catalog: the tables behind the shard map.
--
-- On the metadata node: nodes, logical (distributed and reference) tables,
-- co-location groups, shard groups (a range shared by co-located tables),
-- shards, placements and the map version.
-- On workers: local_shard, the worker's own record of the shard tables it
-- holds, the range each owns, its state and the epoch at which it took it.
--
-- Keyspace ids are stored in the order-preserving signed form returned by
-- pg_shard.keyspace_id(): the unsigned 64-bit id with its top bit flipped.

-- Keys hash as UTF-8 and rows travel between nodes as UTF-8 text.
DO $$
BEGIN
    IF pg_catalog.getdatabaseencoding() <> 'UTF8' THEN
        RAISE EXCEPTION 'pg_shard requires a database with UTF8 encoding, not %',
            pg_catalog.getdatabaseencoding();
    END IF;
END $$;

-- Schema names starting with pg_ are reserved; superusers may create them with
-- allow_system_table_mods, which CREATE EXTENSION resets after this script.
SET allow_system_table_mods = on;
CREATE SCHEMA pg_shard;
-- On the metadata node, the foreign tables (postgres_fdw) that stand for the
-- shards as partitions of a distributed table.
CREATE SCHEMA pg_shard_partitions;

CREATE TABLE pg_shard.node (
    node_id  serial PRIMARY KEY,
    host     text    NOT NULL,
    port     integer NOT NULL CHECK (port BETWEEN 1 AND 65535),
    state    text    NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'inactive')),
    UNIQUE (host, port)
);

CREATE TABLE pg_shard.colocation_group (
    colocation_id serial PRIMARY KEY,
    kind          text    NOT NULL CHECK (kind IN ('distributed', 'reference')),
    shard_count   integer NOT NULL CHECK (shard_count >= 1),
    -- the canonical key encoding ('integer', 'text', 'uuid', 'bytes'); NULL for reference tables
    key_encoding  text
);

CREATE TABLE pg_shard.shard_group (
    shard_group_id bigserial PRIMARY KEY,
    colocation_id  integer NOT NULL REFERENCES pg_shard.colocation_group,
    range_start    bigint  NOT NULL,
    range_end      bigint  NOT NULL,
    CHECK (range_start <= range_end),
    UNIQUE (colocation_id, range_start)
);

CREATE TABLE pg_shard.logical_table (
    table_rel     regclass PRIMARY KEY,
    kind          text     NOT NULL CHECK (kind IN ('distributed', 'reference')),
    dist_column   text,
    colocation_id integer  NOT NULL REFERENCES pg_shard.colocation_group,
    -- the column that holds self-routing ids (pg_shard.set_routing_id), if any
    routing_attnum smallint,
    CHECK ((kind = 'distributed') = (dist_column IS NOT NULL))
);

CREATE SEQUENCE pg_shard.shard_id_seq START 100000;

CREATE TABLE pg_shard.shard (
    shard_id       bigint   PRIMARY KEY DEFAULT nextval('pg_shard.shard_id_seq'),
    table_rel      regclass NOT NULL
                   REFERENCES pg_shard.logical_table ON DELETE CASCADE ON UPDATE CASCADE,
    shard_group_id bigint   NOT NULL REFERENCES pg_shard.shard_group,
    shard_schema   text     NOT NULL,
    shard_name     text     NOT NULL,
    UNIQUE (table_rel, shard_group_id)
);

-- Indexes and constraints of distributed tables. They live on the shard
-- tables only: the metadata node's table is partitioned into foreign tables,
-- which can hold no index, and constraints there would not be checked. The
-- rows let DROP INDEX, DROP CONSTRAINT and undistribute_table find them.
-- kind: 'p' primary key, 'u' unique, 'x' exclusion, 'c' check, 'f' foreign
-- key (constraints, definition as pg_get_constraintdef prints it, naming
-- the metadata node's tables); 'i' an index (definition:
-- what follows "ON table" in pg_get_indexdef). Index names are unique per
-- schema, constraint names per table; shard tables add "_<shard id>" to the
-- names of indexes and index-backed constraints.
CREATE TABLE pg_shard.table_constraint (
    table_rel    regclass NOT NULL
                 REFERENCES pg_shard.logical_table ON DELETE CASCADE ON UPDATE CASCADE,
    kind         "char"   NOT NULL CHECK (kind IN ('p', 'u', 'x', 'c', 'f', 'i')),
    name         name     NOT NULL,
    definition   text     NOT NULL,
    unique_index boolean  NOT NULL DEFAULT false,
    referenced_rel oid,     -- a foreign key's referenced table
    PRIMARY KEY (table_rel, name)
);

-- Lookup tables (pg_shard.create_lookup): for a column of a distributed
-- table, a distributed table of value -> keyspace id of the row's key
-- (lookup_rel: value, keyspace_id, rows), kept in the same transaction as
-- every write of the table (pg_shard_ext/src/lookups). The shards'
-- triggers name the lookup by its id.
CREATE TABLE pg_shard.lookup (
    lookup_id     serial   PRIMARY KEY,
    table_rel     regclass NOT NULL
                  REFERENCES pg_shard.logical_table ON DELETE CASCADE ON UPDATE CASCADE,
    column_attnum smallint NOT NULL,
    lookup_rel    regclass NOT NULL UNIQUE
                  REFERENCES pg_shard.logical_table ON DELETE CASCADE ON UPDATE CASCADE,
    is_unique     boolean  NOT NULL,
    UNIQUE (table_rel, column_attnum)
);

-- Placements are per shard group: co-located shards always live together.
CREATE TABLE pg_shard.placement (
    shard_group_id bigint  NOT NULL REFERENCES pg_shard.shard_group,
    node_id        integer NOT NULL REFERENCES pg_shard.node,
    state          text    NOT NULL DEFAULT 'active'
                   CHECK (state IN ('active', 'frozen', 'retired')),
    PRIMARY KEY (shard_group_id, node_id)
);
CREATE INDEX placement_node_idx ON pg_shard.placement (node_id);

-- One row once the map has changed at least once; no row means version 0.
-- (Not inserted here, so that pg_dump/restore of config data cannot collide.)
CREATE TABLE pg_shard.map_state (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    version   bigint  NOT NULL
);

-- Worker side.
CREATE TABLE pg_shard.local_shard (
    shard_rel   regclass PRIMARY KEY,
    shard_id    bigint   NOT NULL UNIQUE,
    dist_column text,               -- NULL for a reference table copy
    range_start bigint   NOT NULL,
    range_end   bigint   NOT NULL,
    state       text     NOT NULL DEFAULT 'active'
                CHECK (state IN ('active', 'frozen', 'retired')),
    epoch       bigint   NOT NULL,
    CHECK (range_start <= range_end)
);

-- Which node this server is (written by add_node on the worker): its
-- generator number for pg_shard.next_id. No row on the metadata node.
CREATE TABLE pg_shard.local_node (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    node_id   integer NOT NULL
);

-- Statements per shard that the coordinators route straight to workers,
-- as each coordinator last reported them (every 10 s): its running count,
-- the rate since its report before, and the latency percentiles of its
-- last 10-20 s. pg_shard.rebalance(strategy => 'load') reads the rates of
-- recent reports, pg_shard.shard_stats all of it.
CREATE TABLE pg_shard.shard_load (
    coordinator text NOT NULL,
    shard_id bigint NOT NULL,
    statements bigint NOT NULL,
    per_second double precision,
    p50_ms double precision,
    p99_ms double precision,
    reported_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (coordinator, shard_id)
);

-- The hottest keys each coordinator counted (its SHOW HOT_KEYS), as it last
-- reported them (every 10 s): per table, its top keys by statements of
-- recent traffic and the table's statements counted beside them.
-- pg_shard.hot_keys() gathers them. Holds key values: not readable by PUBLIC.
CREATE TABLE pg_shard.hot_key (
    coordinator      text   NOT NULL,
    table_rel        oid    NOT NULL,
    keyspace_id      bigint NOT NULL,
    key              text   NOT NULL,
    statements       bigint NOT NULL,
    table_statements bigint NOT NULL,
    error            bigint NOT NULL,
    reported_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (coordinator, table_rel, keyspace_id)
);

-- Shard moves and splits (metadata node): one row per job, its state
-- machine's position persisted so that a restarted background worker
-- resumes (or rolls back) where it was.
CREATE TABLE pg_shard.job (
    job_id           bigserial   PRIMARY KEY,
    kind             text        NOT NULL CHECK (kind IN ('move', 'split')),
    state            text        NOT NULL DEFAULT 'queued'
                     CHECK (state IN ('queued', 'running', 'done', 'failed', 'canceled')),
    -- plan, create_target, copy, catch_up, verify (source and copy compared
    -- at one point), catch_up, reads_switched (reads first only), cutover
    -- (freeze, final writes, publish),
    -- cleanup, drop_old (or rollback after a failure or cancel);
    -- pg_shard_ext/src/operations/job.rs (Phase)
    phase            text        NOT NULL DEFAULT 'plan',
    shard_id         bigint      NOT NULL,   -- the shard asked for
    -- NULL once the table was dropped (the job's history stays)
    shard_group_id   bigint      REFERENCES pg_shard.shard_group ON DELETE SET NULL,
    source_node      integer     NOT NULL REFERENCES pg_shard.node,
    target_node      integer     NOT NULL REFERENCES pg_shard.node,
    split_at         bigint,                 -- first keyspace id of the upper half
    planned_version  bigint,                 -- the map version the plan was made at
    -- names of everything the job creates (publication, slot, subscription,
    -- target tables), recorded before it is created
    resources        jsonb       NOT NULL DEFAULT '{}',
    rows_copied      bigint      NOT NULL DEFAULT 0,
    bytes_copied     bigint      NOT NULL DEFAULT 0,
    lag_bytes        bigint,
    cancel_requested boolean     NOT NULL DEFAULT false,
    created_at       timestamptz NOT NULL DEFAULT now(),
    started_at       timestamptz,
    phase_started_at timestamptz,
    finished_at      timestamptz,
    error            text,
    CHECK ((kind = 'split') = (split_at IS NOT NULL))
);
-- One unfinished job per shard group.
CREATE UNIQUE INDEX job_one_unfinished_per_group ON pg_shard.job (shard_group_id)
    WHERE state IN ('queued', 'running');

-- Reads first (move_shard / split_shard with switch_reads_first): while a
-- job is in its reads_switched phase, reads of its range go to its new
-- copy (a move's target, a split's halves) and writes to the placement
-- that owns the range. One row per table and range, published with a new
-- map version and deleted with the cutover's (or a rollback's).
CREATE TABLE pg_shard.read_route (
    job_id       bigint   NOT NULL REFERENCES pg_shard.job ON DELETE CASCADE,
    table_rel    regclass NOT NULL
                 REFERENCES pg_shard.logical_table ON DELETE CASCADE ON UPDATE CASCADE,
    range_start  bigint   NOT NULL,
    range_end    bigint   NOT NULL,
    node_id      integer  NOT NULL REFERENCES pg_shard.node,
    shard_id     bigint   NOT NULL,
    shard_schema text     NOT NULL,
    shard_name   text     NOT NULL,
    CHECK (range_start <= range_end),
    PRIMARY KEY (table_rel, range_start)
);

-- Two-phase commit of remote transactions (pg_shard_ext/src/transaction/remote.rs):
-- one row per remote transaction of a local transaction, written in it, so
-- that a row exists exactly when the local transaction committed. The
-- recovery commits a prepared remote transaction with a row and rolls back
-- one without; rows of finished ones are deleted then. (Not dumped: it is
-- the state of running transactions.)
CREATE TABLE pg_shard.remote_transaction (
    gid        text        PRIMARY KEY,
    node_id    integer     NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Catalog data belongs in pg_dump output.
SELECT pg_catalog.pg_extension_config_dump('pg_shard.node', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.node_node_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.colocation_group', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.colocation_group_colocation_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.shard_group', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.shard_group_shard_group_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.logical_table', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.shard', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.shard_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.placement', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.table_constraint', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.map_state', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.lookup', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.lookup_lookup_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.local_shard', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.local_node', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.job', '');
SELECT pg_catalog.pg_extension_config_dump('pg_shard.job_job_id_seq', '');
