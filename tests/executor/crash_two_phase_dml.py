#!/usr/bin/env python3
"""A multi-shard UPDATE through the metadata node (pg_shard's executor, one
statement per shard group on every worker), and a COPY into a distributed
table (rows streamed to every worker's shards), are all or nothing:

* a worker that refuses at PREPARE TRANSACTION (a deferred constraint
  trigger planted on one of its shard tables fails at commit time) makes
  the statement fail, and no worker keeps its part;
* a backend killed after the workers prepared but before the metadata node
  committed: once pg_shard.recover_prepared_transactions() ran, no worker
  keeps its part;
* killed after the metadata node committed but before COMMIT PREPARED:
  every worker's part is committed by the recovery.

(The backend pauses between the phases under pg_shard.test_pause_*
settings; it is killed with SIGKILL, which restarts the metadata node's
backends.)

Usage: crash_two_phase_dml.py METADATA_PORT DATABASE
"""
import os
import signal
import sys
import threading
import time

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "moves"))
sys.path.insert(0, os.path.join(HERE, "..", "ddl"))
from tap import Checks, connect  # noqa: E402
from crash_two_phase import prepared, recover_after_restart  # noqa: E402

TABLE = "crash_two_phase_dml"
ROWS = 200


def per_worker(workers, value):
    """Rows holding `value`, on each worker's shards."""
    counts = []
    for dsn in workers:
        with connect(dsn) as conn:
            total = 0
            for (shard,) in conn.execute(
                    "SELECT shard_rel::regclass::text FROM pg_shard.local_shard s "
                    "JOIN pg_class c ON c.oid = s.shard_rel WHERE c.relname LIKE %s",
                    (TABLE + "\\_%",)).fetchall():
                total += conn.execute(
                    f"SELECT count(*) FROM {shard} WHERE v = %s", (value,)).fetchone()[0]
            counts.append(total)
    return counts


COPY_ROWS = 100


def copy_rows(conn, first_id, value):
    """COPY rows first_id + 1 … first_id + COPY_ROWS holding `value` into
    the table (they land on every worker)."""
    with conn.cursor().copy(f"COPY {TABLE} (id, v) FROM STDIN") as copy:
        for i in range(first_id + 1, first_id + COPY_ROWS + 1):
            copy.write_row((i, value))


def main():
    port, database = int(sys.argv[1]), sys.argv[2]
    dsn = f"host=127.0.0.1 port={port} dbname={database} user=postgres"
    check = Checks("two-phase multi-shard DML")
    with connect(dsn) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {TABLE}")
        admin.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v text)")
        admin.execute(f"INSERT INTO {TABLE} SELECT g, 'start' FROM generate_series(1, {ROWS}) g")
        admin.execute(f"SELECT pg_shard.create_distributed_table('{TABLE}', 'id', "
                      "shard_count => 4, colocate_with => 'none')")
        workers = [f"host={host} port={p} dbname={database} user=postgres" for host, p in
                   admin.execute("SELECT host, port FROM pg_shard.node WHERE state = 'active' "
                                 "ORDER BY node_id")]
        plan = "\n".join(r[0] for r in admin.execute(
            f"EXPLAIN (COSTS OFF) UPDATE {TABLE} SET v = 'x'").fetchall())
    check("the UPDATE is a multi-shard statement of pg_shard's executor",
          "pg_shard Modify" in plan)

    # A worker refuses at PREPARE: a deferred constraint trigger on one of
    # its shards fails when the transaction is prepared.
    with connect(workers[-1]) as worker:
        shard = worker.execute(
            "SELECT shard_rel::regclass::text FROM pg_shard.local_shard s "
            "JOIN pg_class c ON c.oid = s.shard_rel WHERE c.relname LIKE %s LIMIT 1",
            (TABLE + "\\_%",)).fetchone()[0]
        worker.execute("CREATE FUNCTION public.crash_dml_refuse() RETURNS trigger "
                       "LANGUAGE plpgsql AS $$BEGIN RAISE EXCEPTION 'refused at commit'; END$$")
        worker.execute(f"CREATE CONSTRAINT TRIGGER crash_dml_refuse AFTER INSERT OR UPDATE ON {shard} "
                       "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW "
                       "EXECUTE FUNCTION public.crash_dml_refuse()")
    for kind, write in [
        ("UPDATE", lambda client: client.execute(f"UPDATE {TABLE} SET v = 'refused'")),
        ("COPY", lambda client: copy_rows(client, 10_000, "refused")),
    ]:
        with connect(dsn) as client:
            try:
                write(client)
                outcome = "committed"
            except psycopg.Error as e:
                outcome = e.diag.message_primary or e.sqlstate
        check(f"a worker refusing an {kind} at PREPARE fails it ({outcome})",
              "refused at commit" in outcome)
        counts = per_worker(workers, "refused")
        check(f"{kind}: no worker keeps its part ({counts})", sum(counts) == 0)
        check(f"{kind}: nothing is left prepared", prepared(workers) == 0)
    with connect(workers[-1]) as worker:
        worker.execute(f"DROP TRIGGER crash_dml_refuse ON {shard}")
        worker.execute("DROP FUNCTION public.crash_dml_refuse()")

    for kind, first_id, setting, value, committed in [
        ("UPDATE", 0, "pg_shard.test_pause_after_prepare", "before_commit", False),
        ("UPDATE", 0, "pg_shard.test_pause_before_commit_prepared", "after_commit", True),
        ("COPY", 20_000, "pg_shard.test_pause_after_prepare", "copy_before_commit", False),
        ("COPY", 30_000, "pg_shard.test_pause_before_commit_prepared", "copy_after_commit", True),
    ]:
        victim = connect(dsn)
        pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        victim.execute(f"SET {setting} = 20000")

        def update():
            try:
                if kind == "UPDATE":
                    victim.execute(f"UPDATE {TABLE} SET v = %s", (value,))
                else:
                    copy_rows(victim, first_id, value)
            except Exception:  # the connection dies with its backend
                pass

        thread = threading.Thread(target=update)
        thread.start()

        def paused():
            return prepared(workers) >= len(workers)

        deadline = time.time() + 15
        while not paused() and time.time() < deadline:
            time.sleep(0.1)
        check(f"{value}: every worker prepared, the {kind}'s backend pauses", paused())
        os.kill(pid, signal.SIGKILL)
        thread.join()
        recover_after_restart(dsn)
        counts = per_worker(workers, value)
        expected = (ROWS if kind == "UPDATE" else COPY_ROWS) if committed else 0
        check(f"{value}: nothing left prepared after recovery", prepared(workers) == 0)
        check(f"{value}: {'every' if committed else 'no'} worker has its part ({counts})",
              sum(counts) == expected and (not committed or all(c > 0 for c in counts)))
        with connect(dsn) as admin:
            seen = admin.execute(f"SELECT count(*) FROM {TABLE} WHERE v = %s",
                                 (value,)).fetchone()[0]
            leftover = admin.execute(
                "SELECT count(*) FROM pg_shard.remote_transaction").fetchone()[0]
        check(f"{value}: the metadata node reads the same ({seen})", seen == expected)
        check(f"{value}: no remote transaction records left ({leftover})", leftover == 0)
    with connect(dsn) as admin:
        admin.execute(f"DROP TABLE {TABLE}")
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
