#!/usr/bin/env python3
"""Router writes through the metadata node and the extended protocol's
implicit transactions.

A write that is all its transaction does (autocommit: a simple query of one
statement, or Bind/Execute/Sync sent together) commits on its worker on its
own. A write followed by more statements before the Sync (a pipeline) is
part of their transaction: if a later one fails, it is rolled back with
them; if they all succeed, all commit, on every node they wrote.

Usage: pipeline_writes.py METADATA_PORT DATABASE
"""
import os
import sys

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect, distributed_counters  # noqa: E402

port, database = sys.argv[1], sys.argv[2]
dsn = f"host=127.0.0.1 port={port} dbname={database} user=postgres"
check = Checks("pipeline writes")

conn = connect(dsn)
distributed_counters(conn, "pw_accounts", 40, shard_count=4)
# Two keys on different nodes.
nodes = conn.execute(
    "SELECT k, p.node_id FROM generate_series(1, 40) k, pg_shard.shard s "
    "JOIN pg_shard.shard_group g USING (shard_group_id) JOIN pg_shard.placement p USING (shard_group_id) "
    "WHERE s.table_rel = 'pw_accounts'::regclass "
    "AND pg_shard.keyspace_id(k::bigint) BETWEEN g.range_start AND g.range_end ORDER BY k").fetchall()
first = nodes[0][0]
second = next(k for k, node in nodes if node != nodes[0][1])


def value(key):
    return conn.execute("SELECT v FROM pw_accounts WHERE id = %s", (key,)).fetchone()[0]


update = "UPDATE pw_accounts SET v = v + 1 WHERE id = %s"

# Autocommit, extended protocol: Bind, Execute, Sync together.
conn.execute(update, (first,))
check("an autocommit UPDATE commits", value(first) == 1)
# Simple protocol (PQexec), one statement.
for _ in range(2):
    result = conn.pgconn.exec_(f"UPDATE pw_accounts SET v = v + 1 WHERE id = {first}".encode())
    check(f"a simple-protocol UPDATE succeeds ({result.status})", result.status == psycopg.pq.ExecStatus.COMMAND_OK)
check("and commits", value(first) == 3)

# A pipeline: the write, then a statement that fails, then Sync.
failed = None
try:
    with conn.pipeline():
        conn.execute(update, (first,))
        conn.execute(update, (second,))
        conn.execute("SELECT 1 / (v - v) FROM pw_accounts WHERE id = %s", (first,))
except psycopg.Error as e:
    failed = e.sqlstate
check(f"a pipeline whose last statement fails fails ({failed})", failed == "22012")
check(f"and its writes on both nodes are rolled back ({value(first)}, {value(second)})",
      (value(first), value(second)) == (3, 0))

# A pipeline whose statements all succeed: every write commits.
with conn.pipeline():
    conn.execute(update, (first,))
    conn.execute(update, (second,))
    conn.execute(update, (second,))
check(f"a pipeline of writes on two nodes commits them all ({value(first)}, {value(second)})",
      (value(first), value(second)) == (4, 2))

conn.execute("DROP TABLE pw_accounts")
sys.exit(1 if check.failures else 0)
