#!/usr/bin/env python3
"""Multiplexed reads: autocommit single-shard SELECTs of many clients share
one pipelined connection per worker. Each answer must reach the client that
asked, a slow read must not hold up the others, cancel requests must hit
only their own statement, and a pipe that dies must not fail any read.
Usage: multiplex.py COORDINATOR_PORT METADATA_PORT DATABASE METRICS_ADDRESS"""
import sys
import threading
import time
import urllib.request

import psycopg
from tap import Checks

port, metadata_port, database, metrics = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
via_dsn = f"host=127.0.0.1 port={port} dbname={database} user=postgres"
check = Checks("multiplex")


def metric(name):
    text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(line.split()[1])
    return 0


def via():
    return psycopg.connect(via_dsn, autocommit=True)


def owner(conn, key):
    row = conn.execute("SELECT owner FROM accounts WHERE id = %s", (key,)).fetchone()
    return row[0] if row else None


def reads_right(keys):
    """Reads each key's owner on a new connection; True if all are right."""
    with via() as conn:
        return [owner(conn, k) for k in keys] == [f"owner {k}" for k in keys]


def in_threads(work, count):
    """Runs work(i) in threads; returns (results, errors) once all ended, or
    None for those still running after 20 s."""
    results, errors = [None] * count, []

    def run(i):
        try:
            results[i] = work(i)
        except Exception as e:  # noqa: BLE001 - reported as a failure
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return results, errors, any(t.is_alive() for t in threads)


meta = psycopg.connect(f"host=127.0.0.1 port={metadata_port} dbname={database} user=postgres",
                       autocommit=True)
shard_table, worker_port = meta.execute(
    "SELECT shard_table::text, port FROM pg_shard.shards WHERE table_name = 'accounts'::regclass"
    " AND pg_shard.keyspace_id(42::bigint) BETWEEN range_start AND range_end").fetchone()
# Keys on the same worker as 42, in its other shards.
neighbours = [r[0] for r in meta.execute(
    "SELECT a.id FROM accounts a JOIN pg_shard.shards s ON s.table_name = 'accounts'::regclass"
    " AND pg_shard.keyspace_id(a.id) BETWEEN s.range_start AND s.range_end"
    " WHERE s.port = %s AND s.shard_table::text <> %s ORDER BY a.id LIMIT 8",
    (worker_port, shard_table)).fetchall()]
worker_dsn = f"host=127.0.0.1 port={worker_port} dbname={database} user=postgres"

# Many clients at once: every answer is the asker's own.
before = metric("pg_shard_multiplexed_statements_total")


def many_reads(i):
    with via() as conn:
        return all(owner(conn, (i * 7 + n) % 100 + 1) == f"owner {(i * 7 + n) % 100 + 1}"
                   for n in range(100))


results, errors, stuck = in_threads(many_reads, 8)
after = metric("pg_shard_multiplexed_statements_total")
check(f"8 clients x 100 reads, each got its own rows ({errors})",
      all(results) and not errors and not stuck)
check(f"reads went over shared connections ({after - before} multiplexed)", after - before > 100)
with via() as conn:
    modes = [r[3] for r in conn.execute("SHOW POOLS").fetchall()]
check("SHOW POOLS lists the multiplexed connections", "multiplexed" in modes)


