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
-- No SET search_path: colocate_with is a name in the caller's search_path
-- (pg_shard looks it up there without running SQL); every name here is
-- qualified, and every query the function runs uses a safe search_path.
AS $$ SELECT pg_shard.create_distributed_table_internal(
          table_name::pg_catalog.oid, distribution_column, shard_count, colocate_with) $$;
COMMENT ON FUNCTION pg_shard.create_distributed_table(regclass, text, integer, text) IS
    'distribute a table over the workers by hash ranges of distribution_column '
    '(shard_count defaults to 32, or the count of the co-location group joined)';

CREATE FUNCTION pg_shard.create_reference_table(table_name regclass)
RETURNS void
LANGUAGE sql VOLATILE
-- Messages name the table as the caller sees it: no SET search_path.
AS $$ SELECT pg_shard.create_reference_table_internal(table_name::pg_catalog.oid) $$;
COMMENT ON FUNCTION pg_shard.create_reference_table(regclass) IS
    'copy a table to every worker; the metadata node keeps its rows for local reads';

CREATE FUNCTION pg_shard.undistribute_table(table_name regclass)
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_shard.undistribute_table_internal(table_name::pg_catalog.oid) $$;
COMMENT ON FUNCTION pg_shard.undistribute_table(regclass) IS
    'turn a distributed or reference table back into an ordinary table on the metadata node, '
    'with every row; its shards are dropped';

-- Worker-side guards (pg_shard_ext/src/worker/fencing.rs).
CREATE FUNCTION pg_shard.shard_guard_row() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'shard_guard_row';
CREATE FUNCTION pg_shard.shard_guard_inserted() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'shard_guard_inserted';
CREATE FUNCTION pg_shard.shard_guard_statement() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'shard_guard_statement';

-- A move's verification point (pg_shard_ext/src/operations/verification.rs):
-- on the target, the apply of a marker row with a negative number -p waits
-- for the lock the job holds for point p while it takes its snapshot of the
-- target, so the snapshot sees every change before the point and none
-- after it. The lock: tag 0x7067 in the top 16 bits, 24 bits of the job id
-- (TG_ARGV[0]), 24 bits of p.
CREATE FUNCTION pg_shard.verification_point() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.job < 0 THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(
            (28775::bigint << 48)
            | ((TG_ARGV[0]::bigint % 16777216) << 24)
            | ((-NEW.job) % 16777216));
    END IF;
    RETURN NEW;
END
$$;

