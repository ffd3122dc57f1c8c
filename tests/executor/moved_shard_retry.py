#!/usr/bin/env python3
"""A statement through the metadata node that meets a shard move's cutover.

The cutover locks the source shard, retires it and then publishes the new
map. A router statement that reached the source meanwhile is refused there
(PS001); when nothing of its transaction had run on the workers before it
(autocommit, or a transaction's first statement) it waits for the new map
and runs again on the new owner, so the client sees no error, as through
the coordinator. A later statement of a transaction cannot be run again
(what the transaction did before would be lost): it gets the PS001.

Each case holds the move at the start of its cutover (the job pause lock),
holds the source shard with an open write so that the cutover's lock
waits, sends the statement under test (which queues behind the cutover's
lock, as pg_shard.worker_activity() shows), and lets go.

Usage: moved_shard_retry.py METADATA_PORT DATABASE
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
check = Checks("moved shard retry")

meta = connect(dsn)
for table in ("mr_accounts", "mr_other"):
    distributed_counters(meta, table, 100, shard_count=1, colocate_with="none")
# (Two shards: a statement over both is pushed down.)
distributed_counters(meta, "mr_wide", 100, shard_count=2, colocate_with="none")


def shard_of_row_100(table):
    """The shard holding row 100 of table (the one the cases move)."""
    return meta.execute(
        "SELECT s.shard_id FROM pg_shard.shard s JOIN pg_shard.shard_group g USING (shard_group_id) "
        "WHERE s.table_rel = %s::regclass "
        "AND pg_shard.keyspace_id(100::bigint) BETWEEN g.range_start AND g.range_end",
        (table,)).fetchone()[0]


def node_of(table):
    return meta.execute(
        "SELECT p.node_id FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) "
        "WHERE s.shard_id = %s", (shard_of_row_100(table),)).fetchone()[0]


def other_node(node_id):
    return meta.execute("SELECT min(node_id) FROM pg_shard.node WHERE state = 'active' AND node_id <> %s",
                        (node_id,)).fetchone()[0]


def wait_until(query, params=(), timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if meta.execute(query, params).fetchone()[0]:
            return True
        time.sleep(0.05)
    return False


def worker_waits(pid):
    """Whether the worker backend serving metadata backend `pid` waits for a lock."""
    return wait_until("SELECT EXISTS (SELECT FROM pg_shard.worker_activity() "
                      "WHERE origin_pid = %s AND wait_event_type = 'Lock')", (pid,))


def through_cutover(name, work, before=None, table="mr_accounts"):
    """Moves the shard of table's row 100 to another node while work(conn)
    runs on a connection of its own, queued behind the cutover's lock;
    before(conn) runs on that connection first, before the move is let go."""
    shard = shard_of_row_100(table)
    source = node_of(table)
    target = other_node(source)
    holder = connect(dsn)
    holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('cutover'))")
    meta.execute("SET pg_shard.move_drop_delay = 0")
    # (The cutover's lock waits for the blocker here, not only 100 ms.)
    meta.execute("SET pg_shard.cutover_lock_timeout = '5min'")
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
    meta.execute("RESET pg_shard.cutover_lock_timeout")
    at_cutover = wait_until("SELECT phase = 'cutover' FROM pg_shard.job WHERE job_id = %s", (job,))
    blocker = connect(dsn)
    blocker.execute("BEGIN")
    blocker.execute(f"UPDATE {table} SET v = v WHERE id = 100")
    tested = connect(dsn)
    if before:
        before(tested)
    holder.execute("SELECT pg_advisory_unlock_all()")
    runner_waits = wait_until("SELECT EXISTS (SELECT FROM pg_shard.worker_activity() "
                              "WHERE wait_event_type = 'Lock' AND query LIKE %s)", ("%LOCK TABLE%",))
    outcome = {}

    def run():
        try:
            outcome["rows"] = work(tested)
        except psycopg.Error as e:
            outcome["error"] = e.sqlstate
            tested.execute("ROLLBACK")

    thread = threading.Thread(target=run)
    thread.start()
    queued = worker_waits(tested.info.backend_pid)
    blocker.execute("COMMIT")
    thread.join(60)
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    check(f"{name}: the move was held at its cutover, the statement queued behind its lock "
          f"({at_cutover}, {runner_waits}, {queued})", at_cutover and runner_waits and queued)
    check(f"{name}: the move is done and the shard on node {target} ({state}, {node_of(table)})",
          state == "done" and node_of(table) == target)
    for conn in (holder, blocker, tested):
        conn.close()
    return outcome


def value(key):
    return meta.execute("SELECT v FROM mr_accounts WHERE id = %s", (key,)).fetchone()[0]


# An autocommit UPDATE … RETURNING: refused by the retired source, run again
# on the new owner; the client sees its rows.
outcome = through_cutover(
    "autocommit",
    lambda c: c.execute("UPDATE mr_accounts SET v = v + 10 WHERE id = 2 RETURNING v").fetchall())
check(f"autocommit UPDATE: no error, RETURNING from the new owner ({outcome})", outcome.get("rows") == [(10,)])
check("autocommit UPDATE: the row holds it", value(2) == 10)


# A transaction's first statement: run again, and the transaction goes on
# on the new owner, reading its own write.
def first_statement(c):
    c.execute("BEGIN")
    c.execute("UPDATE mr_accounts SET v = v + 5 WHERE id = 3")
    read = c.execute("SELECT v FROM mr_accounts WHERE id = 3").fetchall()
    c.execute("COMMIT")
    return read


outcome = through_cutover("first statement", first_statement)
check(f"first statement: no error, the transaction reads its write ({outcome})", outcome.get("rows") == [(5,)])
check("first statement: committed", value(3) == 5)


# Prepared through the protocol, its generic plan (the parameter picks the
# shard) cached before the move: run again too.
def prepare(c):
    for _ in range(7):
        c.execute("UPDATE mr_accounts SET v = v + 0 WHERE id = %s RETURNING v", (6,), prepare=True)


outcome = through_cutover(
    "prepared",
    lambda c: c.execute("UPDATE mr_accounts SET v = v + 3 WHERE id = %s RETURNING v", (6,),
                        prepare=True).fetchall(),
    before=prepare)
check(f"prepared UPDATE: no error ({outcome})", outcome.get("rows") == [(3,)])
check("prepared UPDATE: the row holds it", value(6) == 3)


# A later statement of a transaction that already wrote on a node: not run
# again, the PS001 reaches the client, and nothing of the transaction
# commits.
def begin_elsewhere(c):
    c.execute("BEGIN")
    c.execute("UPDATE mr_other SET v = v + 1 WHERE id = 4")


outcome = through_cutover(
    "later statement",
    lambda c: c.execute("UPDATE mr_accounts SET v = v + 7 WHERE id = 4").rowcount,
    before=begin_elsewhere)
check(f"later statement: refused with PS001 ({outcome})", outcome.get("error") == "PS001")
check("later statement: nothing of the transaction committed",
      meta.execute("SELECT (SELECT v FROM mr_accounts WHERE id = 4), (SELECT v FROM mr_other WHERE id = 4)"
                    ).fetchone() == (0, 0))

# A pushed-down read over every shard group (autocommit) that reaches the
# source after the cutover retired it and before the new map is published
# (a read does not queue behind the cutover's EXCLUSIVE lock: the window is
# held open here by a lock on the job's row, which the cutover's step
# updates after the retire, before its commit publishes the map): the
# source refuses it, it waits for the new map, finds its shard groups
# again and runs again.
def between_retire_and_publish(statement):
    shard = shard_of_row_100("mr_wide")
    source = node_of("mr_wide")
    target = other_node(source)
    source_port = meta.execute("SELECT port FROM pg_shard.node WHERE node_id = %s",
                               (source,)).fetchone()[0]
    source_db = connect(f"host=127.0.0.1 port={source_port} dbname={database} user=postgres")
    # The job held at the start of its cutover (the runner's pause point),
    # its row locked, then let go: the cutover retires the source and
    # waits for the row.
    phase_holder = connect(dsn)
    phase_holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('cutover'))")
    meta.execute("SET pg_shard.move_drop_delay = 0")
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
    deadline = time.time() + 60
    while time.time() < deadline and meta.execute(
            "SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0] != "cutover":
        time.sleep(0.05)
    map_holder = connect(dsn)
    map_holder.execute("BEGIN")
    map_holder.execute("SELECT 1 FROM pg_shard.job WHERE job_id = %s FOR UPDATE", (job,))
    phase_holder.close()
    deadline = time.time() + 60
    retired = False
    while time.time() < deadline and not retired:
        retired = source_db.execute("SELECT EXISTS (SELECT FROM pg_shard.local_shard "
                                    "WHERE shard_id = %s AND state = 'retired')",
                                    (shard,)).fetchone()[0]
        time.sleep(0.05)
    tested = connect(dsn)
    outcome = {}

    def run():
        try:
            outcome["rows"] = tested.execute(statement).fetchall()
        except psycopg.Error as e:
            outcome["error"] = e.sqlstate

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    waited = thread.is_alive()
    map_holder.execute("COMMIT")
    thread.join(60)
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    check(f"pushdown: the source was retired before the new map, the statement waited for it, "
          f"the move is done ({retired}, {waited}, {state}, node {node_of('mr_wide')})",
          retired and waited and state == "done" and node_of("mr_wide") == target)
    for conn in (source_db, map_holder, tested):
        conn.close()
    return outcome


meta.execute("UPDATE mr_wide SET v = id")
outcome = between_retire_and_publish("SELECT count(*), sum(v) FROM mr_wide")
check(f"pushed-down SELECT: no error, every row counted ({outcome})",
      outcome.get("rows") == [(100, 5050)])
outcome = between_retire_and_publish("SELECT id, v FROM mr_wide WHERE v > 95 ORDER BY id")
check(f"pushed-down SELECT of rows: no error, each row once ({outcome})",
      outcome.get("rows") == [(i, i) for i in range(96, 101)])
# A multi-shard UPDATE (autocommit) the same way: what it began on the
# nodes is rolled back, and it runs again.
outcome = between_retire_and_publish("UPDATE mr_wide SET v = v + 1 WHERE v >= 0 RETURNING id")
check(f"multi-shard UPDATE: no error, every row returned once ({len(outcome.get('rows', []))} rows, "
      f"{outcome.get('error')})", sorted(outcome.get("rows", [])) == [(i,) for i in range(1, 101)])
total = meta.execute("SELECT sum(v) FROM mr_wide").fetchone()[0]
check(f"multi-shard UPDATE: every row updated once ({total})", total == 5150)
meta.execute("UPDATE mr_wide SET v = id")


# A pushed-down read prepared (its plan cached) before a move and run after
# the move published its new map, before its cleanup replaced the metadata
# node's partitions: the new map invalidates the plan, and the one made
# again reads the shard groups where they are now.
def cached_pushdown():
    shard = shard_of_row_100("mr_wide")
    target = other_node(node_of("mr_wide"))
    tested = connect(dsn)
    statement = "SELECT count(*), sum(v) FROM mr_wide"
    for _ in range(3):
        tested.execute(statement, prepare=True)
    holder = connect(dsn)
    holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('cleanup'))")
    meta.execute("SET pg_shard.move_drop_delay = 0")
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
    at_cleanup = wait_until("SELECT phase = 'cleanup' FROM pg_shard.job WHERE job_id = %s", (job,))
    try:
        outcome = tested.execute(statement, prepare=True).fetchall()
    except psycopg.Error as e:
        outcome = e.sqlstate
    holder.execute("SELECT pg_advisory_unlock_all()")
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    for conn in (holder, tested):
        conn.close()
    return at_cleanup, state, outcome


at_cleanup, state, outcome = cached_pushdown()
check(f"cached pushdown: the move was held before its cleanup, then done ({at_cleanup}, {state})",
      at_cleanup and state == "done")
check(f"cached pushdown: no error, every row counted ({outcome})", outcome == [(100, 5050)])



# A session that keeps writing through a move routes the moved shard's
# statements to the new owner afterwards. (Its statements take their
# snapshot before they lock the table: one planned just after the cleanup
# replaced the foreign partition still saw the old one, and the router kept
# that read for the rest of the map version; the session's statements on
# that shard then all took the postgres_fdw path.)
def writes_through_move():
    shard = shard_of_row_100("mr_accounts")
    target = other_node(node_of("mr_accounts"))
    writer = connect(dsn)
    stop = threading.Event()
    failures = []

    def write():
        while not stop.is_set():
            try:
                writer.execute("UPDATE mr_accounts SET v = v + 1 WHERE id = %s", (100,))
            except psycopg.Error as e:
                failures.append(e.sqlstate)

    thread = threading.Thread(target=write)
    thread.start()
    meta.execute("SET pg_shard.move_drop_delay = 0")
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    time.sleep(0.5)
    stop.set()
    thread.join(30)
    plan = [row[0] for row in writer.execute(
        "EXPLAIN (COSTS OFF) UPDATE mr_accounts SET v = v + 1 WHERE id = 100").fetchall()]
    writer.close()
    return state, failures, plan


state, failures, plan = writes_through_move()
check(f"writes through a move: done, no write failed ({state}, {failures[:3]})", state == "done" and not failures)
check(f"writes through a move: the writing session routes the moved shard afterwards ({plan[:2]})",
      any("pg_shard Router" in line for line in plan))


# A split held between its new map and its cleanup (the halves have no
# foreign partitions on the metadata node yet): a transaction whose first
# statement ran on a worker goes on with a write to one of the halves, on
# pg_shard's own connection (postgres_fdw, with no partition for the half,
# would have refused it: it cannot see the first statement's write).
def write_between_split_and_cleanup():
    distributed_counters(meta, "mr_split", 100, shard_count=1, colocate_with="none")
    shard = shard_of_row_100("mr_split")
    holder = connect(dsn)
    holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('cleanup'))")
    meta.execute("SET pg_shard.move_drop_delay = 0")
    job = meta.execute("SELECT pg_shard.split_shard(%s)", (shard,)).fetchone()[0]
    at_cleanup = wait_until("SELECT phase = 'cleanup' FROM pg_shard.job WHERE job_id = %s", (job,))
    halves = meta.execute("SELECT count(*) FROM pg_shard.shards WHERE table_name = 'mr_split'::regclass"
                          ).fetchone()[0]
    # A row of each half read in one statement (two entries of the table
    # on two shards, neither with a foreign partition yet): right, or
    # refused, never read from one half for both.
    lower, upper = meta.execute(
        "SELECT min(g) FILTER (WHERE pg_shard.keyspace_id(g::bigint) < j.split_at), "
        "       min(g) FILTER (WHERE pg_shard.keyspace_id(g::bigint) >= j.split_at) "
        "FROM generate_series(1, 100) g, pg_shard.job j WHERE j.job_id = %s GROUP BY j.split_at", (job,)).fetchone()
    reader = connect(dsn)
    try:
        both = reader.execute("SELECT a.id, b.id FROM mr_split a, mr_split b WHERE a.id = %s AND b.id = %s",
                              (lower, upper)).fetchall()
    except psycopg.Error as e:
        both = e.sqlstate
    reader.close()
    writer = connect(dsn)
    try:
        writer.execute("BEGIN")
        writer.execute("UPDATE mr_other SET v = v + 1 WHERE id = 9")
        writer.execute("UPDATE mr_split SET v = v + 1 WHERE id = 100")
        writer.execute("COMMIT")
        outcome = "committed"
    except psycopg.Error as e:
        outcome = e.sqlstate
        writer.execute("ROLLBACK")
    holder.execute("SELECT pg_advisory_unlock_all()")
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    values = meta.execute("SELECT (SELECT v FROM mr_other WHERE id = 9), (SELECT v FROM mr_split WHERE id = 100)"
                          ).fetchone()
    for conn in (holder, writer):
        conn.close()
    meta.execute("DROP TABLE mr_split")
    return at_cleanup, halves, outcome, state, values, (lower, upper, both)


at_cleanup, halves, outcome, state, values, (lower, upper, both) = write_between_split_and_cleanup()
check(f"a row of each half in one statement before the cleanup: {both} for ids {lower}, {upper} "
      "(the rows, or a refusal; never one half read for both)",
      both == [(lower, upper)] or both == "PS001")
check(f"split held before its cleanup with its new map ({at_cleanup}, {halves} shards), then done ({state})",
      at_cleanup and halves == 2 and state == "done")
check(f"a transaction writes a half before the cleanup: {outcome}, both writes kept {values}",
      outcome == "committed" and values == (1, 1))

meta.execute("DROP TABLE mr_accounts, mr_other, mr_wide")
sys.exit(1 if check.failures else 0)
