#!/usr/bin/env python3
"""Reads first: a move (or split) queued with switch_reads_first => true
publishes, once its copy is verified, a map in which reads of the range go
to the new copy while writes stay on the old one, and waits there
(pg_shard.switch_writes_delay, an hour here) until
pg_shard.switch_writes(job_id).

Which copy answered is told by a marker row: once the job waits, one row
of the range (not the written key) is changed on the new copy only, behind
the job's back, as only a replication session could. Then, through the
coordinator and on the metadata node: a read of the marker shows the new
copy's value while reads in a transaction block and SELECT … FOR UPDATE
show the owner's; an UPDATE of another key lands in the owner's table (read
there directly), and a read of that key shows it once replication brings
it. switch_writes ends the job: writes then land in the new copy, each
counted once.
modes: move (to another node), split (the halves on the same node),
cancel (a move canceled while it waits: reads back on the owner, the new
copy dropped).
In every mode a reader through the coordinator runs throughout and must
see no error.
Usage: reads_first.py METADATA_PORT COORDINATOR_PORT DATABASE [move|split|cancel]"""
import sys
import threading
import time

import psycopg
from tap import Checks, connect, distributed_counters

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
mode = sys.argv[4] if len(sys.argv) > 4 else "move"
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks(f"reads first ({mode})")
table = "rf_items"
key = 7
MARK = -1000

meta = connect(dsn.format(metadata_port))
distributed_counters(meta, table, 2000, shard_count=4, colocate_with="none")
shard, shard_name, source, range_start, range_end = meta.execute(
    "SELECT s.shard_id, h.shard_name, s.node_id, s.range_start, s.range_end "
    "FROM pg_shard.shards s JOIN pg_shard.shard h USING (shard_id) "
    "WHERE s.table_name = %s::regclass AND pg_shard.keyspace_id(%s::bigint) BETWEEN s.range_start AND s.range_end",
    (table, key)).fetchone()
marker = meta.execute(
    "SELECT min(g) FROM generate_series(1, 2000) g "
    "WHERE g <> %s AND pg_shard.keyspace_id(g::bigint) BETWEEN %s AND %s",
    (key, range_start, range_end)).fetchone()[0]
ports = dict(meta.execute("SELECT node_id, port FROM pg_shard.node").fetchall())
target = source if mode == "split" else next(node for node in sorted(ports) if node != source)
source_node = connect(dsn.format(ports[source]))
target_node = connect(dsn.format(ports[target]))
time.sleep(1)  # the coordinator hears of the new table

client = connect(dsn.format(coordinator_port))


def value(conn, row_key, suffix=""):
    return conn.execute(f"SELECT v FROM {table} WHERE id = %s{suffix}", (row_key,)).fetchone()[0]


def stored(node, shard_table, row_key):
    """v of a row as a shard table holds it (None: not there)."""
    row = node.execute(f'SELECT v FROM "{shard_table}" WHERE id = %s', (row_key,)).fetchone()
    return row[0] if row else None


def wait_for(read, wanted, timeout=10):
    deadline = time.time() + timeout
    seen = read()
    while seen != wanted and time.time() < deadline:
        time.sleep(0.1)
        seen = read()
    return seen


# A reader through the coordinator for the whole job.
reader_errors = []
reads = [0]
stop = threading.Event()


def reader():
    conn = connect(dsn.format(coordinator_port))
    while not stop.is_set():
        try:
            value(conn, key)
            reads[0] += 1
        except psycopg.Error as e:
            reader_errors.append(f"{e.sqlstate}: {e}")
        time.sleep(0.005)
    conn.close()


thread = threading.Thread(target=reader)
thread.start()

meta.execute("SET pg_shard.switch_writes_delay = '1h'")
meta.execute("SET pg_shard.move_drop_delay = 0")
if mode == "split":
    job = meta.execute("SELECT pg_shard.split_shard(%s, switch_reads_first => true)", (shard,)).fetchone()[0]
else:
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s, switch_reads_first => true)",
                       (shard, target)).fetchone()[0]

