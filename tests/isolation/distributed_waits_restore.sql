DROP FUNCTION pg_catalog.pg_isolation_test_session_is_blocked(integer, integer[]);
ALTER FUNCTION pg_catalog.pg_isolation_test_session_is_blocked_local(integer, integer[])
    RENAME TO pg_isolation_test_session_is_blocked;
