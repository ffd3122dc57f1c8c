#!/usr/bin/env python3
"""Lookup tables through the coordinators (pg_shard.create_lookup).

1. Login-style reads: customers distributed by id, a unique lookup of
   email. A read by email through the coordinator (a literal, a text
   parameter, a prepared statement) takes two single-shard hops: SHOW SHARDS
   counts one more statement on the lookup's shard holding the email and
   one on the customers' shard holding the row, none elsewhere, and SHOW
   STATS none on the metadata node.
2. Writes through the coordinator (INSERT, UPDATE of the email, DELETE,
   COPY) keep the lookup exact.
3. The same new email inserted at once through two coordinators, 30 times:
   exactly one insert wins each time (the other gets 23505 naming the
   lookup), and the lookup holds the winner.
4. Writers through the coordinator while a shard of customers moves, a
   shard of customers splits and a shard of the lookup splits: no write
   fails, the lookup stays exact, reads by email still take two hops.
5. A crash between the two phases of a write whose row and lookup entry are
   on different nodes: the backend killed after the nodes prepared (then
   neither is kept) or after the metadata node committed (then both are),
   once pg_shard.recover_prepared_transactions() ran.

Usage: lookups.py METADATA_PORT COORDINATOR_PORT SECOND_COORDINATOR_PORT DATABASE"""
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

metadata_port, coordinator_port, second_port, database = sys.argv[1:5]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("lookups")
TABLE, LOOKUP = "lk_route_customers", "lk_route_customers_email_lookup"
ROWS = 2000

meta = connect(dsn.format(metadata_port))
meta.execute(f"DROP TABLE IF EXISTS {TABLE}")
meta.execute(f"CREATE TABLE {TABLE} (id bigint PRIMARY KEY, email text, name text)")
meta.execute(f"INSERT INTO {TABLE} SELECT g, 'user' || g || '@example.com', 'n' || g "
             f"FROM generate_series(1, {ROWS}) g")
meta.execute(f"SELECT pg_shard.create_distributed_table('{TABLE}', 'id', "
             "shard_count => 4, colocate_with => 'none')")
meta.execute(f"SELECT pg_shard.create_lookup('{TABLE}', 'email', \"unique\" => true)")
coordinator = connect(dsn.format(coordinator_port))
second = connect(dsn.format(second_port))


def differences():
    """Entries the lookup lacks or holds beyond the table's rows."""
    return meta.execute(
        f"SELECT count(*) FROM ((SELECT email, pg_shard.keyspace_id(id) FROM {TABLE} "
        f"WHERE email IS NOT NULL EXCEPT SELECT value, keyspace_id FROM {LOOKUP}) UNION ALL "
        f"(SELECT value, keyspace_id FROM {LOOKUP} EXCEPT "
        f"SELECT email, pg_shard.keyspace_id(id) FROM {TABLE})) d").fetchone()[0]


def counts(conn):
    """SHOW SHARDS' statement count per shard id, and the metadata node's
    count in SHOW STATS."""
    shards = {int(r[1]): int(r[6]) for r in conn.execute("SHOW SHARDS", prepare=False).fetchall()}
    stats = {r[0]: int(r[1]) for r in conn.execute("SHOW STATS", prepare=False).fetchall()}
    return shards, stats.get(f"127.0.0.1:{metadata_port}", 0)


def holder(table, key_sql, key):
    return meta.execute(
        f"SELECT shard_id FROM pg_shard.shards WHERE table_name = '{table}'::regclass "
        f"AND state = 'active' AND pg_shard.keyspace_id({key_sql}) BETWEEN range_start AND range_end",
        (key,)).fetchone()[0]


def wait_for_map(conn):
    for _ in range(100):
        shards, _ = counts(conn)
        if {holder(LOOKUP, "%s::text", "x"), holder(TABLE, "%s::bigint", 1)} <= shards.keys():
            return True
        time.sleep(0.1)
    return False


check("both coordinators know the lookup", wait_for_map(coordinator) and wait_for_map(second))


def two_hop_reads(label, ids):
    """Reads by email of rows `ids` in three forms; each must count one
    statement on the lookup's shard and one on the row's shard."""
    forms = [
        ("literal", lambda c, e: c.execute(f"SELECT id, name FROM {TABLE} WHERE email = '{e}'")),
        ("parameter", lambda c, e: c.execute(f"SELECT id, name FROM {TABLE} WHERE email = %s",
                                             (e,), prepare=False)),
        ("prepared", lambda c, e: c.execute(f"SELECT id, name FROM {TABLE} WHERE email = %s",
                                            (e,), prepare=True)),
    ]
    for name, read in forms:
        # (A statement's first prepare is described by the metadata node.)
        read(coordinator, "warm-up@example.com").fetchall()
        wrong = []
        for i in ids:
            email = f"user{i}@example.com"
            expected = {holder(LOOKUP, "%s::text", email): 1, holder(TABLE, "%s::bigint", i): 1}
            before, meta_before = counts(coordinator)
            rows = read(coordinator, email).fetchall()
            after, meta_after = counts(coordinator)
            delta = {s: after.get(s, 0) - before.get(s, 0) for s in after
                     if after.get(s, 0) != before.get(s, 0)}
            if rows != [(i, f"n{i}")] or delta != expected or meta_after != meta_before:
                wrong.append((i, rows, delta, expected, meta_after - meta_before))
        check(f"{label}: {len(ids)} reads by email ({name}) took one shard per hop, none on "
              f"the metadata node ({wrong[:2]})", not wrong)


