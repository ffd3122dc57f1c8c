-- pg_shard SQL API: the functions DBAs call, the catalog views, and the
-- declarations of the C trigger functions that guard shard tables.
-- Rust implementations live in pg_shard_ext/src; see docs/sql-api.md.

CREATE FUNCTION pg_shard.create_distributed_table(
    table_name regclass,
    distribution_column text,
    shard_count integer DEFAULT NULL,
    colocate_with text DEFAULT 'default')
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_shard.create_distributed_table_internal(
          table_name::oid, distribution_column, shard_count, colocate_with) $$;
COMMENT ON FUNCTION pg_shard.create_distributed_table(regclass, text, integer, text) IS
    'distribute a table over the workers by hash ranges of distribution_column '
    '(shard_count defaults to 32, or the count of the co-location group joined)';

CREATE FUNCTION pg_shard.create_reference_table(table_name regclass)
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_shard.create_reference_table_internal(table_name::oid) $$;
COMMENT ON FUNCTION pg_shard.create_reference_table(regclass) IS
    'copy a table to every worker; the metadata node keeps its rows for local reads';

-- Worker-side guards (pg_shard_ext/src/fencing.rs).
CREATE FUNCTION pg_shard.shard_guard_row() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'shard_guard_row';
CREATE FUNCTION pg_shard.shard_guard_statement() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'shard_guard_statement';

-- Backends cache each shard's state and epoch; a change to an ownership
-- record invalidates the shard table's relcache entry in every backend.
CREATE FUNCTION pg_shard.local_shard_changed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_LEVEL = 'STATEMENT' THEN
        PERFORM pg_shard.invalidate_shard_state(NULL);
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM pg_shard.invalidate_shard_state(OLD.shard_rel::oid);
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        PERFORM pg_shard.invalidate_shard_state(NEW.shard_rel::oid);
    END IF;
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION pg_shard.invalidate_shard_state(oid) FROM PUBLIC;
-- The guards run as whichever role writes to a shard table.
GRANT USAGE ON SCHEMA pg_shard TO PUBLIC;
GRANT SELECT ON pg_shard.local_shard TO PUBLIC;
CREATE TRIGGER local_shard_changed
    AFTER INSERT OR UPDATE OR DELETE ON pg_shard.local_shard
    FOR EACH ROW EXECUTE FUNCTION pg_shard.local_shard_changed();
CREATE TRIGGER local_shard_truncated
    AFTER TRUNCATE ON pg_shard.local_shard
    FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.local_shard_changed();

-- Writes to a reference table on the metadata node reach every copy
-- (pg_shard_ext/src/reference.rs); the transition tables carry the rows.
-- Runs as the writing role. The rows travel as JSON printed under fixed
-- settings, so they read back the same on the workers.
CREATE FUNCTION pg_shard.replicate_reference_write() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET DateStyle = 'ISO, MDY' SET IntervalStyle = 'postgres' SET extra_float_digits = 3
AS $$
DECLARE
    old_rows text;
    new_rows text;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        SELECT pg_catalog.json_agg(o)::text INTO old_rows FROM pg_shard_old o;
    END IF;
    IF TG_OP IN ('INSERT', 'UPDATE') THEN
        SELECT pg_catalog.json_agg(n)::text INTO new_rows FROM pg_shard_new n;
    END IF;
    IF TG_OP = 'TRUNCATE' OR old_rows IS NOT NULL OR new_rows IS NOT NULL THEN
        PERFORM pg_shard.replicate_reference_change(TG_RELID, TG_OP, old_rows, new_rows);
    END IF;
    RETURN NULL;
END $$;

CREATE VIEW pg_shard.nodes AS
    SELECT node_id, host, port, state
    FROM pg_shard.node
    ORDER BY node_id;

CREATE VIEW pg_shard.shards AS
    SELECT s.table_rel                                  AS table_name,
           s.shard_id,
           format('%I.%I', s.shard_schema, s.shard_name) AS shard_table,
           g.range_start,
           g.range_end,
           n.node_id,
           n.host,
           n.port,
           p.state,
           z.size_bytes
    FROM pg_shard.shard s
    JOIN pg_shard.shard_group g USING (shard_group_id)
    JOIN pg_shard.placement p USING (shard_group_id)
    JOIN pg_shard.node n USING (node_id)
    LEFT JOIN pg_shard.shard_sizes() z
           ON z.shard_id = s.shard_id AND z.node_id = n.node_id
    ORDER BY s.table_rel::oid, g.range_start, n.node_id;
COMMENT ON VIEW pg_shard.shards IS
    'one row per shard placement; range_start/range_end are inclusive keyspace ids '
    'in the signed form of pg_shard.keyspace_id()';

-- DROP TABLE: on the metadata node, drop the shards of dropped distributed
-- and reference tables (pg_shard_ext/src/drop.rs); on a worker, forget the
-- ownership record of a dropped shard table.
-- SECURITY DEFINER: whoever may drop a table may drop its shards; the
-- function runs no code of the dropping role.
CREATE FUNCTION pg_shard.on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dropped record;
BEGIN
    FOR dropped IN
        SELECT objid FROM pg_catalog.pg_event_trigger_dropped_objects()
        WHERE classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND objsubid = 0
          AND object_type = 'table'
    LOOP
        IF EXISTS (SELECT 1 FROM pg_shard.logical_table WHERE table_rel::oid = dropped.objid) THEN
            PERFORM pg_shard.drop_shards_internal(dropped.objid);
        END IF;
        IF EXISTS (SELECT 1 FROM pg_shard.local_shard WHERE shard_rel::oid = dropped.objid) THEN
            DELETE FROM pg_shard.local_shard WHERE shard_rel::oid = dropped.objid;
        END IF;
    END LOOP;
END $$;
CREATE EVENT TRIGGER pg_shard_sql_drop ON sql_drop
    EXECUTE FUNCTION pg_shard.on_sql_drop();

-- The DBA functions change the cluster: superusers only unless granted.
REVOKE ALL ON FUNCTION pg_shard.add_node(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_distributed_table(regclass, text, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_distributed_table_internal(oid, text, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_reference_table(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_reference_table_internal(oid) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.drop_shards_internal(oid) FROM PUBLIC;
