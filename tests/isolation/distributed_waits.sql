-- isolationtester asks pg_catalog.pg_isolation_test_session_is_blocked
-- whether a step waits, and PostgreSQL's answer only knows this node's
-- locks. A statement the metadata node routed to a worker waits there, in
-- the worker backend pg_shard opened for the session: this replacement also
-- answers yes when that backend waits for a lock held by the worker backend
-- of another session of the test (pg_shard.worker_activity()). Installed for
-- schedule_executor by tests/run_regress.sh, put back by
-- distributed_waits_restore.sql.
ALTER FUNCTION pg_catalog.pg_isolation_test_session_is_blocked(integer, integer[])
    RENAME TO pg_isolation_test_session_is_blocked_local;

CREATE FUNCTION pg_catalog.pg_isolation_test_session_is_blocked(blocked integer, interesting integer[])
RETURNS boolean LANGUAGE sql VOLATILE AS $$
    SELECT pg_catalog.pg_isolation_test_session_is_blocked_local(blocked, interesting)
        OR EXISTS (
            WITH activity AS MATERIALIZED (SELECT * FROM pg_shard.worker_activity())
            SELECT FROM activity waiter
              JOIN activity holder
                ON holder.node_id = waiter.node_id
               AND holder.worker_pid = ANY (waiter.blocked_by)
             WHERE waiter.origin_pid = blocked
               AND holder.origin_pid = ANY (interesting))
$$;
