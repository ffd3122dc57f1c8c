#!/usr/bin/env python3
"""A schema change whose backend dies between the two phases of its commit
ends up everywhere or nowhere once pg_shard.recover_prepared_transactions()
ran: killed after the workers prepared but before the metadata node
committed, the change is rolled back on every worker; killed after the
metadata node committed but before COMMIT PREPARED, it is committed on every
worker. (The backend pauses there under pg_shard.test_pause_* settings; it
is killed with SIGKILL, which restarts the metadata node's backends.)

Usage: crash_two_phase.py METADATA_PORT DATABASE
"""
import os
import signal
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect  # noqa: E402

TABLE = "crash_two_phase"


def prepared(workers):
    """Transactions prepared on the workers, in all."""
    total = 0
    for dsn in workers:
        with connect(dsn) as conn:
            total += conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
    return total


def shards_with_column(workers, column):
    """(shard tables of the table, how many have `column`) over all workers."""
    shards = having = 0
    for dsn in workers:
        with connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*), count(a.attname) FROM pg_shard.local_shard s "
                "JOIN pg_class c ON c.oid = s.shard_rel "
                "LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND a.attname = %s "
                "AND NOT a.attisdropped WHERE c.relname LIKE %s",
                (column, TABLE + "\\_%"),
            ).fetchone()
            shards, having = shards + row[0], having + row[1]
    return shards, having


def recover_after_restart(dsn):
    """Run the recovery once the metadata node is back from the crash
    restart a killed backend causes. A connection made before the
    postmaster noticed the kill is ended by that restart: try again."""
    time.sleep(1)
    for _ in range(60):
        try:
            with connect(dsn) as admin:
                admin.execute("SELECT pg_shard.recover_prepared_transactions()")
                return
        except psycopg.OperationalError:
            time.sleep(0.5)
    raise RuntimeError("the metadata node did not come back")


def main():
    port, database = int(sys.argv[1]), sys.argv[2]
    dsn = f"host=127.0.0.1 port={port} dbname={database} user=postgres"
    check = Checks("two-phase crash")
    with connect(dsn) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {TABLE}")
        admin.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v text)")
        admin.execute(f"INSERT INTO {TABLE} SELECT g, 'v' FROM generate_series(1, 200) g")
        admin.execute(f"SELECT pg_shard.create_distributed_table('{TABLE}', 'id', "
                      "shard_count => 4, colocate_with => 'none')")
        workers = [f"host={host} port={p} dbname={database} user=postgres" for host, p in
                   admin.execute("SELECT host, port FROM pg_shard.node WHERE state = 'active'")]
    for setting, column, committed in [
        ("pg_shard.test_pause_after_prepare", "added_before_commit", False),
        ("pg_shard.test_pause_before_commit_prepared", "added_after_commit", True),
    ]:
        victim = connect(dsn)
        pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        victim.execute(f"SET {setting} = 20000")

        def alter():
            try:
                victim.execute(f"ALTER TABLE {TABLE} ADD COLUMN {column} int")
            except Exception:  # the connection dies with its backend
                pass

        thread = threading.Thread(target=alter)
        thread.start()
        # In the pause: the workers prepared, and (the second time) the
        # metadata node committed.
        def paused():
            with connect(dsn) as observer:
                visible = observer.execute(
                    "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass "
                    "AND attname = %s", (TABLE, column)).fetchone()[0]
            return prepared(workers) > 0 and visible == (1 if committed else 0)

        deadline = time.time() + 15
        while not paused() and time.time() < deadline:
            time.sleep(0.1)
        check(f"{column}: the workers prepared, the backend pauses", paused())
        os.kill(pid, signal.SIGKILL)
        thread.join()
        recover_after_restart(dsn)
        with connect(dsn) as admin:
            on_metadata = admin.execute(
                "SELECT count(*) FROM pg_attribute WHERE attrelid = %s::regclass "
                "AND attname = %s AND NOT attisdropped", (TABLE, column)).fetchone()[0]
            admin.execute(f"INSERT INTO {TABLE} (id, v) VALUES (1000 + length(%s), 'after')",
                          (column,))
            rows = admin.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
            leftover = admin.execute(
                "SELECT count(*) FROM pg_shard.remote_transaction").fetchone()[0]
        shards, having = shards_with_column(workers, column)
        check(f"{column}: nothing left prepared after recovery", prepared(workers) == 0)
        expected = shards if committed else 0
        check(f"{column}: {'every' if committed else 'no'} shard has the column "
              f"({having} of {shards})", shards > 0 and having == expected)
        check(f"{column}: the metadata node agrees", on_metadata == (1 if committed else 0))
        check(f"{column}: the table still takes writes ({rows} rows)", rows >= 201)
        check(f"{column}: no remote transaction records left ({leftover})", leftover == 0)
    with connect(dsn) as admin:
        admin.execute(f"DROP TABLE {TABLE}")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
