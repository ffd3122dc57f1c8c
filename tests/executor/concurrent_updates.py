#!/usr/bin/env python3
"""Concurrent UPDATEs of one row through the metadata node.

A router statement (one key, autocommit) runs at READ COMMITTED on the
worker, as on one PostgreSQL: it waits for the transaction that holds the
row, then updates the version that transaction committed, with no
serialization failure; a read meanwhile sees the last committed version and
does not wait. The same UPDATE over postgres_fdw (the router turned off)
fails with 40001 instead, which is what the router fixes. (An isolation spec
cannot show this: the wait is on a worker, where isolationtester does not
look.)

Usage: concurrent_updates.py METADATA_PORT DATABASE
"""
import os
import sys
import threading
import time

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect, distributed_counters  # noqa: E402

port, database = sys.argv[1], sys.argv[2]
dsn = f"host=127.0.0.1 port={port} dbname={database} user=postgres"
check = Checks("concurrent updates")

setup = connect(dsn)
distributed_counters(setup, "cu_accounts", 10, shard_count=2)


def value():
    return setup.execute("SELECT v FROM cu_accounts WHERE id = 1").fetchone()[0]


def update_while_held(router, amount, statement=None):
    """Hold row 1 in a transaction, run the update beside it; returns
    (finished while held, result or error SQLSTATE)."""
    holder = connect(dsn)
    other = connect(dsn)
    if not router:
        other.execute("SET pg_shard.enable_router_executor = off")
        other.execute("SET pg_shard.enable_pushdown_executor = off")
    holder.execute("BEGIN")
    holder.execute("UPDATE cu_accounts SET v = v + 1 WHERE id = 1")
    outcome = {}
    statement = statement or "UPDATE cu_accounts SET v = v + %s WHERE id = 1 RETURNING v"

    def run():
        try:
            rows = other.execute(statement, (amount,)).fetchall()
            outcome["value"] = sorted(rows)[0][0]
            outcome["rows"] = len(rows)
        except psycopg.Error as e:
            outcome["error"] = e.sqlstate

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    finished_while_held = not thread.is_alive()
    # A read beside the open transaction: no wait, the committed version.
    # (Were it to wait, it would wait for the COMMIT below: the timeout
    # turns that into an error.)
    reader = connect(dsn)
    reader.execute("SET statement_timeout = '10s'")
    try:
        seen = reader.execute("SELECT v FROM cu_accounts WHERE id = 1").fetchone()[0]
    except psycopg.Error as e:
        seen = e.sqlstate
    holder.execute("COMMIT")
    thread.join(30)
    for conn in (holder, other, reader):
        conn.close()
    return finished_while_held, outcome, seen


before = value()
waited, outcome, seen = update_while_held(router=True, amount=10)
check("the router's UPDATE waits for the transaction holding the row", not waited)
check(f"a read meanwhile does not wait and sees the committed value ({seen})", seen == before)
check(f"then it updates the committed version, no serialization failure ({outcome})",
      outcome.get("value") == before + 11)
check("the row holds both updates", value() == before + 11)

before = value()
waited, outcome, _ = update_while_held(router=False, amount=100)
check(f"over postgres_fdw the same UPDATE fails with 40001 ({outcome})",
      outcome.get("error") == "40001")
check("and only the holder's update is there", value() == before + 1)

# An UPDATE of every shard (one statement per shard group, in remote
# transactions at READ COMMITTED) waits for the row too, then updates all.
before = value()
every = "UPDATE cu_accounts SET v = v + %s WHERE v >= 0 RETURNING v, id"
waited, outcome, seen = update_while_held(router=True, amount=1000, statement=every)
check("a multi-shard UPDATE waits for the transaction holding a row", not waited)
check(f"a read meanwhile sees the committed value ({seen})", seen == before)
check(f"then it updates all ten rows, no serialization failure ({outcome})",
      outcome.get("rows") == 10 and "error" not in outcome)
check("the held row holds both updates", value() == before + 1001)

# The same in a transaction block: its statements share one remote
# transaction per node and see each other's writes.
holder = connect(dsn)
holder.execute("BEGIN")
holder.execute("UPDATE cu_accounts SET v = v + 1 WHERE v >= 0")
mine = holder.execute("SELECT sum(v) FROM cu_accounts").fetchone()[0]
other = connect(dsn)
theirs = other.execute("SELECT sum(v) FROM cu_accounts").fetchone()[0]
holder.execute("UPDATE cu_accounts SET v = v - 1 WHERE id = 2")
mine_after = holder.execute("SELECT sum(v) FROM cu_accounts").fetchone()[0]
holder.execute("COMMIT")
check(f"a transaction block reads its own multi-shard writes ({mine} = {theirs} + 10)",
      mine == theirs + 10)
check(f"and its later single-row ones ({mine_after})", mine_after == mine - 1)
check("a multi-shard transaction commits everywhere",
      other.execute("SELECT sum(v) FROM cu_accounts").fetchone()[0] == theirs + 9)
# (Workers listen on the ports after the metadata node's.)
prepared = 0
for worker_port in (int(port) + 1, int(port) + 2):
    worker = connect(f"host=127.0.0.1 port={worker_port} dbname={database} user=postgres")
    prepared += worker.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
    worker.close()
check(f"nothing is left prepared on the workers ({prepared})", prepared == 0)
holder.close()
other.close()

setup.execute("DROP TABLE cu_accounts")
setup.close()
sys.exit(1 if check.failures else 0)
