#!/usr/bin/env python3
"""What a statement through the metadata node does to the workers' sessions.

* The workers see the acting role: pg_shard connects as it (trust or the
  role's own credentials), with no user mapping to keep.
* A cancel (the driver's cancel request, or pg_cancel_backend from another
  session) stops the remote work too: the routed or pushed-down query on
  the workers ends, not only the metadata node's backend.
* statement_timeout ends a multi-shard UPDATE waiting for a row lock on a
  worker: its remote statements end, no row of it is kept, nothing is left
  prepared or waiting.

Usage: remote_sessions.py METADATA_PORT DATABASE
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
check = Checks("remote sessions")
ROLE = "rs_app"
MARKER = "400000007"  # in the long statements' text, to find them on the workers

setup = connect(dsn)
distributed_counters(setup, "rs_accounts", 20, shard_count=4)
workers = setup.execute(
    "SELECT DISTINCT port FROM pg_shard.shards WHERE table_name = 'rs_accounts'::regclass ORDER BY 1"
).fetchall()
worker_dsns = [f"host=127.0.0.1 port={p} dbname={database} user=postgres" for (p,) in workers]


def on_workers(sql):
    """sql's single value on every worker holding rs_accounts' shards."""
    values = []
    for worker_dsn in worker_dsns:
        with connect(worker_dsn) as worker:
            values.append(worker.execute(sql).fetchone()[0])
    return values


def remote_running():
    """Backends on the workers still running one of the long statements."""
    return sum(on_workers(
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' "
        f"AND query LIKE '%{MARKER}%' AND pid <> pg_backend_pid()"))


def remote_queries():
    """What the workers' backends running a long statement are doing."""
    return on_workers(
        "SELECT string_agg(format('%s %s %s', pid, state, left(query, 60)), '; ') "
        f"FROM pg_stat_activity WHERE query LIKE '%{MARKER}%' AND pid <> pg_backend_pid()")


def settles(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


# The acting role: created on every node (roles are per server), granted on
# the table (grants reach the shards).
for node_dsn in [dsn] + worker_dsns:
    with connect(node_dsn) as node:
        node.execute(f"DROP ROLE IF EXISTS {ROLE}")
        node.execute(f"CREATE ROLE {ROLE} LOGIN")
setup.execute(f"GRANT SELECT, UPDATE ON rs_accounts TO {ROLE}")
mappings = setup.execute(
    "SELECT count(*) FROM pg_user_mappings WHERE usename = %s", (ROLE,)).fetchone()[0]
app = connect(f"host=127.0.0.1 port={port} dbname={database} user={ROLE}")
app.execute("BEGIN")
app.execute("UPDATE rs_accounts SET v = v + 1 WHERE id = 1")
app.execute("UPDATE rs_accounts SET v = v + 1 WHERE v >= 0")
roles = on_workers(
    "SELECT string_agg(DISTINCT usename, ',') FROM pg_stat_activity "
    "WHERE state = 'idle in transaction' AND pid <> pg_backend_pid()")
app.execute("COMMIT")
total = setup.execute("SELECT sum(v) FROM rs_accounts").fetchone()[0]
app.close()
check(f"the workers' sessions of an application role's transaction act as it ({roles})",
      all(r == ROLE for r in roles))
check(f"with no user mapping for it ({mappings})", mappings == 0)
check(f"and its writes commit ({total})", total == 21)

# Cancels: the driver's cancel request and pg_cancel_backend, of a routed
# statement (one key) and of a pushed-down one (every shard group).
statements = {
    "routed": f"SELECT count(*) FROM rs_accounts a, generate_series(1, {MARKER}) g WHERE a.id = 3",
    "pushed-down": f"SELECT count(*) FROM rs_accounts a, generate_series(1, {MARKER}) g",
}
for kind, statement in statements.items():
    for how in ("cancel request", "pg_cancel_backend"):
        runner = connect(dsn)
        pid = runner.info.backend_pid
        outcome = {}

        def run():
            try:
                runner.execute(statement)
                outcome["error"] = "finished"
            except psycopg.Error as e:
                outcome["error"] = e.sqlstate

        thread = threading.Thread(target=run)
        thread.start()
        started = settles(lambda: remote_running() > 0)
        if how == "cancel request":
            runner.cancel()
        else:
            setup.execute("SELECT pg_cancel_backend(%s)", (pid,))
        thread.join(30)
        check(f"a {kind} statement runs on the workers ({started}); a {how} ends it with "
              f"57014 ({outcome.get('error')})",
              started and outcome.get("error") == "57014")
        ended = settles(lambda: remote_running() == 0)
        check(f"and its remote query on the workers ends too ({how}; "
              f"{'' if ended else remote_queries()})", ended)
        check(f"the session goes on ({how})",
              runner.execute("SELECT count(*) FROM rs_accounts").fetchone()[0] == 20)
        runner.close()

# statement_timeout of a multi-shard UPDATE waiting on a worker for a row
# another transaction holds.
holder = connect(dsn)
holder.execute("BEGIN")
holder.execute("UPDATE rs_accounts SET v = v + 1000 WHERE id = 5")
waiter = connect(dsn)
waiter.execute("SET statement_timeout = '700ms'")
began = time.monotonic()
try:
    waiter.execute("UPDATE rs_accounts SET v = v + 1 WHERE v >= 0")
    error = "finished"
except psycopg.Error as e:
    error = e.sqlstate
waited = time.monotonic() - began
check(f"statement_timeout ends a multi-shard UPDATE waiting for a row lock ({error}, "
      f"{waited:.1f} s)", error == "57014" and waited < 10)
check("no remote statement is left waiting for the lock",
      settles(lambda: sum(on_workers(
          "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")) == 0))
holder.execute("COMMIT")
total = waiter.execute("SELECT sum(v) FROM rs_accounts").fetchone()[0]
check(f"only the holder's update is kept ({total})", total == 1021)
check("the session goes on",
      waiter.execute("UPDATE rs_accounts SET v = v - 1 WHERE v >= 0").rowcount == 20)
prepared = sum(on_workers("SELECT count(*) FROM pg_prepared_xacts"))
check(f"nothing is left prepared on the workers ({prepared})", prepared == 0)
holder.close()
waiter.close()

setup.execute("DROP TABLE rs_accounts")
for node_dsn in [dsn] + worker_dsns:
    with connect(node_dsn) as node:
        node.execute(f"DROP ROLE IF EXISTS {ROLE}")
setup.close()
sys.exit(1 if check.failures else 0)