two_hop_reads("before moves", [7, 42, 99, 512, 1999])
missing = coordinator.execute(f"SELECT count(*) FROM {TABLE} WHERE email = 'nobody@example.com'").fetchone()[0]
check("a read of an email nobody has finds nothing", missing == 0)

# 2. Writes through the coordinator.
coordinator.execute(f"INSERT INTO {TABLE} VALUES (5001, 'w1@example.com', 'w')")
coordinator.execute(f"UPDATE {TABLE} SET email = 'w2@example.com' WHERE id = 5001")
coordinator.execute(f"DELETE FROM {TABLE} WHERE id BETWEEN 10 AND 20")
with coordinator.cursor().copy(f"COPY {TABLE} (id, email, name) FROM STDIN") as copy:
    for i in range(6000, 6050):
        copy.write_row((i, f"copied{i}@example.com", "c"))
# Multi-row INSERTs across shards, as a prepared statement run past the
# plan cache's switch to a generic plan (8 times).
for n in range(8):
    coordinator.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, 'm'), (%s, %s, 'm'), (%s, %s, 'm')",
                        (7000 + 3 * n, f"multi{3 * n}@example.com", 7001 + 3 * n,
                         f"multi{3 * n + 1}@example.com", 7002 + 3 * n, f"multi{3 * n + 2}@example.com"),
                        prepare=True)
multi = meta.execute(f"SELECT count(*) FROM {TABLE} WHERE email LIKE 'multi%%'").fetchone()[0]
check(f"24 rows by prepared multi-row INSERTs through the coordinator ({multi})", multi == 24)
try:
    coordinator.execute(f"INSERT INTO {TABLE} VALUES (5002, 'w2@example.com', 'dup')")
    duplicate = "committed"
except psycopg.Error as e:
    duplicate = f"{e.sqlstate} {e.diag.message_primary}"
check(f"a taken email through the coordinator is refused ({duplicate})",
      duplicate.startswith("23505") and LOOKUP in duplicate)
got = coordinator.execute(f"SELECT id FROM {TABLE} WHERE email = 'w2@example.com'").fetchall()
check(f"writes through the coordinator keep the lookup exact ({differences()} differences, {got})",
      differences() == 0 and got == [(5001,)])

# 2b. A role other than the table's owner, granted SELECT and writes on
# the table only: the lookup's privileges follow the table's, so it writes
# the table and reads by email (two hops, as itself) through the coordinator.
APP = "lk_route_app"
for port in [metadata_port] + [str(r[0]) for r in meta.execute(
        "SELECT port FROM pg_shard.node ORDER BY 1").fetchall()]:
    node = connect(dsn.format(port))
    # (Not dropped and made again: a coordinator's pooled sessions of a
    # dropped role would run as no role.)
    if not node.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (APP,)).fetchall():
        node.execute(f"CREATE ROLE {APP} LOGIN")
    node.close()
meta.execute(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {TABLE} TO {APP}")
app = connect(f"host=127.0.0.1 port={coordinator_port} dbname={database} user={APP}")
try:
    app.execute(f"INSERT INTO {TABLE} VALUES (5003, 'app@example.com', 'app')")
    app.execute(f"UPDATE {TABLE} SET email = 'app2@example.com' WHERE id = 5003")
    before, meta_before = counts(coordinator)
    got = app.execute(f"SELECT id FROM {TABLE} WHERE email = %s", ("app2@example.com",)).fetchall()
    after, meta_after = counts(coordinator)
    hops = sum(after.get(s, 0) - before.get(s, 0) for s in after)
    app_outcome = f"{got}, {hops} shard statements, {meta_after - meta_before} on the metadata node"
    app_ok = got == [(5003,)] and hops == 2 and meta_after == meta_before
except psycopg.Error as e:
    app_outcome, app_ok = f"{e.sqlstate} {e.diag.message_primary}", False
app.close()
check(f"a granted role writes the table and reads it by email in two hops ({app_outcome}; "
      f"{differences()} differences)", app_ok and differences() == 0)
meta.execute(f"REVOKE ALL ON {TABLE} FROM {APP}")

# 3. One email, two coordinators, at once.
wins, losses, other = 0, 0, []
for round_ in range(30):
    barrier = threading.Barrier(2)
    outcome = {}

    def insert(name, conn, row_id):
        barrier.wait()
        try:
            conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, %s)",
                         (row_id, f"race{round_}@example.com", name))
            outcome[name] = "ok"
        except psycopg.Error as e:
            outcome[name] = e.sqlstate or str(e)

    threads = [threading.Thread(target=insert, args=("first", coordinator, 10_000 + 2 * round_)),
               threading.Thread(target=insert, args=("second", second, 10_001 + 2 * round_))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results = sorted(outcome.values())
    if results == ["23505", "ok"]:
        wins += 1
    else:
        other.append(results)
rows = meta.execute(f"SELECT email, count(*) FROM {TABLE} WHERE email LIKE 'race%%' GROUP BY 1 "
                    "HAVING count(*) <> 1").fetchall()
check(f"30 races through two coordinators: exactly one insert won each ({wins}; {other[:3]})",
      wins == 30 and not rows)
check(f"the lookup holds the winners ({differences()} differences)", differences() == 0)

# 4. Moves and splits under writes.
meta.execute("SET pg_shard.move_drop_delay = 0")
counter = iter(range(20_000, 30_000))
lock = threading.Lock()


def next_id():
    with lock:
        return next(counter)


stop = threading.Event()
written, failed = [], []


def write_loop(port):
    conn = connect(dsn.format(port))
    while not stop.is_set():
        i = next_id()
        try:
            conn.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, 'l')", (i, f"live{i}@example.com"))
            conn.execute(f"UPDATE {TABLE} SET email = %s WHERE id = %s", (f"moved{i}@example.com", i))
            written.append(i)
        except psycopg.Error as e:
            failed.append(str(e).splitlines()[0])
        time.sleep(0.002)


