#!/usr/bin/env python3
"""A shard split (or move) under every kind of row change, with its job
runner killed in the middle of the copy and of the catch-up. One client inserts, deletes,
updates values (leaving large, out-of-line documents alone) and rewrites
documents through the coordinator, changes keys (to either half) on the
shard table itself until the cutover retires it (the coordinator and the
metadata node refuse updates of the distribution column), and keeps a model
of what it was told committed. The copy is throttled so that
the changes pile up while it runs. Afterwards the table equals the model
row for row, the job is done and nothing of it is left.
Usage: churn.py METADATA_PORT COORDINATOR_PORT DATABASE [split|move]"""
import hashlib
import os
import random
import signal
import sys
import threading
import time

import psycopg
from tap import Checks, connect as connect_to

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
kind = sys.argv[4] if len(sys.argv) > 4 else "split"
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks(f"{kind} under churn")


def connect(port, tries=100):
    return connect_to(dsn.format(port), tries)


def document(seed):
    """About 6 kB of hex: too random to compress, so stored out of line."""
    return "".join(hashlib.md5(f"{seed}-{i}".encode()).hexdigest() for i in range(200))


random.seed(7)
meta = connect(metadata_port)
meta.execute("DROP TABLE IF EXISTS churn")
meta.execute("CREATE TABLE churn (id bigint PRIMARY KEY, v bigint NOT NULL, pad text, doc text)")
model = {}
with meta.cursor() as cursor:
    rows = [(i, 0, "p" * 300, document(i) if i % 20 == 0 else None) for i in range(1, 12001)]
    cursor.executemany("INSERT INTO churn VALUES (%s, %s, %s, %s)", rows)
    model = {i: (v, pad, doc) for i, v, pad, doc in rows}
meta.execute("SELECT pg_shard.create_distributed_table('churn', 'id', shard_count => 1, colocate_with => 'none')")
time.sleep(1)  # the coordinator hears of the new table

stop = threading.Event()
stats = {"acknowledged": 0, "refused": 0, "errors": [], "key_changes": 0, "key_changes_refused": []}
shard, shard_table, node_port = meta.execute(
    "SELECT shard_id, shard_table, port FROM pg_shard.shards WHERE table_name = 'churn'::regclass").fetchone()


def churn():
    conn = connect(coordinator_port)
    on_shard = connect(node_port)
    next_id = 100000
    while not stop.is_set():
        op = random.random()
        ids = list(model)
        try:
            if op < 0.25 or not ids:
                next_id += 1
                doc = document(next_id) if random.random() < 0.2 else None
                conn.execute("INSERT INTO churn VALUES (%s, %s, %s, %s)", (next_id, 1, "n", doc))
                model[next_id] = (1, "n", doc)
            elif op < 0.40:
                key = random.choice(ids)
                conn.execute("DELETE FROM churn WHERE id = %s", (key,))
                del model[key]
            elif op < 0.75:
                # documents untouched: WAL carries them as "unchanged"
                key = random.choice(ids)
                conn.execute("UPDATE churn SET v = v + 1 WHERE id = %s", (key,))
                v, pad, doc = model[key]
                model[key] = (v + 1, pad, doc)
            elif op < 0.85:
                key = random.choice(ids)
                doc = document(f"r{key}-{time.monotonic()}")
                conn.execute("UPDATE churn SET doc = %s WHERE id = %s", (doc, key))
                v, pad, _ = model[key]
                model[key] = (v, pad, doc)
            else:
                # a new key, in whichever half it hashes to, document kept
                key = random.choice(ids)
                next_id += 1
                if stats["key_changes_refused"]:
                    continue
                try:
                    on_shard.execute(f"UPDATE {shard_table} SET id = %s WHERE id = %s", (next_id, key))
                except psycopg.Error as e:
                    # the cutover retired the shard table: WrongShard
                    stats["key_changes_refused"].append(f"{e.sqlstate} {str(e).splitlines()[0]}")
                    continue
                stats["key_changes"] += 1
                model[next_id] = model.pop(key)
            stats["acknowledged"] += 1
        except psycopg.Error as e:
            stats["refused"] += 1
            stats["errors"].append(f"{e.sqlstate} {str(e).splitlines()[0]}")
            if conn.closed:
                conn = connect(coordinator_port)