def wait_for_lock_wait(worker, timeout=10):
    """Waits until some backend waits for a lock; returns its pid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = worker.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()").fetchone()
        if row:
            return row[0]
        time.sleep(0.05)
    return None


# A read that waits for a lock holds up nobody: reads of other shards of the
# same worker are answered while it waits (they go around it).
locker = psycopg.connect(worker_dsn)
locker.execute(f"LOCK TABLE {shard_table} IN ACCESS EXCLUSIVE MODE")
blocked_result = {}


def blocked_read():
    try:
        with via() as conn:
            blocked_result["owner"] = owner(conn, 42)
    except Exception as e:  # noqa: BLE001 - reported below
        blocked_result["error"] = repr(e)


blocked = threading.Thread(target=blocked_read, daemon=True)
blocked.start()
with psycopg.connect(worker_dsn, autocommit=True) as worker:
    waiting_pid = wait_for_lock_wait(worker)
    check("a read waits for the lock", waiting_pid is not None)
    results, errors, stuck = in_threads(lambda i: reads_right(neighbours), 4)
    check(f"other reads on that worker answered meanwhile ({errors})",
          all(results) and not errors and not stuck and blocked.is_alive())
    # Another client's cancel request (here: pg_cancel_backend) reaching the
    # shared connection must not fail this client's read: it runs again.
    if waiting_pid is not None:
        worker.execute("SELECT pg_cancel_backend(%s)", (waiting_pid,))
        time.sleep(0.5)
locker.commit()
blocked.join(20)
check(f"the waiting read got its answer, not another client's cancel ({blocked_result})",
      blocked_result.get("owner") == "owner 42")

# Many reads of the locked shard at once: those queued behind the first give
# up their places after a while and wait on pooled connections; all get
# their answers once the lock goes, and the shared connection is healthy
# afterwards (nothing left in flight, reads multiplexed again).
locker.execute(f"LOCK TABLE {shard_table} IN ACCESS EXCLUSIVE MODE")
start = threading.Barrier(8)


def read_together(i):
    with via() as conn:
        start.wait()
        return owner(conn, 42)


together = {}
crowd = threading.Thread(target=lambda: together.update(zip(("results", "errors", "stuck"),
                                                            in_threads(read_together, 8))),
                         daemon=True)
crowd.start()
time.sleep(1)
locker.commit()
crowd.join(30)
check(f"8 reads queued on a locked shard all answered ({together.get('errors')})",
      together.get("results") == ["owner 42"] * 8 and not together.get("stuck"))
before = metric("pg_shard_multiplexed_statements_total")
reads_right(list(range(1, 51)))
after = metric("pg_shard_multiplexed_statements_total")
with via() as conn:
    in_flight = [int(r[5]) for r in conn.execute("SHOW POOLS").fetchall() if r[3] == "multiplexed"]
check(f"shared connections healthy afterwards ({after - before} of 50 multiplexed, in flight {in_flight})",
      after - before >= 45 and in_flight and all(n == 0 for n in in_flight))

# A client's own cancel request cancels its own read.
locker.execute(f"LOCK TABLE {shard_table} IN ACCESS EXCLUSIVE MODE")
canceled = {}
victim = via()


def read_to_cancel():
    try:
        canceled["owner"] = owner(victim, 42)
    except psycopg.errors.QueryCanceled:
        canceled["canceled"] = True
    except Exception as e:  # noqa: BLE001 - reported below
        canceled["error"] = repr(e)


reader = threading.Thread(target=read_to_cancel, daemon=True)
reader.start()
with psycopg.connect(worker_dsn, autocommit=True) as worker:
    wait_for_lock_wait(worker)
victim.cancel()
reader.join(20)
locker.commit()
check(f"a client's cancel request cancels its read ({canceled})", canceled.get("canceled") is True)
check("the canceled client's next read works", owner(victim, 42) == "owner 42")
victim.close()

# Settings travel with the client: each client's reads run with its own.
plain, tuned = via(), via()
tuned.execute("SET extra_float_digits = -3")
# As text: the digits of a float are what the setting changes.
query = "SELECT ((id + 1)::float8 / 3)::text FROM accounts WHERE id = 42"
plain_text, tuned_text = set(), set()
for _ in range(20):
    plain_text.add(plain.execute(query).fetchone()[0])
    tuned_text.add(tuned.execute(query).fetchone()[0])
check(f"each client's reads use its own settings ({plain_text} / {tuned_text})",
      plain_text == {"14.333333333333334"} and tuned_text == {"14.3333333333"})
plain.close()
tuned.close()

# A statement that fails to prepare on the shared connection leaves it usable.
with via() as conn:
    try:
        conn.execute("SELECT no_such_column FROM accounts WHERE id = %s", (1,), prepare=True)
        bad_prepare = False
    except psycopg.errors.UndefinedColumn:
        bad_prepare = True
    good = all(conn.execute("SELECT owner FROM accounts WHERE id = %s", (k,), prepare=True).fetchone()[0]
               == f"owner {k}" for k in range(1, 30))
check("a failing prepared read reports its error; prepared reads go on", bad_prepare and good)

# Not multiplexing, but found with it: a statement prepared inside a
# transaction before it ran anything (pgbench -M prepared does this) is
# answered outside it, and the transaction still runs on the key's worker.
with via() as conn:
    conn.autocommit = False
    conn.execute("SELECT owner FROM accounts WHERE id = %s", (42,), prepare=True)
    runs_on = int(conn.execute("SELECT current_setting('port')").fetchone()[0])
    conn.rollback()
check(f"a prepare at a transaction's start leaves it free to run on its worker ({runs_on})",
      runs_on == worker_port)

# The shared connections die (their server backends are terminated): no read
# fails, a new pipe is opened.
with psycopg.connect(worker_dsn, autocommit=True) as worker:
    killed = worker.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
        " WHERE application_name = 'pg_shard_coordinator' AND datname = current_database()").fetchone()[0]
results, errors, stuck = in_threads(lambda i: reads_right(neighbours + [42]), 4)
check(f"server connections killed ({killed}): every read still answered ({errors})",
      all(results) and not errors and not stuck)

sys.exit(1 if check.failures else 0)