loops = [threading.Thread(target=write_loop, args=(p,)) for p in (coordinator_port, second_port)]
for t in loops:
    t.start()
jobs = []
source, target = meta.execute(
    f"SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id "
    f"AND n.state = 'active') FROM pg_shard.shards s WHERE table_name = '{TABLE}'::regclass "
    "ORDER BY range_start LIMIT 1").fetchone()
for sql in [f"SELECT pg_shard.move_shard({source}, {target})",
            f"SELECT pg_shard.split_shard((SELECT max(shard_id) FROM pg_shard.shards "
            f"WHERE table_name = '{TABLE}'::regclass))",
            f"SELECT pg_shard.split_shard((SELECT min(shard_id) FROM pg_shard.shards "
            f"WHERE table_name = '{LOOKUP}'::regclass))"]:
    job = meta.execute(sql).fetchone()[0]
    state = meta.execute("SELECT pg_shard.wait_job(%s, '3 minutes')", (job,)).fetchone()[0]
    jobs.append(state)
    time.sleep(0.5)
stop.set()
for t in loops:
    t.join()
check(f"a move and two splits under writes ended done ({jobs})", jobs == ["done"] * 3)
check(f"{len(written)} writes through two coordinators, none failed ({failed[:3]})",
      written and not failed)
check(f"the lookup is exact after them ({differences()} differences)", differences() == 0)
time.sleep(1)
two_hop_reads("after a move and splits", [7, 42, 99, 512, 1999])

# 5. A crash between the two phases.
workers = [dsn.format(p) for (p,) in meta.execute(
    "SELECT port FROM pg_shard.node WHERE state = 'active' ORDER BY node_id").fetchall()]
# An id and an email whose shards are on different nodes.
node_of = dict(meta.execute(
    "SELECT shard_id, node_id FROM pg_shard.shards WHERE state = 'active'").fetchall())
pairs = []
for i in range(40_000, 41_000):
    email = f"crash{i}@example.com"
    if node_of[holder(TABLE, "%s::bigint", i)] != node_of[holder(LOOKUP, "%s::text", email)]:
        pairs.append((i, email))
    if len(pairs) == 2:
        break
metadata_dsn = dsn.format(metadata_port)
for (i, email), setting, committed in zip(
        pairs, ["pg_shard.test_pause_after_prepare", "pg_shard.test_pause_before_commit_prepared"],
        [False, True]):
    victim = connect(metadata_dsn)
    pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
    victim.execute(f"SET {setting} = 20000")

    def write():
        try:
            victim.execute(f"INSERT INTO {TABLE} VALUES (%s, %s, 'crash')", (i, email))
        except Exception:  # noqa: BLE001 — the connection dies with its backend
            pass

    thread = threading.Thread(target=write)
    thread.start()
    deadline = time.time() + 15
    while prepared(workers) < 2 and time.time() < deadline:
        time.sleep(0.1)
    check(f"{setting}: the row's node and the lookup's node both prepared", prepared(workers) >= 2)
    os.kill(pid, signal.SIGKILL)
    thread.join()
    recover_after_restart(metadata_dsn)
    meta = connect(metadata_dsn)
    row = meta.execute(f"SELECT count(*) FROM {TABLE} WHERE id = %s", (i,)).fetchone()[0]
    entry = meta.execute(f"SELECT count(*) FROM {LOOKUP} WHERE value = %s", (email,)).fetchone()[0]
    want = 1 if committed else 0
    check(f"{setting}: after recovery the row and its entry are {'both kept' if committed else 'both gone'} "
          f"({row}, {entry}); nothing left prepared",
          row == want and entry == want and prepared(workers) == 0)
check(f"the lookup is exact at the end ({differences()} differences)", differences() == 0)
meta.execute(f"DROP TABLE {TABLE}")
sys.exit(1 if check.failures else 0)