-- A cutover's marker row (pg_shard_ext/src/operations/replication.rs) may
-- carry the shards it activates, on the side that receives it, at the new
-- map version: the apply of the row activates them in its own transaction,
-- right after every change committed before the marker. Unless the job gave
-- the cutover up and vetoed it first (a row numbered job | 2^61 written on
-- this side): both lock the shards' records first (the veto by updating
-- them, so that an apply in REPEATABLE READ fails and is retried rather
-- than miss it), so a veto and an activation never pass each other.
CREATE FUNCTION pg_shard.marker_activation() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    vetoed boolean;
BEGIN
    -- The job waits for the marker inside its write pause: woken at the
    -- apply's commit rather than at its next look.
    PERFORM pg_notify('pg_shard_marker', NEW.job::text);
    IF NEW.activate_version IS NULL THEN
        RETURN NEW;
    END IF;
    PERFORM 1 FROM pg_shard.local_shard WHERE shard_id = ANY (NEW.activate_shards)
        ORDER BY shard_id FOR UPDATE;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I.%I WHERE job = $1)',
                   TG_TABLE_SCHEMA, TG_TABLE_NAME)
        INTO vetoed USING NEW.job | (1::bigint << 61);
    -- A rehearsal before the cutover's pause (version 0): the same work,
    -- changing nothing, so that the activation's apply does not start cold.
    IF NEW.activate_version = 0 THEN
        UPDATE pg_shard.local_shard SET state = state WHERE shard_id = ANY (NEW.activate_shards);
        RETURN NEW;
    END IF;
    -- (Shards an earlier try of the cutover activated at another version
    -- take this one: that version was never published.)
    IF NOT vetoed THEN
        UPDATE pg_shard.local_shard SET state = 'active', epoch = NEW.activate_version
            WHERE shard_id = ANY (NEW.activate_shards)
              AND (state <> 'active' OR epoch <> NEW.activate_version);
        -- (The job's record of its pause shows when.)
        NEW.applied_at := clock_timestamp();
    END IF;
    RETURN NEW;
END
$$;

-- Backends cache each shard's state and epoch; a change to an ownership
-- record invalidates the shard table's relcache entry in every backend.
CREATE FUNCTION pg_shard.local_shard_changed() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
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
-- pg_shard.next_id reads the node's generator number as any role.
GRANT SELECT ON pg_shard.local_node TO PUBLIC;
-- The catalog is readable by everyone, like pg_class: schema changes
-- (ProcessUtility hook) and queries of any role look up whether a table is
-- distributed. Only pg_shard's functions change it.
GRANT SELECT ON pg_shard.node, pg_shard.colocation_group, pg_shard.shard_group,
    pg_shard.logical_table, pg_shard.shard, pg_shard.placement, pg_shard.map_state,
    pg_shard.job, pg_shard.table_constraint, pg_shard.read_route, pg_shard.lookup TO PUBLIC;
CREATE TRIGGER local_shard_changed
    AFTER INSERT OR UPDATE OR DELETE ON pg_shard.local_shard
    FOR EACH ROW EXECUTE FUNCTION pg_shard.local_shard_changed();
CREATE TRIGGER local_shard_truncated
    AFTER TRUNCATE ON pg_shard.local_shard
    FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.local_shard_changed();
-- Also when a replication apply writes the records (a marker's activation).
ALTER TABLE pg_shard.local_shard ENABLE ALWAYS TRIGGER local_shard_changed;
ALTER TABLE pg_shard.local_shard ENABLE ALWAYS TRIGGER local_shard_truncated;

-- Writes to a reference table on the metadata node reach every copy
-- (pg_shard_ext/src/commands/reference.rs); the transition tables carry the rows.
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

-- Shard moves and splits: queued here, run by the job runner (a background
-- worker, pg_shard_ext/src/operations). Input is checked before anything is
-- queued; a bad call changes nothing.
CREATE FUNCTION pg_shard.queue_job(
    job_kind text, requested_shard bigint, requested_target integer, requested_split_at bigint,
    reads_first boolean DEFAULT false)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shard record;
    source integer;
    target record;
    other bigint;
    new_job bigint;
    routed text;
    aligned_middle numeric;
BEGIN
    IF requested_shard IS NULL THEN
        RAISE EXCEPTION 'shard_id must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF reads_first IS NULL THEN
        RAISE EXCEPTION 'switch_reads_first must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT s.shard_id, s.shard_group_id, s.table_rel, t.kind, g.range_start, g.range_end, g.colocation_id
      INTO shard
      FROM pg_shard.shard s
      JOIN pg_shard.logical_table t USING (table_rel)
      JOIN pg_shard.shard_group g USING (shard_group_id)
     WHERE s.shard_id = requested_shard;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'shard % does not exist', requested_shard
            USING ERRCODE = 'undefined_object', HINT = 'pg_shard.shards lists the shards';
    END IF;
    IF shard.kind = 'reference' THEN
        RAISE EXCEPTION 'shard % belongs to reference table %, which has a copy on every node',
            requested_shard, shard.table_rel
            USING ERRCODE = 'feature_not_supported';
    END IF;
    -- A table joining the co-location group waits for this transaction
    -- (create_distributed_table takes the lock too), so the job's plan
    -- sees it, and it sees the job and is refused; so does a column being
    -- declared to hold routing ids (set_routing_id), whose alignment a
    -- split must keep.
    PERFORM pg_advisory_xact_lock(hashtext('pg_shard co-location'), shard.colocation_id);
    SELECT p.node_id INTO source
      FROM pg_shard.placement p
     WHERE p.shard_group_id = shard.shard_group_id AND p.state = 'active';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'shard % has no active placement', requested_shard
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF job_kind = 'split' THEN
        requested_target := source;
        IF shard.range_start = shard.range_end THEN
            RAISE EXCEPTION 'shard % holds a single keyspace id and cannot be split', requested_shard
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        SELECT string_agg(table_rel::text, ', ' ORDER BY table_rel::text) INTO routed
          FROM pg_shard.logical_table
         WHERE colocation_id = shard.colocation_id AND routing_attnum IS NOT NULL;
        IF requested_split_at IS NULL AND routed IS NOT NULL THEN
            -- the middle, rounded to a prefix boundary (2^54) inside the range
            -- (numeric: at the top of the keyspace the rounding can pass 2^63)
            aligned_middle := round((shard.range_start::numeric + shard.range_end::numeric + 1) / 2
                                    / 18014398509481984) * 18014398509481984;
            IF aligned_middle <= shard.range_start THEN
                aligned_middle := aligned_middle + 18014398509481984;
            END IF;
            IF aligned_middle > shard.range_end THEN
                RAISE EXCEPTION 'shard % cannot be split: its range holds one routing-id prefix', requested_shard
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = format('%s route by ids whose prefix names 1/1024th of the keyspace; '
                                          'shard boundaries stay at multiples of 2^54.', routed);
            END IF;
            requested_split_at := aligned_middle::bigint;
        ELSIF requested_split_at IS NULL THEN
            -- the middle: the upper half starts one past it
            requested_split_at := floor((shard.range_start::numeric + shard.range_end::numeric) / 2)::bigint + 1;
        ELSIF requested_split_at <= shard.range_start OR requested_split_at > shard.range_end THEN
            RAISE EXCEPTION 'split point % is outside shard %''s range', requested_split_at, requested_shard
                USING ERRCODE = 'invalid_parameter_value',
                      DETAIL = format('The range is [%s, %s]; split_at is the first keyspace id of the upper half, so it must be in (%s, %s].',
                                      shard.range_start, shard.range_end, shard.range_start, shard.range_end);
        END IF;
        IF routed IS NOT NULL AND requested_split_at % 18014398509481984 <> 0 THEN
            RAISE EXCEPTION 'split point % would cut a routing-id prefix of %', requested_split_at, routed
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'An id carries the top 10 bits of its key''s keyspace id, so routing by id needs '
                               'every shard boundary at a multiple of 2^54.',
                      HINT = format('split at a multiple of 2^54, such as %s, or leave split_at NULL',
                                    ceil(requested_split_at::numeric / 18014398509481984) * 18014398509481984);
        END IF;
    ELSE
        IF requested_target IS NULL THEN
            RAISE EXCEPTION 'target_node must not be NULL' USING ERRCODE = 'null_value_not_allowed';
        END IF;
        SELECT node_id, state, host, port INTO target FROM pg_shard.node WHERE node_id = requested_target;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'node % does not exist', requested_target
                USING ERRCODE = 'undefined_object', HINT = 'pg_shard.node lists the nodes';
        END IF;
        IF target.state <> 'active' THEN
            RAISE EXCEPTION 'node % (%:%) is not active', requested_target, target.host, target.port
                USING ERRCODE = 'object_not_in_prerequisite_state';
        END IF;
        IF requested_target = source THEN
            RAISE EXCEPTION 'shard % is already on node %', requested_shard, requested_target
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END IF;
    -- (A split's upper half is its job's too until the job ends: a revert
    -- merges it back.)
    SELECT job_id INTO other FROM pg_shard.job
     WHERE (shard_group_id = shard.shard_group_id
            OR (resources->>'upper_group')::bigint = shard.shard_group_id)
       AND state IN ('queued', 'running');
    IF FOUND THEN
        RAISE EXCEPTION 'shard % is already being moved or split by job %', requested_shard, other
            USING ERRCODE = 'object_in_use',
                  HINT = 'pg_shard.wait_job() waits for it; past its cutover, pg_shard.complete_job() ends it now';
    END IF;
    INSERT INTO pg_shard.job (kind, shard_id, shard_group_id, source_node, target_node, split_at, resources)
    VALUES (job_kind, requested_shard, shard.shard_group_id, source, requested_target, requested_split_at,
            jsonb_build_object('drop_delay', current_setting('pg_shard.move_drop_delay'),
                               'lock_wait_ms', (extract(epoch FROM current_setting('pg_shard.cutover_lock_timeout')::interval)
                                                * 1000)::bigint,
                               'apply_wait_ms', (extract(epoch FROM current_setting('pg_shard.cutover_apply_timeout')::interval)
                                                 * 1000)::bigint,
                               'copy_rate', current_setting('pg_shard.copy_rate_limit')::bigint,
                               'max_lag', pg_size_bytes(current_setting('pg_shard.max_replication_lag')),
                               'max_latency_ms', (extract(epoch FROM current_setting('pg_shard.max_source_latency')::interval)
                                                  * 1000)::bigint)
            || CASE WHEN reads_first
                    THEN jsonb_build_object('reads_first', true,
                                            'switch_writes_delay', current_setting('pg_shard.switch_writes_delay'))
                    ELSE '{}'::jsonb END)
    RETURNING job_id INTO new_job;
    PERFORM pg_notify('pg_shard_jobs', new_job::text);
    -- the runner of this database (a no-op when one runs already)
    PERFORM pg_shard.start_job_runner();
    RETURN new_job;
END $$;

-- The job functions run as the extension's owner (SECURITY DEFINER): the
-- job runner does the work, and a role a superuser granted them to may
-- queue, cancel and plan jobs; they run no code of the caller's.
-- switch_reads_first: once the copy is verified, a map version routes the
-- range's reads to the new copy while writes stay where they are (phase
-- reads_switched), for pg_shard.switch_writes_delay or until
-- pg_shard.switch_writes(job_id); then the cutover switches writes.
CREATE FUNCTION pg_shard.move_shard(shard_id bigint, target_node integer,
                                    switch_reads_first boolean DEFAULT false)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_shard.queue_job('move', shard_id, target_node, NULL, switch_reads_first) $$;
COMMENT ON FUNCTION pg_shard.move_shard(bigint, integer, boolean) IS
    'queue a move of the shard (and its co-located shards) to target_node, reads first if asked; '
    'returns the job id';

CREATE FUNCTION pg_shard.split_shard(shard_id bigint, split_at bigint DEFAULT NULL,
                                     switch_reads_first boolean DEFAULT false)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_shard.queue_job('split', shard_id, NULL, split_at, switch_reads_first) $$;
COMMENT ON FUNCTION pg_shard.split_shard(bigint, bigint, boolean) IS
    'queue a split of the shard (and its co-located shards) into two at split_at, the first '
    'keyspace id of the upper half (NULL: the middle of the range), reads first if asked; '
    'returns the job id';

-- Self-routing ids (pg_shard_ext/src/ids): an id carries the top 10 bits
-- of its key's keyspace id, so `column = id` routes like `key = value`.
CREATE FUNCTION pg_shard.next_id("table" regclass, key anyelement)
RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL RESTRICTED
AS $$ SELECT pg_shard.next_id_internal($1::pg_catalog.oid, $2) $$;
COMMENT ON FUNCTION pg_shard.next_id(regclass, anyelement) IS
    'a new id for a row of the table whose distribution key is key: 41 bits of milliseconds '
    'since 2026-01-01 UTC, the top 10 bits of the key''s keyspace id, a 12-bit sequence; '
    'unique across the cluster''s nodes';

CREATE FUNCTION pg_shard.set_routing_id("table" regclass, "column" name)
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_shard.set_routing_id_internal($1::pg_catalog.oid, $2::text) $$;
COMMENT ON FUNCTION pg_shard.set_routing_id(regclass, name) IS
    'declare that column holds ids from pg_shard.next_id for the row''s key (checked on every '
    'shard), so that column = value is routed to one shard; NULL removes the declaration';

-- Lookup tables (pg_shard_ext/src/commands/lookup.rs, src/lookups): a
-- column's values -> the keyspace ids of their rows' keys, in a table
-- distributed by the value, kept in the same transaction as every write.
CREATE FUNCTION pg_shard.create_lookup("table" regclass, "column" name, "unique" boolean DEFAULT false)
RETURNS regclass
LANGUAGE sql VOLATILE
AS $$ SELECT pg_shard.create_lookup_internal("table"::pg_catalog.oid, "column"::text, "unique")::pg_catalog.regclass $$;
COMMENT ON FUNCTION pg_shard.create_lookup(regclass, name, boolean) IS
    'create and fill the lookup table of a column of a distributed table (unique: the column '
    'is unique across every shard); returns the lookup table';

CREATE FUNCTION pg_shard.drop_lookup("table" regclass, "column" name)
RETURNS void
LANGUAGE sql VOLATILE
AS $$ SELECT pg_shard.drop_lookup_internal("table"::pg_catalog.oid, "column"::text) $$;
COMMENT ON FUNCTION pg_shard.drop_lookup(regclass, name) IS
    'drop the lookup table of a column of a distributed table';

CREATE VIEW pg_shard.lookups AS
    SELECT l.table_rel AS table_name,
           a.attname   AS column_name,
           l.lookup_rel AS lookup_table,
           l.is_unique
    FROM pg_shard.lookup l
    JOIN pg_catalog.pg_attribute a ON a.attrelid = l.table_rel AND a.attnum = l.column_attnum
    ORDER BY l.table_rel::oid, a.attname;

-- The shards' side of lookups (pg_shard_ext/src/worker/lookup_changes.rs).
CREATE FUNCTION pg_shard.lookup_rows_changed() RETURNS trigger
    LANGUAGE c AS 'MODULE_PATHNAME', 'lookup_rows_changed';

-- Tenant isolation (pg_shard_ext/src/commands/isolate.rs): one keyspace id
-- gets a shard group of its own, [id, id], by splits at both sides of it
-- and then, if asked, a move. Each step is an ordinary job; the runner
-- queues the next when one ends done (pg_shard.queue_isolation_step, in the
-- transaction that records it done), planned again from the catalog as it
-- is then, so a step someone else did meanwhile is not done twice.
CREATE FUNCTION pg_shard.queue_isolation_step(
    isolated_table oid, isolated_id bigint, target integer, follows bigint)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    shard record;
    next_job bigint;
BEGIN
    SELECT s.shard_id, g.range_start, g.range_end, p.node_id INTO shard
      FROM pg_shard.shard s
      JOIN pg_shard.shard_group g USING (shard_group_id)
      JOIN pg_shard.placement p ON p.shard_group_id = s.shard_group_id AND p.state = 'active'
     WHERE s.table_rel = isolated_table::regclass
       AND isolated_id BETWEEN g.range_start AND g.range_end;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'no active shard of % holds keyspace id %', isolated_table::regclass, isolated_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF shard.range_start < isolated_id THEN
        next_job := pg_shard.queue_job('split', shard.shard_id, NULL, isolated_id);
    ELSIF shard.range_end > isolated_id THEN
        next_job := pg_shard.queue_job('split', shard.shard_id, NULL, isolated_id + 1);
    ELSIF target IS NOT NULL AND target <> shard.node_id THEN
        next_job := pg_shard.queue_job('move', shard.shard_id, target, NULL);
    ELSE
        RETURN NULL;
    END IF;
    UPDATE pg_shard.job j
       SET resources = j.resources
           || jsonb_build_object('isolating', jsonb_build_object(
                  'table', isolated_table, 'keyspace_id', isolated_id, 'target', target))
           -- a later step runs with the settings the first was queued with
           || coalesce((SELECT jsonb_object_agg(key, value) || jsonb_build_object('follows', follows)
                          FROM pg_shard.job f, jsonb_each(f.resources)
                         WHERE f.job_id = follows
                           AND key IN ('drop_delay', 'lock_wait_ms', 'apply_wait_ms', 'copy_rate',
                                       'max_lag', 'max_latency_ms')), '{}'::jsonb)
     WHERE j.job_id = next_job;
    IF follows IS NOT NULL THEN
        UPDATE pg_shard.job j SET resources = j.resources || jsonb_build_object('next_job', next_job)
         WHERE j.job_id = follows;
    END IF;
    RETURN next_job;
END $$;

-- Called by the runner when a job ends done: an isolation's next step. A
-- step that cannot be queued (the key's shard busy with another job) is
-- reported in the finished job and as a WARNING; isolate_tenant again
-- carries on from there.
CREATE FUNCTION pg_shard.continue_isolation(finished_job bigint)
RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    isolating jsonb;
BEGIN
    SELECT resources->'isolating' INTO isolating FROM pg_shard.job
     WHERE job_id = finished_job AND phase = 'completed';
    IF isolating IS NULL THEN
        RETURN NULL;
    END IF;
    RETURN pg_shard.queue_isolation_step((isolating->>'table')::oid, (isolating->>'keyspace_id')::bigint,
                                         (isolating->>'target')::integer, finished_job);
EXCEPTION WHEN OTHERS THEN
    UPDATE pg_shard.job SET resources = resources || jsonb_build_object('isolation_error', SQLERRM)
     WHERE job_id = finished_job;
    RAISE WARNING 'pg_shard job %: the isolation''s next step was not queued: %', finished_job, SQLERRM;
    RETURN NULL;
END $$;

CREATE FUNCTION pg_shard.isolate_tenant("table" regclass, key anyelement, target_node integer DEFAULT NULL)
RETURNS bigint
LANGUAGE sql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$ SELECT pg_shard.isolate_tenant_internal($1::pg_catalog.oid, $2, $3) $$;
COMMENT ON FUNCTION pg_shard.isolate_tenant(regclass, anyelement, integer) IS
    'give the key''s keyspace id a shard of its own in every table of the co-location group '
    '(splits at both sides of it, then a move to target_node if given); returns the first job '
    '(pg_shard.wait_job follows the steps), or NULL when the key is isolated already';

-- A reads-first job in its reads_switched phase switches writes at its
-- next step instead of at the end of pg_shard.switch_writes_delay.
CREATE FUNCTION pg_shard.switch_writes(job_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j pg_shard.job;
BEGIN
    SELECT * INTO j FROM pg_shard.job WHERE pg_shard.job.job_id = switch_writes.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', switch_writes.job_id USING ERRCODE = 'undefined_object';
    END IF;
    IF NOT coalesce((j.resources->>'reads_first')::boolean, false) THEN
        RAISE EXCEPTION 'job % does not switch reads first', j.job_id
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Its writes switch with its reads, at its cutover.';
    END IF;
    IF j.state IN ('failed', 'canceled') THEN
        RAISE EXCEPTION 'job % ended %: its writes stay on the old placement', j.job_id, j.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF j.state = 'running' AND (j.cancel_requested OR j.phase = 'rollback') THEN
        RAISE EXCEPTION 'job % is being rolled back: its writes stay on the old placement', j.job_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF j.state = 'running' AND j.phase = 'reads_switched' THEN
        IF j.resources->>'requested' = 'switch_writes' THEN
            RAISE NOTICE 'job % switches its writes already', j.job_id;
            RETURN false;
        END IF;
        UPDATE pg_shard.job
           SET resources = resources || jsonb_build_object('requested', 'switch_writes', 'switch_writes_at', now())
         WHERE pg_shard.job.job_id = j.job_id;
        PERFORM pg_notify('pg_shard_jobs', j.job_id::text);
        PERFORM pg_shard.start_job_runner();
        RETURN true;
    END IF;
    IF j.state = 'queued' OR j.phase IN ('plan', 'create_target', 'copy', 'catch_up', 'verify') THEN
        RAISE EXCEPTION 'job % has not switched its reads yet (phase %)', j.job_id, j.phase
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Reads switch once the copy is verified; pg_shard.jobs shows the phase.';
    END IF;
    RAISE NOTICE 'job % has switched its writes already (%, %)', j.job_id, j.state, j.phase;
    RETURN false;
END $$;
COMMENT ON FUNCTION pg_shard.switch_writes(bigint) IS
    'end a reads-first job''s wait: its writes switch to the new copy now (the cutover)';

CREATE FUNCTION pg_shard.cancel_job(job_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current text;
BEGIN
    SELECT j.state INTO current FROM pg_shard.job j WHERE j.job_id = cancel_job.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', cancel_job.job_id USING ERRCODE = 'undefined_object';
    END IF;
    IF current = 'queued' THEN
        UPDATE pg_shard.job j SET state = 'canceled', finished_at = now(), error = 'canceled before it started'
         WHERE j.job_id = cancel_job.job_id;
        RETURN true;
    ELSIF current = 'running' AND (SELECT j.phase FROM pg_shard.job j WHERE j.job_id = cancel_job.job_id)
                                  IN ('cleanup', 'reverse_replicating', 'drop_old', 'reverting', 'revert_cleanup') THEN
        RAISE NOTICE 'job % is past its cutover (the new map is published); it finishes', cancel_job.job_id
            USING HINT = 'pg_shard.revert_job() undoes it while reverse replication runs.';
        RETURN false;
    ELSIF current = 'running' THEN
        -- the runner rolls the job back at its next step (or finishes it
        -- when the new map is already published)
        UPDATE pg_shard.job j SET cancel_requested = true WHERE j.job_id = cancel_job.job_id;
        PERFORM pg_notify('pg_shard_jobs', cancel_job.job_id::text);
        RETURN true;
    END IF;
    RAISE NOTICE 'job % has already ended (%)', cancel_job.job_id, current;
    RETURN false;
END $$;
COMMENT ON FUNCTION pg_shard.cancel_job(bigint) IS
    'abort a queued or running job safely (rolled back unless its new map is already published)';

-- After a move's or split's cutover its old copy keeps receiving the new
-- owner's writes (reverse replication, phase reverse_replicating) until
-- the drop time (pg_shard.move_drop_delay), complete_job or revert_job.
CREATE FUNCTION pg_shard.revert_job(job_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j pg_shard.job;
BEGIN
    SELECT * INTO j FROM pg_shard.job WHERE pg_shard.job.job_id = revert_job.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', revert_job.job_id USING ERRCODE = 'undefined_object';
    END IF;
    IF j.state = 'running' AND j.phase IN ('reverting', 'revert_cleanup')
       OR j.state = 'done' AND j.phase = 'reverted' THEN
        RAISE NOTICE 'job % is already reverted or reverting', j.job_id;
        RETURN false;
    END IF;
    IF j.state IN ('queued', 'running') AND j.phase NOT IN ('cleanup', 'reverse_replicating', 'drop_old') THEN
        RAISE EXCEPTION 'job % has not published its new map yet (phase %)', j.job_id, j.phase
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'pg_shard.cancel_job() rolls it back.';
    END IF;
    IF j.state IN ('failed', 'canceled') THEN
        RAISE EXCEPTION 'job % ended % without a new map: there is nothing to revert', j.job_id, j.state
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF j.state <> 'running' OR j.phase = 'drop_old' OR j.resources->>'requested' = 'complete' THEN
        RAISE EXCEPTION 'job % can no longer be reverted: its reverse replication has ended (%, %)',
                        j.job_id, j.state, j.phase
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = CASE j.kind WHEN 'move' THEN 'pg_shard.move_shard() moves the shard back with a new job.'
                              ELSE 'The halves stay: pg_shard has no merge of shards.' END;
    END IF;
    UPDATE pg_shard.job SET resources = resources || '{"requested": "revert"}'
     WHERE pg_shard.job.job_id = j.job_id;
    PERFORM pg_notify('pg_shard_jobs', j.job_id::text);
    PERFORM pg_shard.start_job_runner();
    RETURN true;
END $$;
COMMENT ON FUNCTION pg_shard.revert_job(bigint) IS
    'give a moved shard group back to its old node, or merge a split''s halves back into the old shard, '
    'while reverse replication runs (a new map version, no write lost); pg_shard.wait_job() waits for it';

CREATE FUNCTION pg_shard.complete_job(job_id bigint)
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    j pg_shard.job;
BEGIN
    SELECT * INTO j FROM pg_shard.job WHERE pg_shard.job.job_id = complete_job.job_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'job % does not exist', complete_job.job_id USING ERRCODE = 'undefined_object';
    END IF;
    -- Asked to revert, whether or not the runner has begun it yet.
    IF j.state = 'running'
       AND (j.resources->>'requested' = 'revert' OR j.phase IN ('reverting', 'revert_cleanup')) THEN
        RAISE EXCEPTION 'job % is being reverted', j.job_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    IF j.state <> 'running' OR j.phase NOT IN ('cleanup', 'reverse_replicating', 'drop_old') THEN
        IF j.state IN ('queued', 'running') AND j.phase NOT IN ('reverting', 'revert_cleanup') THEN
            RAISE EXCEPTION 'job % has not published its new map yet (phase %)', j.job_id, j.phase
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'pg_shard.wait_job() waits for it.';
        END IF;
        RAISE NOTICE 'job % has nothing left to complete (%, %)', j.job_id, j.state, j.phase;
        RETURN false;
    END IF;
    UPDATE pg_shard.job
       SET resources = resources || jsonb_build_object('requested', 'complete', 'drop_after', now())
     WHERE pg_shard.job.job_id = j.job_id;
    PERFORM pg_notify('pg_shard_jobs', j.job_id::text);
    PERFORM pg_shard.start_job_runner();
    RETURN true;
END $$;
COMMENT ON FUNCTION pg_shard.complete_job(bigint) IS
    'end a finished move''s or split''s reverse replication now and drop the old shard tables';

-- One line on where a job is: its phase (or how it ended), how much of
-- its copy is done, its replication lag.
CREATE FUNCTION pg_shard.job_progress(job_id bigint)
RETURNS text
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE WHEN j.source_node = j.target_node
                THEN format('job %s (%s of shard %s on node %s): %s', j.job_id, j.kind,
                            j.shard_id, j.source_node,
                            CASE WHEN j.state = 'running' THEN j.phase ELSE j.state END)
                ELSE format('job %s (%s of shard %s from node %s to node %s): %s', j.job_id, j.kind,
                            j.shard_id, j.source_node, j.target_node,
                            CASE WHEN j.state = 'running' THEN j.phase ELSE j.state END) END
        || CASE WHEN j.state = 'running' AND j.phase = 'copy' THEN
               format(', copied %s (%s rows)',
                      CASE WHEN (j.resources->>'copy_bytes_total')::bigint > 0
                           THEN least(100, floor(100.0 * j.bytes_copied
                                                  / (j.resources->>'copy_bytes_total')::bigint))::text
                                || '% of ' || pg_size_pretty((j.resources->>'copy_bytes_total')::bigint)
                           ELSE pg_size_pretty(j.bytes_copied) END,
                      j.rows_copied)
           ELSE '' END
        -- the lag only where it is measured: the catch-up's, and the
        -- reverse replication's after the cutover
        || CASE WHEN j.state = 'running' AND j.lag_bytes IS NOT NULL AND j.phase = 'catch_up'
                THEN format(', lag %s', pg_size_pretty(j.lag_bytes))
                WHEN j.state = 'running' AND j.lag_bytes IS NOT NULL AND j.phase = 'reverse_replicating'
                THEN format(', reverse replication lag %s', pg_size_pretty(j.lag_bytes))
                ELSE '' END
      FROM pg_shard.job j WHERE j.job_id = job_progress.job_id
$$;
COMMENT ON FUNCTION pg_shard.job_progress(bigint) IS
    'where a move or split is: its phase, how much of its copy is done, its replication lag';

CREATE FUNCTION pg_shard.wait_job(job_id bigint, timeout interval DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    current text;
    deadline timestamptz := clock_timestamp() + timeout;
    waited bigint := wait_job.job_id;
    following bigint;
    broken boolean;
    -- progress NOTICEs (pg_shard.job_progress_interval; none for 0)
    every interval := coalesce(nullif(current_setting('pg_shard.job_progress_interval', true), ''), '0')::interval;
    next_report timestamptz := clock_timestamp() + every;
BEGIN
    LOOP
        SELECT j.state INTO current FROM pg_shard.job j WHERE j.job_id = waited;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'job % does not exist', waited USING ERRCODE = 'undefined_object';
        END IF;
        IF current NOT IN ('done', 'failed', 'canceled') AND EXISTS (
               SELECT 1 FROM pg_shard.job j
                WHERE j.job_id = waited AND pg_shard.written_by_this_transaction(j.xmin)) THEN
            RAISE EXCEPTION 'job % was queued or changed by this transaction, so it cannot run until the transaction commits', waited
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      HINT = 'Commit first, then call pg_shard.wait_job() in a transaction of its own.';
        END IF;
        IF current = 'done' THEN
            -- the next step of an isolation, if the runner queued one; an
            -- isolation whose next step could not be queued did not finish
            SELECT (j.resources->>'next_job')::bigint, j.resources ? 'isolation_error'
              INTO following, broken
              FROM pg_shard.job j WHERE j.job_id = waited;
            IF following IS NOT NULL THEN
                waited := following;
                CONTINUE;
            ELSIF broken THEN
                RETURN 'failed';
            END IF;
        END IF;
        IF current IN ('done', 'failed', 'canceled') OR clock_timestamp() >= deadline THEN
            RETURN current;
        END IF;
        IF every > interval '0' AND clock_timestamp() >= next_report THEN
            RAISE NOTICE '%', pg_shard.job_progress(waited);
            next_report := clock_timestamp() + every;
        END IF;
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
COMMENT ON FUNCTION pg_shard.wait_job(bigint, interval) IS
    'wait until the job ends (or timeout passes) and return its state';

-- Shard groups of distributed tables with their bytes (a group weighs at
-- least a page, so empty groups still spread by count), by node.
CREATE FUNCTION pg_shard.group_loads()
RETURNS TABLE (shard_group_id bigint, shard_id bigint, node_id integer, bytes bigint)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT s.shard_group_id, min(s.shard_id), p.node_id,
           greatest(sum(coalesce(z.size_bytes, 0)), 8192)::bigint
      FROM pg_shard.shard s
      JOIN pg_shard.logical_table t USING (table_rel)
      JOIN pg_shard.placement p USING (shard_group_id)
      LEFT JOIN pg_shard.shard_sizes() z ON z.shard_id = s.shard_id AND z.node_id = p.node_id
     WHERE t.kind = 'distributed' AND p.state = 'active'
       AND NOT EXISTS (SELECT 1 FROM pg_shard.job j
                        WHERE (j.shard_group_id = s.shard_group_id
                               OR (j.resources->>'upper_group')::bigint = s.shard_group_id)
                          AND j.state IN ('queued', 'running'))
     GROUP BY s.shard_group_id, p.node_id
$$;

-- A coordinator's statement counts per shard (running totals since it
-- started): the rate since its previous report is kept with them (none
-- after a restart of the coordinator, whose totals start again). Unknown
-- shard ids are ignored; reports older than an hour are forgotten.
CREATE FUNCTION pg_shard.report_shard_load(coordinator text, shard_ids bigint[], statements bigint[],
                                           p50_ms double precision[] DEFAULT NULL,
                                           p99_ms double precision[] DEFAULT NULL)
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM pg_shard.shard_load WHERE reported_at < now() - interval '1 hour';
    INSERT INTO pg_shard.shard_load AS l (coordinator, shard_id, statements, per_second, p50_ms, p99_ms,
                                          reported_at)
    SELECT report_shard_load.coordinator, r.shard_id, r.statements, NULL, r.p50_ms, r.p99_ms, now()
      FROM unnest(shard_ids, statements, p50_ms, p99_ms) AS r (shard_id, statements, p50_ms, p99_ms)
     WHERE r.shard_id IS NOT NULL AND r.statements IS NOT NULL
       AND EXISTS (SELECT 1 FROM pg_shard.shard s WHERE s.shard_id = r.shard_id)
    ON CONFLICT (coordinator, shard_id) DO UPDATE
       SET statements = excluded.statements,
           p50_ms = excluded.p50_ms,
           p99_ms = excluded.p99_ms,
           per_second = CASE WHEN excluded.statements >= l.statements AND now() > l.reported_at
                             THEN (excluded.statements - l.statements)
                                  / extract(epoch FROM now() - l.reported_at)::double precision
                        END,
           reported_at = now();
$$;
COMMENT ON FUNCTION pg_shard.report_shard_load(text, bigint[], bigint[], double precision[], double precision[]) IS
    'called by coordinators: their statement counts and latency percentiles per shard';

-- Per shard placement: where it is, how big, how busy (from what the
-- coordinators reported in the last minute: statements per second summed,
-- p50 weighted by their rates, p99 the worst of theirs; last_report is the
-- newest report ever), and the replication lag of a move or split of its
-- group while one runs. Sizes and row estimates are read from the workers.
CREATE VIEW pg_shard.shard_stats AS
    WITH recent AS (
        SELECT l.shard_id,
               sum(l.per_second) AS per_second,
               sum(l.p50_ms * coalesce(nullif(l.per_second, 0), 1)) FILTER (WHERE l.p50_ms IS NOT NULL)
                 / sum(coalesce(nullif(l.per_second, 0), 1)) FILTER (WHERE l.p50_ms IS NOT NULL) AS p50_ms,
               max(l.p99_ms) AS p99_ms
          FROM pg_shard.shard_load l
         WHERE l.reported_at > now() - interval '1 minute'
         GROUP BY l.shard_id),
    reports AS (
        SELECT l.shard_id, max(l.reported_at) AS last_report
          FROM pg_shard.shard_load l GROUP BY l.shard_id),
    moving AS (
        SELECT DISTINCT ON (s.shard_group_id) s.shard_group_id, j.job_id, j.kind, j.phase, j.lag_bytes
          FROM pg_shard.job j JOIN pg_shard.shard s ON s.shard_id = j.shard_id
         WHERE j.state = 'running'
         ORDER BY s.shard_group_id, j.job_id DESC)
    SELECT s.table_rel                         AS table_name,
           s.shard_id,
           n.node_id,
           n.host,
           n.port,
           g.range_start,
           g.range_end,
           z.size_bytes,
           z.estimated_rows,
           coalesce(r.per_second, 0)           AS statements_per_second,
           r.p50_ms,
           r.p99_ms,
           rep.last_report,
           m.job_id,
           m.kind                              AS job_kind,
           m.phase                             AS job_phase,
           m.lag_bytes                         AS replication_lag_bytes
      FROM pg_shard.shard s
      JOIN pg_shard.shard_group g USING (shard_group_id)
      JOIN pg_shard.placement p USING (shard_group_id)
      JOIN pg_shard.node n USING (node_id)
      LEFT JOIN pg_shard.shard_sizes() z ON z.shard_id = s.shard_id AND z.node_id = n.node_id
      LEFT JOIN recent r ON r.shard_id = s.shard_id
      LEFT JOIN reports rep ON rep.shard_id = s.shard_id
      LEFT JOIN moving m ON m.shard_group_id = s.shard_group_id
     WHERE p.state <> 'retired'
     ORDER BY s.table_rel::oid, g.range_start, n.node_id;
COMMENT ON VIEW pg_shard.shard_stats IS
    'per shard placement: node, size, estimated rows, statements per second, p50/p99 latency '
    '(from the coordinators'' reports), and a running move or split''s replication lag';

-- For size and for statements per second: the busiest active node's total
-- over the median active node's (every active node counts, with 0 when it
-- holds or serves nothing). ratio is NULL when the median is 0.
CREATE FUNCTION pg_shard.imbalance()
RETURNS TABLE (measure text, busiest_node integer, busiest double precision,
               median double precision, ratio double precision)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH per_node AS (
        SELECT n.node_id,
               coalesce(sum(st.size_bytes), 0)::float8            AS size,
               coalesce(sum(st.statements_per_second), 0)::float8 AS rate
          FROM pg_shard.node n
          LEFT JOIN pg_shard.shard_stats st ON st.node_id = n.node_id
         WHERE n.state = 'active'
         GROUP BY n.node_id),
    measures AS (
        SELECT 'size_bytes' AS measure, node_id, size AS value FROM per_node
        UNION ALL
        SELECT 'statements_per_second', node_id, rate FROM per_node)
    SELECT m.measure,
           (SELECT b.node_id FROM measures b WHERE b.measure = m.measure
             ORDER BY b.value DESC, b.node_id LIMIT 1),
           max(m.value),
           percentile_cont(0.5) WITHIN GROUP (ORDER BY m.value),
           max(m.value) / nullif(percentile_cont(0.5) WITHIN GROUP (ORDER BY m.value), 0)
      FROM measures m
     GROUP BY m.measure
     ORDER BY m.measure;
$$;
COMMENT ON FUNCTION pg_shard.imbalance() IS
    'for size_bytes and statements_per_second: the busiest active node, its total, the median node''s, and their ratio';

-- The busiest node's weight over the median node's (NULL when the median
-- weighs nothing), for rebalance's plan.
-- A coordinator's hot keys (pg_shard_ext has no part in it): its report
-- replaces its rows; reports older than 5 minutes are not gathered.
CREATE FUNCTION pg_shard.report_hot_keys(coordinator text, schemas text[], tables text[],
                                         keyspace_ids bigint[], keys text[], statements bigint[],
                                         table_statements bigint[], errors bigint[])
RETURNS void
LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    DELETE FROM pg_shard.hot_key h
     WHERE h.coordinator = report_hot_keys.coordinator OR h.reported_at < now() - interval '1 hour';
    INSERT INTO pg_shard.hot_key (coordinator, table_rel, keyspace_id, key, statements, table_statements,
                                  error, reported_at)
    SELECT report_hot_keys.coordinator, t.table_rel, r.keyspace_id, r.key, r.statements, r.table_statements,
           r.error, now()
      FROM unnest(schemas, tables, keyspace_ids, keys, statements, table_statements, errors)
           AS r (schema_name, table_name, keyspace_id, key, statements, table_statements, error)
      JOIN pg_catalog.pg_namespace n ON n.nspname = r.schema_name
      JOIN pg_catalog.pg_class c ON c.relnamespace = n.oid AND c.relname = r.table_name
      JOIN pg_shard.logical_table t ON t.table_rel = c.oid
    ON CONFLICT DO NOTHING;
$$;

CREATE FUNCTION pg_shard.hot_keys()
RETURNS TABLE (table_name regclass, key text, keyspace_id bigint, statements bigint,
               share double precision, error bigint, shard_id bigint, node_id integer,
               coordinators integer, reported_at timestamptz)
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    WITH recent AS (
        SELECT * FROM pg_shard.hot_key WHERE reported_at >= now() - interval '5 minutes'
    ), table_totals AS (
        SELECT table_rel, sum(table_statements) AS total
          FROM (SELECT DISTINCT coordinator, table_rel, table_statements FROM recent) per_coordinator
         GROUP BY table_rel
    )
    SELECT h.table_rel::regclass, min(h.key), h.keyspace_id, sum(h.statements)::bigint,
           sum(h.statements)::double precision / nullif(min(t.total), 0),
           sum(h.error)::bigint, min(s.shard_id), min(p.node_id), count(*)::integer, max(h.reported_at)
      FROM recent h
      JOIN table_totals t USING (table_rel)
      LEFT JOIN pg_shard.shard s ON s.table_rel = h.table_rel::regclass
           AND s.shard_group_id = (SELECT g.shard_group_id FROM pg_shard.shard_group g
                                    JOIN pg_shard.logical_table l ON l.colocation_id = g.colocation_id
                                   WHERE l.table_rel = h.table_rel::regclass
                                     AND h.keyspace_id BETWEEN g.range_start AND g.range_end)
      LEFT JOIN pg_shard.placement p ON p.shard_group_id = s.shard_group_id AND p.state = 'active'
     GROUP BY h.table_rel, h.keyspace_id
     ORDER BY 5 DESC NULLS LAST, 1, 3
$$;
COMMENT ON FUNCTION pg_shard.hot_keys() IS
    'the hottest keys the coordinators reported in the last 5 minutes, by their share of their '
    'table''s statements, with the shard and node holding each';

CREATE FUNCTION pg_shard.imbalance_of(weights bigint[])
RETURNS numeric
LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT round((max(w) / nullif(percentile_cont(0.5) WITHIN GROUP (ORDER BY w), 0))::numeric, 3)
      FROM unnest(weights) w
$$;

CREATE FUNCTION pg_shard.rebalance(strategy text DEFAULT 'size', max_bytes bigint DEFAULT NULL,
                                   max_moves integer DEFAULT NULL, dry_run boolean DEFAULT true)
RETURNS TABLE (shard_id bigint, source_node integer, target_node integer, size_bytes bigint,
               imbalance_before numeric, imbalance_after numeric, job_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    heavy record;
    light record;
    chosen record;
    tolerance bigint;
    moved_bytes bigint := 0;
    moves integer := 0;
    ratio_before numeric;
BEGIN
    IF strategy IS NULL OR strategy NOT IN ('size', 'load') THEN
        RAISE EXCEPTION 'unknown rebalance strategy %', coalesce(quote_literal(strategy), 'NULL')
            USING ERRCODE = 'invalid_parameter_value', HINT = 'The strategies are ''size'' and ''load''.';
    END IF;
    IF strategy = 'load' AND NOT EXISTS (SELECT 1 FROM pg_shard.shard_load l
                                          WHERE l.reported_at > now() - interval '5 minutes'
                                            AND l.per_second IS NOT NULL) THEN
        RAISE EXCEPTION 'no coordinator has reported statement rates in the last 5 minutes'
            USING ERRCODE = 'object_not_in_prerequisite_state',
                  HINT = 'Coordinators report every 10 s while they route statements; strategy => ''size'' balances bytes.';
    END IF;
    IF max_bytes < 0 OR max_moves < 0 THEN
        RAISE EXCEPTION 'max_bytes and max_moves must not be negative'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A group's weight: its bytes, or (by load) its statements per second
    -- over the shards of its tables, summed over the coordinators' recent
    -- reports. The budget counts bytes either way.
    CREATE TEMP TABLE pg_shard_rebalance_groups ON COMMIT DROP AS
        SELECT g.*, CASE WHEN strategy = 'size' THEN g.bytes
                         ELSE coalesce((SELECT round(sum(l.per_second))::bigint
                                          FROM pg_shard.shard_load l JOIN pg_shard.shard s USING (shard_id)
                                         WHERE s.shard_group_id = g.shard_group_id
                                           AND l.reported_at > now() - interval '5 minutes'), 0)
                    END AS weight
          FROM pg_shard.group_loads() g;
    CREATE TEMP TABLE pg_shard_rebalance_loads ON COMMIT DROP AS
        SELECT n.node_id, coalesce(sum(g.weight), 0)::bigint AS bytes
          FROM pg_shard.node n LEFT JOIN pg_shard_rebalance_groups g USING (node_id)
         WHERE n.state = 'active' GROUP BY n.node_id;
    CREATE TEMP TABLE pg_shard_rebalance_moves
        (shard_id bigint, source_node integer, target_node integer, size_bytes bigint,
         imbalance_before numeric, imbalance_after numeric) ON COMMIT DROP;
    -- Nodes within 5 % of the average of each other count as balanced
    -- (no churn of small moves). A plan starts only beyond twice that: a
    -- moved table's size differs a little from its source's (free space,
    -- dead rows), so a just-balanced cluster must not plan again.
    SELECT coalesce(avg(l.bytes), 0)::bigint / 20 INTO tolerance FROM pg_shard_rebalance_loads l;
    IF (SELECT max(l.bytes) - min(l.bytes) FROM pg_shard_rebalance_loads l) <= 2 * tolerance THEN
        DROP TABLE pg_shard_rebalance_groups, pg_shard_rebalance_loads, pg_shard_rebalance_moves;
        RETURN;
    END IF;
    -- Greedy: the largest group on the fullest node that still narrows the
    -- gap to the emptiest one (and fits what is left of the budget) moves
    -- there; until no move narrows it or the budget is spent.
    LOOP
        EXIT WHEN moves >= coalesce(max_moves, moves + 1);
        SELECT l.node_id, l.bytes INTO heavy FROM pg_shard_rebalance_loads l ORDER BY l.bytes DESC, l.node_id LIMIT 1;
        SELECT l.node_id, l.bytes INTO light FROM pg_shard_rebalance_loads l ORDER BY l.bytes, l.node_id LIMIT 1;
        EXIT WHEN heavy IS NULL OR heavy.node_id = light.node_id OR heavy.bytes - light.bytes <= tolerance;
        SELECT g.shard_group_id, g.shard_id, g.bytes, g.weight INTO chosen
          FROM pg_shard_rebalance_groups g
         WHERE g.node_id = heavy.node_id AND g.weight > 0 AND g.weight < heavy.bytes - light.bytes
           AND moved_bytes + g.bytes <= coalesce(max_bytes, moved_bytes + g.bytes)
         ORDER BY g.weight DESC, g.shard_group_id LIMIT 1;
        EXIT WHEN NOT FOUND;
        SELECT pg_shard.imbalance_of(array_agg(l.bytes)) INTO ratio_before FROM pg_shard_rebalance_loads l;
        UPDATE pg_shard_rebalance_groups g SET node_id = light.node_id
         WHERE g.shard_group_id = chosen.shard_group_id;
        UPDATE pg_shard_rebalance_loads l SET bytes = l.bytes - chosen.weight WHERE l.node_id = heavy.node_id;
        UPDATE pg_shard_rebalance_loads l SET bytes = l.bytes + chosen.weight WHERE l.node_id = light.node_id;
        INSERT INTO pg_shard_rebalance_moves
        SELECT chosen.shard_id, heavy.node_id, light.node_id, chosen.bytes, ratio_before,
               pg_shard.imbalance_of(array_agg(l.bytes))
          FROM pg_shard_rebalance_loads l;
        moved_bytes := moved_bytes + chosen.bytes;
        moves := moves + 1;
    END LOOP;
    FOR chosen IN SELECT * FROM pg_shard_rebalance_moves LOOP
        shard_id := chosen.shard_id;
        source_node := chosen.source_node;
        target_node := chosen.target_node;
        size_bytes := chosen.size_bytes;
        imbalance_before := chosen.imbalance_before;
        imbalance_after := chosen.imbalance_after;
        job_id := CASE WHEN dry_run THEN NULL
                       ELSE pg_shard.queue_job('move', chosen.shard_id, chosen.target_node, NULL) END;
        RETURN NEXT;
    END LOOP;
    DROP TABLE pg_shard_rebalance_groups, pg_shard_rebalance_loads, pg_shard_rebalance_moves;
END $$;
COMMENT ON FUNCTION pg_shard.rebalance(text, bigint, integer, boolean) IS
    'plan (dry_run) or queue the moves that even out shard bytes (or, by load, the statements per second '
    'coordinators report) over the active nodes, within a budget of bytes moved and moves; each row shows '
    'the busiest/median node ratio before and after it';

CREATE FUNCTION pg_shard.drain_node(node_id integer)
RETURNS TABLE (shard_id bigint, target_node integer, job_id bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    drained record;
    chosen record;
    emptiest integer;
BEGIN
    SELECT n.node_id, n.host, n.port INTO drained FROM pg_shard.node n WHERE n.node_id = drain_node.node_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'node % does not exist', drain_node.node_id
            USING ERRCODE = 'undefined_object', HINT = 'pg_shard.node lists the nodes';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_shard.node n WHERE n.node_id <> drain_node.node_id AND n.state = 'active') THEN
        RAISE EXCEPTION 'node % is the only active node: there is nowhere to move its shards', drain_node.node_id
            USING ERRCODE = 'object_not_in_prerequisite_state';
    END IF;
    -- No new shards land on it (rebalance and new tables skip it).
    UPDATE pg_shard.node n SET state = 'inactive' WHERE n.node_id = drain_node.node_id;
    CREATE TEMP TABLE pg_shard_drain_loads ON COMMIT DROP AS
        SELECT n.node_id, coalesce(sum(g.bytes), 0)::bigint AS bytes
          FROM pg_shard.node n LEFT JOIN pg_shard.group_loads() g USING (node_id)
         WHERE n.state = 'active' GROUP BY n.node_id;
    FOR chosen IN SELECT * FROM pg_shard.group_loads() g WHERE g.node_id = drain_node.node_id
                   ORDER BY g.bytes DESC, g.shard_group_id LOOP
        SELECT l.node_id INTO emptiest FROM pg_shard_drain_loads l ORDER BY l.bytes, l.node_id LIMIT 1;
        UPDATE pg_shard_drain_loads l SET bytes = l.bytes + chosen.bytes WHERE l.node_id = emptiest;
        shard_id := chosen.shard_id;
        target_node := emptiest;
        job_id := pg_shard.queue_job('move', chosen.shard_id, emptiest, NULL);
        RETURN NEXT;
    END LOOP;
    DROP TABLE pg_shard_drain_loads;
END $$;
COMMENT ON FUNCTION pg_shard.drain_node(integer) IS
    'mark the node inactive and queue moves of every shard on it to the emptiest active nodes';

CREATE VIEW pg_shard.jobs AS
    SELECT j.job_id, j.kind, j.state, j.phase, j.shard_id,
           -- (a split replaces the shard asked for by its halves)
           coalesce(s.table_rel, (SELECT h.table_rel FROM pg_shard.shard h
                                   WHERE h.shard_id = (SELECT (x->>'lower_id')::bigint
                                                         FROM jsonb_array_elements(j.resources->'halves') x
                                                        WHERE (x->>'source_id')::bigint = j.shard_id))) AS table_name,
           format('%s:%s', src.host, src.port) AS source,
           format('%s:%s', dst.host, dst.port) AS target,
           j.split_at, j.rows_copied, j.bytes_copied, j.lag_bytes,
           j.created_at, j.started_at, j.phase_started_at, j.finished_at,
           coalesce(j.finished_at, now()) - j.started_at AS duration,
           j.error,
           -- time the copy (and a split's catch-up) waited for the source
           -- (pg_shard.max_replication_lag, pg_shard.max_source_latency),
           -- and the last reason
           (SELECT sum(value::bigint) FROM jsonb_each_text(j.resources->'throttled_ms'))
               * interval '1 millisecond' AS throttled,
           j.resources->>'throttled_by' AS throttled_by,
           -- a reads-first job: when its reads switched to the new copy,
           -- and when its writes follow (pg_shard.switch_writes_delay)
           (j.resources->>'reads_switched_at')::timestamptz AS reads_switched_at,
           (j.resources->>'switch_writes_at')::timestamptz AS switch_writes_at
    FROM pg_shard.job j
    LEFT JOIN pg_shard.shard s ON s.shard_id = j.shard_id
    JOIN pg_shard.node src ON src.node_id = j.source_node
    JOIN pg_shard.node dst ON dst.node_id = j.target_node
    ORDER BY j.job_id;
COMMENT ON VIEW pg_shard.jobs IS
    'shard moves and splits: state (queued, running, done, failed, canceled), current phase '
    '(a done job''s last: completed or reverted), '
    'progress (rows and bytes copied, replication lag), timings and error';

-- DROP TABLE: on the metadata node, drop the shards of dropped distributed
-- and reference tables (pg_shard_ext/src/commands/drop.rs); on a worker, forget the
-- ownership record of a dropped shard table.
-- SECURITY DEFINER: whoever may drop a table may drop its shards; the
-- function runs no code of the dropping role.
CREATE FUNCTION pg_shard.on_sql_drop() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    dropped record;
    logical oid[] := '{}';
    logical_names text[] := '{}';
    dropped_oids oid[];
    lookup_tables text[];
BEGIN
    -- Lookup tables go with their table (pg_shard.drop_lookup drops one on
    -- its own); dropped alone, the table's writes could not keep them.
    SELECT array_agg(objid) INTO dropped_oids
      FROM pg_catalog.pg_event_trigger_dropped_objects()
     WHERE classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND objsubid = 0
       AND object_type = 'table';
    IF EXISTS (SELECT 1 FROM pg_shard.lookup l
                WHERE l.lookup_rel::oid = ANY (dropped_oids)
                  AND l.table_rel::oid <> ALL (dropped_oids)) THEN
        RAISE EXCEPTION 'cannot drop lookup table %',
            (SELECT d.object_identity FROM pg_catalog.pg_event_trigger_dropped_objects() d
               JOIN pg_shard.lookup l ON l.lookup_rel::oid = d.objid
              WHERE d.classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.objsubid = 0
              LIMIT 1)
            USING ERRCODE = 'dependent_objects_still_exist',
                  HINT = 'Drop it with pg_shard.drop_lookup(table, column), or drop the table it looks up.';
    END IF;
    SELECT array_agg(pg_catalog.format('%I.%I', n.nspname, c.relname)) INTO lookup_tables
      FROM pg_shard.lookup l
      JOIN pg_catalog.pg_class c ON c.oid = l.lookup_rel
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
     WHERE l.table_rel::oid = ANY (dropped_oids) AND l.lookup_rel::oid <> ALL (dropped_oids);
    DELETE FROM pg_shard.lookup WHERE table_rel::oid = ANY (dropped_oids);
    FOR dropped IN
        SELECT objid, object_identity FROM pg_catalog.pg_event_trigger_dropped_objects()
        WHERE classid = 'pg_catalog.pg_class'::pg_catalog.regclass AND objsubid = 0
          AND object_type = 'table'
    LOOP
        IF EXISTS (SELECT 1 FROM pg_shard.logical_table WHERE table_rel::oid = dropped.objid) THEN
            IF EXISTS (SELECT 1 FROM pg_shard.job j JOIN pg_shard.shard sh USING (shard_group_id)
                        WHERE sh.table_rel::oid = dropped.objid AND j.state IN ('queued', 'running')) THEN
                RAISE EXCEPTION 'cannot drop table %: a shard move or split of it is in progress',
                    (SELECT table_rel FROM pg_shard.logical_table WHERE table_rel::oid = dropped.objid)
                    USING ERRCODE = 'object_in_use',
                          HINT = 'Wait for it (pg_shard.wait_job), cancel it (pg_shard.cancel_job), or past its cutover complete it (pg_shard.complete_job) first.';
            END IF;
            logical := logical || dropped.objid;
            logical_names := logical_names || dropped.object_identity;
        END IF;
        IF EXISTS (SELECT 1 FROM pg_shard.local_shard WHERE shard_rel::oid = dropped.objid) THEN
            DELETE FROM pg_shard.local_shard WHERE shard_rel::oid = dropped.objid;
        END IF;
    END LOOP;
    -- All at once: shard tables with foreign keys among them go together.
    IF cardinality(logical) > 0 THEN
        PERFORM pg_shard.drop_shards_internal(logical, logical_names);
    END IF;
    IF cardinality(lookup_tables) > 0 THEN
        EXECUTE 'DROP TABLE ' || pg_catalog.array_to_string(lookup_tables, ', ');
    END IF;
END $$;
CREATE EVENT TRIGGER pg_shard_sql_drop ON sql_drop
    EXECUTE FUNCTION pg_shard.on_sql_drop();

-- A relation named like a distributed or reference table, made in another
-- schema (or renamed or moved there), comes first in the search_path of
-- some sessions: coordinators reload their map, which lists such names, so
-- that they stop routing those sessions' statements to the shards.
CREATE FUNCTION pg_shard.on_ddl_command_end() RETURNS event_trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_event_trigger_ddl_commands() c
               JOIN pg_catalog.pg_class r ON r.oid = c.objid
               WHERE c.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
                 AND r.relpersistence <> 't'
                 AND r.relname IN (SELECT t.relname FROM pg_catalog.pg_class t
                                   JOIN pg_shard.logical_table l ON l.table_rel::pg_catalog.oid = t.oid)
                 AND r.oid NOT IN (SELECT l.table_rel::pg_catalog.oid FROM pg_shard.logical_table l)) THEN
        PERFORM pg_catalog.pg_notify('pg_shard_map', 'names');
    END IF;
END $$;
CREATE EVENT TRIGGER pg_shard_ddl_command_end ON ddl_command_end
    WHEN TAG IN ('CREATE TABLE', 'CREATE TABLE AS', 'SELECT INTO', 'CREATE VIEW',
                 'CREATE MATERIALIZED VIEW', 'CREATE FOREIGN TABLE', 'CREATE SEQUENCE',
                 'ALTER TABLE', 'ALTER VIEW', 'ALTER MATERIALIZED VIEW', 'ALTER FOREIGN TABLE',
                 'ALTER SEQUENCE')
    EXECUTE FUNCTION pg_shard.on_ddl_command_end();

-- The DBA functions change the cluster: superusers only unless granted.
-- (Their *_internal C functions check that the caller may run the
-- wrapper, and that it owns the table: a GRANT of the wrapper suffices.)
REVOKE ALL ON FUNCTION pg_shard.add_node(text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_distributed_table(regclass, text, integer, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_reference_table(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.undistribute_table(regclass) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.drop_shards_internal(oid[], text[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.queue_job(text, bigint, integer, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.move_shard(bigint, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.split_shard(bigint, bigint, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.switch_writes(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.cancel_job(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.revert_job(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.complete_job(bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.rebalance(text, bigint, integer, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.report_shard_load(text, bigint[], bigint[], double precision[], double precision[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.report_hot_keys(text, text[], text[], bigint[], text[], bigint[], bigint[], bigint[]) FROM PUBLIC;
-- Key values of every table: for whom the superuser grants it.
REVOKE ALL ON FUNCTION pg_shard.hot_keys() FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.drain_node(integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.isolate_tenant(regclass, anyelement, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.create_lookup(regclass, name, boolean) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.drop_lookup(regclass, name) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.isolate_tenant_internal(oid, anyelement, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.queue_isolation_step(oid, bigint, integer, bigint) FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.continue_isolation(bigint) FROM PUBLIC;
-- Each call may take a background worker slot; recovery ends other
-- sessions' prepared transactions.
REVOKE ALL ON FUNCTION pg_shard.start_job_runner() FROM PUBLIC;
REVOKE ALL ON FUNCTION pg_shard.recover_prepared_transactions() FROM PUBLIC;
-- add_node's: which node a worker is (its pg_shard.next_id generator).
REVOKE ALL ON FUNCTION pg_shard.record_local_node(integer) FROM PUBLIC;
-- A job's own wait inside its cutover (it holds a backend for up to its
-- timeout).
REVOKE ALL ON FUNCTION pg_shard.await_marker(oid, bigint, bigint[], bigint, integer) FROM PUBLIC;

-- Stands for the workers' rows in the final query of a pushed-down
-- statement (pg_shard_ext/src/executor/pushdown_scan.rs) and for
-- intermediate results; its scan is replaced by pg_shard's own, so it never
-- runs. PARALLEL RESTRICTED: that scan runs in the leader, while the rest of
-- the statement (reference and local tables) may use parallel workers.
CREATE FUNCTION pg_shard.worker_results() RETURNS SETOF record
LANGUAGE plpgsql PARALLEL RESTRICTED ROWS 1000 SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'pg_shard.worker_results() only runs inside pg_shard''s plans';
END
$$;

-- Partial aggregation of avg, variance and standard deviation in pushed-down
-- statements (pg_shard_ext/src/planner/combine.rs): each worker returns its
-- groups' transition states, made by PostgreSQL's own transition function
-- and, for internal states, serialized by PostgreSQL's own serialization
-- (pg_shard.<transition function>_state); the metadata node combines them
-- with PostgreSQL's own combine function and applies the aggregate's final
-- function (pg_shard.<final function>_combine): the same arithmetic as a
-- parallel aggregate on one server. Internal transition states need a
-- superuser to declare; CREATE EXTENSION runs as one.
CREATE AGGREGATE pg_shard.int2_accum_state(smallint) (
    SFUNC = pg_catalog.int2_accum, STYPE = internal, FINALFUNC = pg_catalog.numeric_poly_serialize);
CREATE AGGREGATE pg_shard.int4_accum_state(integer) (
    SFUNC = pg_catalog.int4_accum, STYPE = internal, FINALFUNC = pg_catalog.numeric_poly_serialize);
CREATE AGGREGATE pg_shard.int8_accum_state(bigint) (
    SFUNC = pg_catalog.int8_accum, STYPE = internal, FINALFUNC = pg_catalog.numeric_serialize);
CREATE AGGREGATE pg_shard.numeric_accum_state(numeric) (
    SFUNC = pg_catalog.numeric_accum, STYPE = internal, FINALFUNC = pg_catalog.numeric_serialize);
CREATE AGGREGATE pg_shard.float4_accum_state(real) (
    SFUNC = pg_catalog.float4_accum, STYPE = float8[], INITCOND = '{0,0,0}');
CREATE AGGREGATE pg_shard.float8_accum_state(double precision) (
    SFUNC = pg_catalog.float8_accum, STYPE = float8[], INITCOND = '{0,0,0}');
CREATE AGGREGATE pg_shard.int2_avg_accum_state(smallint) (
    SFUNC = pg_catalog.int2_avg_accum, STYPE = int8[], INITCOND = '{0,0}');
CREATE AGGREGATE pg_shard.int4_avg_accum_state(integer) (
    SFUNC = pg_catalog.int4_avg_accum, STYPE = int8[], INITCOND = '{0,0}');
CREATE AGGREGATE pg_shard.int8_avg_accum_state(bigint) (
    SFUNC = pg_catalog.int8_avg_accum, STYPE = internal, FINALFUNC = pg_catalog.int8_avg_serialize);
CREATE AGGREGATE pg_shard.numeric_avg_accum_state(numeric) (
    SFUNC = pg_catalog.numeric_avg_accum, STYPE = internal, FINALFUNC = pg_catalog.numeric_avg_serialize);
CREATE AGGREGATE pg_shard.interval_accum_state(interval) (
    SFUNC = pg_catalog.interval_accum, STYPE = interval[], INITCOND = '{0 second,0 second}');

-- Deserialize a worker's state and combine it into the running one
-- (pg_shard_ext/src/executor/aggregate_states.rs).
CREATE FUNCTION pg_shard.numeric_state_combine(internal, bytea) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'numeric_state_combine';
CREATE FUNCTION pg_shard.numeric_poly_state_combine(internal, bytea) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'numeric_poly_state_combine';
CREATE FUNCTION pg_shard.numeric_avg_state_combine(internal, bytea) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'numeric_avg_state_combine';
CREATE FUNCTION pg_shard.int8_avg_state_combine(internal, bytea) RETURNS internal
    LANGUAGE c PARALLEL SAFE AS 'MODULE_PATHNAME', 'int8_avg_state_combine';
CREATE AGGREGATE pg_shard.int8_avg_combine(int8[]) (
    SFUNC = pg_catalog.int4_avg_combine, STYPE = int8[], INITCOND = '{0,0}',
    FINALFUNC = pg_catalog.int8_avg);
CREATE AGGREGATE pg_shard.numeric_poly_avg_combine(bytea) (
    SFUNC = pg_shard.int8_avg_state_combine, STYPE = internal, FINALFUNC = pg_catalog.numeric_poly_avg);
CREATE AGGREGATE pg_shard.numeric_avg_combine(bytea) (
    SFUNC = pg_shard.numeric_avg_state_combine, STYPE = internal, FINALFUNC = pg_catalog.numeric_avg);
CREATE AGGREGATE pg_shard.float8_avg_combine(float8[]) (
    SFUNC = pg_catalog.float8_combine, STYPE = float8[], INITCOND = '{0,0,0}',
    FINALFUNC = pg_catalog.float8_avg);
CREATE AGGREGATE pg_shard.interval_avg_combine(interval[]) (
    SFUNC = pg_catalog.interval_combine, STYPE = interval[], INITCOND = '{0 second,0 second}',
    FINALFUNC = pg_catalog.interval_avg);

DO $$
DECLARE
    final text;
BEGIN
    FOREACH final IN ARRAY ARRAY['var_samp', 'var_pop', 'stddev_samp', 'stddev_pop'] LOOP
        EXECUTE format('CREATE AGGREGATE pg_shard.%I(bytea) (SFUNC = pg_shard.numeric_poly_state_combine, '
                       'STYPE = internal, FINALFUNC = pg_catalog.%I)',
                       'numeric_poly_' || final || '_combine', 'numeric_poly_' || final);
        EXECUTE format('CREATE AGGREGATE pg_shard.%I(bytea) (SFUNC = pg_shard.numeric_state_combine, '
                       'STYPE = internal, FINALFUNC = pg_catalog.%I)',
                       'numeric_' || final || '_combine', 'numeric_' || final);
        EXECUTE format('CREATE AGGREGATE pg_shard.%I(float8[]) (SFUNC = pg_catalog.float8_combine, '
                       'STYPE = float8[], INITCOND = ''{0,0,0}'', FINALFUNC = pg_catalog.%I)',
                       'float8_' || final || '_combine', 'float8_' || final);
    END LOOP;
END
$$;

-- array_agg in pushed-down statements: the workers' arrays, concatenated.
CREATE AGGREGATE pg_shard.array_cat_agg(anycompatiblearray) (
    SFUNC = pg_catalog.array_cat, STYPE = anycompatiblearray);