def kill_runner_when(phase, condition_sql):
    """SIGKILLs the job runner once the job is in `phase` and the condition
    holds; returns what it saw."""
    watcher = connect(metadata_port)
    deadline = time.time() + 120
    while time.time() < deadline:
        row = watcher.execute(
            f"SELECT phase, state, {condition_sql} FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()
        if row[1] not in ("queued", "running"):
            return f"job ended first ({row[1]})"
        if row[0] == phase and row[2]:
            pid = watcher.execute("SELECT pid FROM pg_stat_activity "
                                  "WHERE backend_type LIKE 'pg_shard job runner%'").fetchone()
            if pid:
                os.kill(pid[0], signal.SIGKILL)
                return f"killed in {phase}"
        time.sleep(0.05)
    return "timed out"


writer = threading.Thread(target=churn, daemon=True)
writer.start()
time.sleep(1)
meta.execute("SET pg_shard.move_drop_delay = 0")
meta.execute("SET pg_shard.copy_rate_limit = 2")
meta.execute("SET synchronous_commit = on")
if kind == "split":
    job = meta.execute("SELECT pg_shard.split_shard(%s)", (shard,)).fetchone()[0]
else:
    job = meta.execute("SELECT pg_shard.move_shard(%s, (SELECT min(node_id) FROM pg_shard.node "
                       "WHERE port <> %s AND state = 'active'))", (shard, node_port)).fetchone()[0]
mid_copy = kill_runner_when("copy", "bytes_copied > 0")
time.sleep(1)
meta = connect(metadata_port)
mid_catch_up = kill_runner_when("catch_up", "true")
time.sleep(1)
meta = connect(metadata_port)
state, error = meta.execute("SELECT pg_shard.wait_job(%s, '3 minutes'), NULL", (job,)).fetchone()
time.sleep(1)
stop.set()
writer.join(30)
error = meta.execute("SELECT error FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]

check(f"runner killed mid-copy ({mid_copy}) and mid-catch-up ({mid_catch_up}); job {state} ({error})",
      state == "done")
shards = meta.execute("SELECT count(*), min(port) FROM pg_shard.shards WHERE table_name = 'churn'::regclass").fetchone()
if kind == "split":
    check(f"two shards ({shards[0]})", shards[0] == 2)
else:
    check(f"one shard, on another node ({shards})", shards[0] == 1 and shards[1] != node_port)
table = {i: (v, pad, doc) for i, v, pad, doc in meta.execute("SELECT id, v, pad, doc FROM churn").fetchall()}
missing = [k for k in model if k not in table]
extra = [k for k in table if k not in model]
differing = [k for k in model if k in table and table[k] != model[k]]
check(f"{stats['acknowledged']} changes acknowledged ({stats['refused']} refused): the table equals the model "
      f"({len(model)} rows; missing {missing[:5]}, extra {extra[:5]}, differing {differing[:5]})",
      not missing and not extra and not differing and stats["acknowledged"] > 1000)
check(f"no change refused through the coordinator ({stats['errors'][:3]})", not stats["errors"])
check(f"{stats['key_changes']} keys changed on the shard table before the cutover, then WrongShard "
      f"({stats['key_changes_refused'][:1]})",
      stats["key_changes"] > 100 and stats["key_changes_refused"][:1] and
      stats["key_changes_refused"][0].startswith("PS001"))
duration, copied = meta.execute(
    "SELECT extract(epoch FROM finished_at - started_at), bytes_copied FROM pg_shard.job WHERE job_id = %s",
    (job,)).fetchone()
print(f"# {kind} under churn: {float(duration):.1f} s (copy limited to 2 MB/s, runner killed twice), "
      f"{copied / 1e6:.1f} MB copied")
leftovers = []
for (port,) in meta.execute("SELECT port FROM pg_shard.node").fetchall():
    with connect(port) as node:
        leftovers += node.execute(
            "SELECT 'slot ' || slot_name FROM pg_replication_slots UNION ALL "
            "SELECT 'publication ' || pubname FROM pg_publication UNION ALL "
            "SELECT 'subscription ' || subname FROM pg_subscription UNION ALL "
            "SELECT 'table ' || relname FROM pg_class WHERE relname LIKE 'job_%marker'").fetchall()
check(f"no replication object left behind ({leftovers})", not leftovers)
meta.execute("DROP TABLE churn")
sys.exit(1 if check.failures else 0)
