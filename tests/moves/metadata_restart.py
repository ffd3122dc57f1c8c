#!/usr/bin/env python3
"""A client of the coordinator while the metadata node crash-restarts: its
statements by key run on the workers, and the prepares it sends meanwhile
(psycopg prepares a statement on its fifth execution; the coordinator asks
the metadata node, which knows every table) wait for the node instead of
failing. Usage: metadata_restart.py METADATA_PORT COORDINATOR_PORT DATABASE"""
import os
import signal
import sys
import time

import psycopg
from tap import Checks, connect as connect_to, distributed_counters

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("metadata node restart")


def connect(port):
    return connect_to(dsn.format(port))


meta = connect(metadata_port)
distributed_counters(meta, "restart_items", 100)
time.sleep(1)  # the coordinator hears of the new table

client = connect(coordinator_port)
client.execute("SELECT v FROM restart_items WHERE id = %s", (1,)).fetchone()
errors = []
prepared = []
for round_ in range(3):
    # A metadata node backend killed: the postmaster ends every backend and
    # runs crash recovery (as a killed job runner makes it do).
    victim = connect(metadata_port)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.02)
    started = time.monotonic()
    try:
        # prepare=True: a Parse on its own, as psycopg's fifth execution.
        # (A new text each round: psycopg prepares a text once.)
        key = 10 + round_
        sql = f"UPDATE restart_items SET v = v + {round_ + 1} WHERE id = %s RETURNING v"
        row = client.execute(sql, (key,), prepare=True).fetchone()
        again = client.execute(sql, (key,), prepare=True).fetchone()
        prepared.append((row[0], again[0], round(time.monotonic() - started, 2)))
    except psycopg.Error as e:
        errors.append(f"{e.sqlstate} {str(e).splitlines()[0]}")
        if client.closed:
            client = connect(coordinator_port)

check(f"prepares while the metadata node restarts succeed ({errors[:2]})", not errors)
check(f"and the prepared statements run, each once ({prepared})",
      [p[:2] for p in prepared] == [(1, 2), (2, 4), (3, 6)])
meta = connect(metadata_port)
values = meta.execute("SELECT array_agg(v ORDER BY id) FROM restart_items WHERE id BETWEEN 10 AND 12").fetchone()[0]
check(f"the metadata node reads the same ({values})", values == [2, 4, 6])
meta.execute("DROP TABLE restart_items")
sys.exit(1 if check.failures else 0)