deadline = time.time() + 180
phase = None
while time.time() < deadline:
    phase, state, switched_at = meta.execute(
        "SELECT phase, state, reads_switched_at FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()
    if phase == "reads_switched" and switched_at is not None or state not in ("queued", "running"):
        break
    time.sleep(0.2)
check(f"job {job} reaches reads_switched and waits there ({phase})", phase == "reads_switched")

# The new copy's tables: the target's shard table, or the halves.
if mode == "split":
    copies = list(meta.execute(
        "SELECT h->>'lower_name', h->>'upper_name' FROM pg_shard.job, jsonb_array_elements(resources->'halves') h "
        "WHERE job_id = %s AND (h->>'source_id')::bigint = %s", (job, shard)).fetchone())
else:
    copies = [shard_name]
target_node.execute("SET session_replication_role = replica")
for copy in copies:
    target_node.execute(f'UPDATE "{copy}" SET v = %s WHERE id = %s', (MARK, marker))
target_node.execute("RESET session_replication_role")
planted = [stored(target_node, copy, marker) for copy in copies]
check(f"marker row {marker} changed on the new copy only ({planted}; owner: "
      f"{stored(source_node, shard_name, marker)})",
      MARK in planted and stored(source_node, shard_name, marker) == 0)

writes = 0
for via, conn in (("the coordinator", client), ("the metadata node", meta)):
    seen = wait_for(lambda: value(conn, marker), MARK)
    check(f"through {via} a read of the range is answered by the new copy ({seen})", seen == MARK)
    with conn.transaction():
        in_block = value(conn, marker)
    check(f"through {via} a read in a transaction block is answered by the owner ({in_block})", in_block == 0)
    if via == "the coordinator":
        # (The metadata node's postgres_fdw path would lock the rows through
        # the owner too; its router does not take FOR UPDATE across nodes.)
        locked = value(conn, marker, " FOR UPDATE")
        check(f"through {via} SELECT … FOR UPDATE is answered by the owner ({locked})", locked == 0)
    written = conn.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s RETURNING v", (key,)).fetchone()[0]
    writes += 1
    owner_has = stored(source_node, shard_name, key)
    check(f"through {via} an UPDATE lands in the owner's table ({written}; there: {owner_has})",
          written == writes and owner_has == writes)
    seen = wait_for(lambda: value(conn, key), writes)
    check(f"through {via} the new copy's read shows the update once replication brings it ({seen})",
          seen == writes)

time.sleep(1.5)
phase = meta.execute("SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]
check(f"the job still waits with reads switched ({phase})", phase == "reads_switched")

if mode == "cancel":
    canceled = meta.execute("SELECT pg_shard.cancel_job(%s)", (job,)).fetchone()[0]
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    check(f"cancel_job rolls the job back ({canceled}, {state})", canceled and state == "canceled")
    routes = meta.execute("SELECT count(*) FROM pg_shard.read_route WHERE job_id = %s", (job,)).fetchone()[0]
    seen = wait_for(lambda: value(client, marker), 0)
    check(f"reads go back to the owner ({seen}, {routes} read routes left)", seen == 0 and routes == 0)
    left = target_node.execute("SELECT to_regclass(%s)", (f'"{shard_name}"',)).fetchone()[0]
    check(f"the target's copy is dropped ({left})", left is None)
    final = value(client, key)
    check(f"every update counted exactly once ({final} = {writes})", final == writes)
else:
    switched = meta.execute("SELECT pg_shard.switch_writes(%s)", (job,)).fetchone()[0]
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    again = meta.execute("SELECT pg_shard.switch_writes(%s)", (job,)).fetchone()[0]
    check(f"switch_writes ends the wait and the job finishes ({switched}, {state}; again: {again})",
          switched and state == "done" and not again)
    routes = meta.execute("SELECT count(*) FROM pg_shard.read_route WHERE job_id = %s", (job,)).fetchone()[0]
    check(f"the cutover deleted the read routes ({routes})", routes == 0)
    written = client.execute(f"UPDATE {table} SET v = v + 1 WHERE id = %s RETURNING v", (key,)).fetchone()[0]
    writes += 1
    landed = [stored(target_node, copy, key) for copy in copies]
    check(f"writes now land in the new copy ({landed})", writes in landed)
    check(f"every update counted exactly once ({written} = {writes})", written == writes)

stop.set()
thread.join()
check(f"the reader through the coordinator saw no error ({reads[0]} reads; {reader_errors[:3]})",
      not reader_errors and reads[0] > 0)
for conn in (client, source_node, target_node):
    conn.close()
meta.execute(f"DROP TABLE {table}")
sys.exit(1 if check.failures else 0)
