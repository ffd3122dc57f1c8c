#!/usr/bin/env python3
"""CREATE INDEX CONCURRENTLY of a distributed table does not block writes.

A transaction left open on one shard's worker makes the build wait there
(PostgreSQL's CONCURRENTLY waits for older transactions); meanwhile inserts
and updates through the coordinator and through the metadata node must go
through. Once the transaction ends the build finishes, and every shard
table has a valid index.

Usage: concurrent_index.py METADATA_PORT COORDINATOR_PORT DATABASE
"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect  # noqa: E402

TABLE = "concurrent_index"


def main():
    metadata_port, coordinator_port, database = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    metadata = f"host=127.0.0.1 port={metadata_port} dbname={database} user=postgres"
    coordinator = f"host=127.0.0.1 port={coordinator_port} dbname={database} user=postgres"
    check = Checks("create index concurrently")
    with connect(metadata) as admin:
        admin.execute(f"DROP TABLE IF EXISTS {TABLE}")
        admin.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, v text)")
        admin.execute(f"INSERT INTO {TABLE} SELECT g, 'v' || g FROM generate_series(1, 2000) g")
        admin.execute(f"SELECT pg_shard.create_distributed_table('{TABLE}', 'id', "
                      "shard_count => 4, colocate_with => 'none')")
        admin.execute("SELECT pg_sleep(1)")  # the coordinator reloads its map
        workers = [f"host={h} port={p} dbname={database} user=postgres" for h, p in
                   admin.execute("SELECT host, port FROM pg_shard.node WHERE state = 'active'")]

    holder = connect(coordinator)
    holder.execute("BEGIN")
    holder.execute(f"UPDATE {TABLE} SET v = 'held' WHERE id = 1")

    outcome = {}

    def build():
        try:
            with connect(metadata) as conn:
                conn.execute(f"CREATE INDEX CONCURRENTLY {TABLE}_v ON {TABLE} (v)")
            outcome["error"] = None
        except Exception as error:  # reported below
            outcome["error"] = error

    builder = threading.Thread(target=build)
    builder.start()
    time.sleep(2)
    check("the build waits for the open transaction", builder.is_alive())

    wrote = 0
    started = time.time()
    try:
        with connect(coordinator) as app, connect(metadata) as local:
            for conn in (app, local):
                conn.execute("SET statement_timeout = '5s'")
            for i in range(200):
                app.execute(f"INSERT INTO {TABLE} VALUES (%s, 'new')", (10000 + i,))
                app.execute(f"UPDATE {TABLE} SET v = 'changed' WHERE id = %s", (2 + i,))
                wrote += 2
            for i in range(20):
                local.execute(f"INSERT INTO {TABLE} VALUES (%s, 'local')", (20000 + i,))
                wrote += 1
    except Exception as error:
        print(f"# write failed: {error}")
    check(f"writes went through while it built ({wrote} statements in "
          f"{time.time() - started:.1f} s)", wrote == 420)
    check("the build was still waiting", builder.is_alive())

    holder.execute("COMMIT")
    holder.close()
    builder.join(timeout=60)
    check("the build finished once the transaction ended",
          not builder.is_alive() and outcome.get("error") is None)
    if outcome.get("error") is not None:
        print(f"# build failed: {outcome['error']}")

    shards = valid = 0
    for dsn in workers:
        with connect(dsn) as conn:
            row = conn.execute(
                "SELECT count(*), count(i.indexrelid) FILTER (WHERE i.indisvalid) "
                "FROM pg_shard.local_shard s JOIN pg_class t ON t.oid = s.shard_rel "
                "LEFT JOIN pg_index i ON i.indrelid = t.oid AND i.indexrelid IN "
                "  (SELECT oid FROM pg_class WHERE relname LIKE %s) "
                "WHERE t.relname LIKE %s",
                (TABLE + "\\_v\\_%", TABLE + "\\_%")).fetchone()
            shards, valid = shards + row[0], valid + row[1]
    check(f"every shard table has a valid index ({valid} of {shards})", shards == 4 and valid == 4)
    with connect(metadata) as admin:
        recorded = admin.execute(
            "SELECT count(*) FROM pg_shard.table_constraint WHERE name = %s",
            (TABLE + "_v",)).fetchone()[0]
        rows = admin.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0]
        admin.execute(f"DROP TABLE {TABLE}")
    check("the index is recorded", recorded == 1)
    check(f"no write lost ({rows} rows)", rows == 2220)
    return 1 if check.failures else 0


if __name__ == "__main__":
    sys.exit(main())
