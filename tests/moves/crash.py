#!/usr/bin/env python3
"""Shard moves (or splits) interrupted: a job held at the start of a phase
(by the pause lock) is either canceled, or its runner is killed with SIGKILL
(the metadata node then restarts its backends and the launcher restarts the
runner), or a node restarts; a move (split) is also reverted, with its
runner killed during the revert. Afterwards the job has ended (done, or
canceled), the map and the shards agree, every row is there once, and no
slot, publication or subscription is left.
Usage: crash.py METADATA_PORT DATABASE CLUSTER_DIR [move|split]"""
import os
import signal
import subprocess
import sys
import time

import psycopg
from tap import Checks, connect as connect_to

metadata_port, database, cluster_dir = sys.argv[1], sys.argv[2], sys.argv[3]
kind = sys.argv[4] if len(sys.argv) > 4 else "move"
bindir = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True).stdout.strip()
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks(f"interrupted {kind}")


def connect(port=metadata_port, tries=100):
    return connect_to(dsn.format(port), tries)


def phase_key(phase):
    return f"hashtext('pg_shard job phase'), hashtext('{phase}')"


def wait_phase(meta, job, phase, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        row = meta.execute("SELECT phase, state FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()
        if row[0] == phase or row[1] not in ("queued", "running"):
            return row
        time.sleep(0.1)
    return None


def wait_job(meta, job, timeout):
    """The job's state once it ends (or the timeout passes) and its phase then."""
    state = meta.execute("SELECT pg_shard.wait_job(%s, %s)", (job, timeout)).fetchone()[0]
    return state, meta.execute("SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]


def consistent(meta, expected_rows, expected_sum):
    """Rows, map and shards agree; nothing of the jobs left on the workers."""
    count, total = meta.execute("SELECT count(*), sum(id) FROM crash_items").fetchone()
    placements = meta.execute(
        "SELECT s.shard_id, s.node_id FROM pg_shard.shards s WHERE s.table_name = 'crash_items'::regclass").fetchall()
    owners_ok = True
    leftovers = []
    for port, node_id in meta.execute("SELECT port, node_id FROM pg_shard.node").fetchall():
        with connect(port) as worker:
            active = {r[0] for r in worker.execute(
                "SELECT shard_id FROM pg_shard.local_shard WHERE state = 'active'").fetchall()}
            for shard_id, owner in placements:
                if (owner == node_id) != (shard_id in active):
                    owners_ok = False
            leftovers += worker.execute(
                "SELECT 'slot ' || slot_name FROM pg_replication_slots UNION ALL "
                "SELECT 'publication ' || pubname FROM pg_publication UNION ALL "
                "SELECT 'subscription ' || subname FROM pg_subscription").fetchall()
    return count == expected_rows and total == expected_sum, owners_ok, leftovers


meta = connect()
meta.execute("DROP TABLE IF EXISTS crash_items")
meta.execute("CREATE TABLE crash_items (id bigint PRIMARY KEY, v text)")
meta.execute("INSERT INTO crash_items SELECT g, repeat('v', 100) FROM generate_series(1, 20000) g")
meta.execute("SELECT pg_shard.create_distributed_table('crash_items', 'id', shard_count => 4, colocate_with => 'none')")
rows, total = meta.execute("SELECT count(*), sum(id) FROM crash_items").fetchone()


def start_move(meta, phase, drop_delay="0", reads_first=False):
    """Queues a move (or split) of crash_items' first shard, held at `phase`
    (None: not held)."""
    holder = connect()
    if phase:
        holder.execute(f"SELECT pg_advisory_lock({phase_key(phase)})")
    shard, target = meta.execute(
        "SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id) "
        "FROM pg_shard.shards s WHERE s.table_name = 'crash_items'::regclass "
        "ORDER BY s.range_start LIMIT 1").fetchone()
    meta.execute(f"SET pg_shard.move_drop_delay = '{drop_delay}'")
    # The local cluster runs with synchronous_commit off: the job must be
    # on disk before its runner is killed.
    meta.execute("SET synchronous_commit = on")
    if kind == "split":
        job = meta.execute("SELECT pg_shard.split_shard(%s, switch_reads_first => %s)",
                           (shard, reads_first)).fetchone()[0]
    else:
        job = meta.execute("SELECT pg_shard.move_shard(%s, %s, switch_reads_first => %s)",
                           (shard, target, reads_first)).fetchone()[0]
    return holder, job


# Cancel while the copy runs and while it catches up: rolled back.
for phase in ("copy", "catch_up", "verify"):
    holder, job = start_move(meta, phase)
    reached = wait_phase(meta, job, phase)
    meta.execute("SELECT pg_shard.cancel_job(%s)", (job,))
    holder.close()
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
    check(f"canceled at {phase} ({reached}): {state}, rows intact, map and shards agree, nothing left ({leftovers})",
          state == "canceled" and rows_ok and owners_ok and not leftovers)

# A row of the copy changed behind the job's back while the job waits to
# verify: the verification (before any cutover) finds it and names its key
# range; the job rolls back and nothing changes.
holder, job = start_move(meta, "verify")
reached = wait_phase(meta, job, "verify")
version = meta.execute("SELECT version FROM pg_shard.map_state").fetchone()[0]
target_port = meta.execute(
    "SELECT n.port FROM pg_shard.job j JOIN pg_shard.node n ON n.node_id = j.target_node "
    "WHERE j.job_id = %s", (job,)).fetchone()[0]
with connect(target_port) as target:
    copy = target.execute(
        "SELECT shard_rel::text FROM pg_shard.local_shard WHERE state = 'frozen' "
        "ORDER BY shard_id LIMIT 1").fetchone()[0]
    # (Around the guards, as only a replication session would.)
    target.execute("SET session_replication_role = replica")
    planted = target.execute(
        f"UPDATE {copy} SET v = 'planted' WHERE id = (SELECT min(id) FROM {copy}) RETURNING id").fetchone()
holder.close()
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
error = meta.execute("SELECT error FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0] or ""
reached_cutover = meta.execute(
    "SELECT resources->'phase_times' ? 'cutover' FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]
version_after = meta.execute("SELECT version FROM pg_shard.map_state").fetchone()[0]
rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
check(f"a row changed on the copy ({copy}, id {planted}) at {reached}: job {state}, "
      f"error names the range ({error[:160]}), no cutover, map version {version} → {version_after}, "
      f"rows intact, nothing left ({leftovers})",
      planted is not None and state == "failed" and "differs from the source before the cutover" in error
      and "keyspace ids" in error and not reached_cutover and version_after == version
      and rows_ok and owners_ok and not leftovers)

# The runner killed at each phase: the job resumes (or rolls back) after the
# metadata node's restart of its backends.
def kill_runner():
    """SIGKILL to the job runner; every backend goes (crash restart): lock
    holders and our sessions too. Returns the runner's pid (None: none ran)
    and a new session."""
    runner = meta.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type LIKE 'pg_shard job runner%'").fetchone()
    if runner:
        os.kill(runner[0], signal.SIGKILL)
    time.sleep(1)
    return runner, connect()


phases = ("create_target", "copy", "catch_up", "verify", "cutover", "cleanup", "drop_old",
          "reverse_replicating")
for phase in phases:
    holder, job = start_move(meta, phase)
    reached = wait_phase(meta, job, phase)
    runner, meta = kill_runner()
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
    check(f"runner killed at {phase} ({reached}, pid {runner}): job {state}, rows intact, "
          f"map and shards agree, nothing left ({leftovers})",
          runner is not None and state in ("done", "failed") and rows_ok and owners_ok and not leftovers)

# A split's runner killed while its cutover reads the slot over a
# replication stream (held just after the stream caught up): the stream's
# walsender goes with the connection, and the job, run again, reads the
# slot once the walsender has let it go.
def source_port_of(job):
    return meta.execute(
        "SELECT n.port FROM pg_shard.job j JOIN pg_shard.node n ON n.node_id = j.source_node "
        "WHERE j.job_id = %s", (job,)).fetchone()[0]


def poll_node(port, sql, params=(), give_up=lambda: False, timeout=60):
    """The first column of `sql` on the node at `port`, asked until it is
    true (or `give_up()`, or the time is over)."""
    value = None
    deadline = time.time() + timeout
    while time.time() < deadline and not value and not give_up():
        with connect(port) as node:
            value = node.execute(sql, params).fetchone()[0]
        time.sleep(0.1)
    return value


if kind == "split":
    holder, job = start_move(meta, "streaming")
    reached = wait_phase(meta, job, "cutover")
    streaming = poll_node(source_port_of(job),
                          "SELECT count(*) FROM pg_replication_slots WHERE active AND active_pid IN "
                          "(SELECT pid FROM pg_stat_replication)")
    runner, meta = kill_runner()
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
    check(f"runner killed with the cutover's stream open ({reached}, {streaming} walsender, pid {runner}): "
          f"job {state}, rows intact, map and shards agree, nothing left ({leftovers})",
          streaming == 1 and runner is not None and state == "done" and rows_ok and owners_ok
          and not leftovers)

# Something else holding a split's slot when the job reads it (as a
# cutover's stream whose walsender has not ended yet would): the job ends
# that walsender and goes on.
if kind == "split":
    holder, job = start_move(meta, "catch_up")
    reached = wait_phase(meta, job, "catch_up")
    source_port = source_port_of(job)
    slot = f"pg_shard_job_{job}"
    reader = subprocess.Popen(
        [f"{bindir}/pg_recvlogical", "-h", "127.0.0.1", "-p", str(source_port), "-U", "postgres",
         "-d", database, "-S", slot, "--start", "--no-loop", "-f", "/dev/null",
         "-o", "proto_version=1", "-o", f"publication_names={slot}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    held = poll_node(source_port, "SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                     (slot,), give_up=lambda: reader.poll() is not None, timeout=30)
    holder.close()
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    try:
        reader_status = reader.wait(timeout=30)
    except subprocess.TimeoutExpired:
        reader.kill()
        reader_status = "still running"
    rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
    check(f"the slot held by another reader at {reached} (held: {held}): job {state}, the reader "
          f"ended ({reader_status}), rows intact, map and shards agree, nothing left ({leftovers})",
          held and state == "done" and reader_status != "still running" and rows_ok and owners_ok
          and not leftovers)

# The runner killed when a copy has just finished its tables (indexes, row
# guards and foreign keys built, the step not yet recorded): the step runs
# again, finds them built, and does not build them twice.
frozen_before = 0
for (port,) in meta.execute("SELECT port FROM pg_shard.node").fetchall():
    with connect(port) as worker:
        frozen_before += worker.execute(
            "SELECT count(*) FROM pg_shard.local_shard WHERE state = 'frozen'").fetchone()[0]
holder, job = start_move(meta, "copied")
reached = wait_phase(meta, job, "copy")
target_port = meta.execute(
    "SELECT n.port FROM pg_shard.job j JOIN pg_shard.node n ON n.node_id = j.target_node "
    "WHERE j.job_id = %s", (job,)).fetchone()[0]
new_tables = "SELECT shard_rel FROM pg_shard.local_shard WHERE state = 'frozen'"
deadline = time.time() + 60
before = (0, 0)
while time.time() < deadline and before[0] == 0:
    time.sleep(0.1)
    with connect(target_port) as target:
        before = target.execute(
            f"SELECT (SELECT count(*) FROM pg_index WHERE indrelid IN ({new_tables})), "
            f"(SELECT count(*) FROM pg_trigger WHERE tgrelid IN ({new_tables}))").fetchone()
runner, meta = kill_runner()
state, last = wait_job(meta, job, "2 minutes")
owner_port = meta.execute(
    "SELECT n.port FROM pg_shard.shards s JOIN pg_shard.node n USING (node_id) "
    "WHERE s.table_name = 'crash_items'::regclass ORDER BY s.range_start LIMIT 1").fetchone()[0]
with connect(owner_port) as owner:
    per_table = owner.execute(
        "SELECT min(i), max(i), min(t), max(t) FROM (SELECT "
        "(SELECT count(*) FROM pg_index WHERE indrelid = shard_rel) i, "
        "(SELECT count(*) FROM pg_trigger WHERE tgrelid = shard_rel) t FROM pg_shard.local_shard "
        "WHERE state = 'active' AND shard_rel::regclass::text LIKE 'crash_items%') c").fetchone()
rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
check(f"runner killed once the copy finished its tables ({reached}, {before} indexes and triggers "
      f"on the job's new tables, {frozen_before} other frozen tables before, "
      f"pid {runner}): job {state} ({last}), one primary key and three guards per shard table "
      f"({per_table}), rows intact, map and shards agree, nothing left ({leftovers})",
      runner is not None and frozen_before == 0 and before[0] > 0 and state == "done"
      and per_table == (1, 1, 3, 3)
      and rows_ok and owners_ok and not leftovers)

# Reads first: the runner killed while the job waits with its reads
# switched; it resumes waiting (the routes published once), and
# switch_writes ends it.
meta.execute("SET pg_shard.switch_writes_delay = '1h'")
holder, job = start_move(meta, None, reads_first=True)
deadline = time.time() + 60
while time.time() < deadline and not meta.execute(
        "SELECT reads_switched_at IS NOT NULL OR state NOT IN ('queued', 'running') "
        "FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()[0]:
    time.sleep(0.1)
routes_before = meta.execute("SELECT count(*) FROM pg_shard.read_route WHERE job_id = %s", (job,)).fetchone()[0]
runner, meta = kill_runner()
time.sleep(2)
phase, routes_after = meta.execute(
    "SELECT phase, (SELECT count(*) FROM pg_shard.read_route r WHERE r.job_id = j.job_id) "
    "FROM pg_shard.job j WHERE job_id = %s", (job,)).fetchone()
switched = meta.execute("SELECT pg_shard.switch_writes(%s)", (job,)).fetchone()[0]
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
holder.close()
rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
check(f"runner killed with reads switched (pid {runner}, {routes_before} read routes): it waits again "
      f"({phase}, {routes_after} routes); switch_writes ({switched}) ends the job ({state}), rows intact, "
      f"map and shards agree, nothing left ({leftovers})",
      runner is not None and routes_before > 0 and phase == "reads_switched" and routes_after == routes_before
      and switched and state == "done" and rows_ok and owners_ok and not leftovers)
meta.execute("RESET pg_shard.switch_writes_delay")

# A job that has not published its map cannot be reverted (cancel_job
# rolls it back); nothing changes.
holder, job = start_move(meta, "copy")
reached = wait_phase(meta, job, "copy")
try:
    meta.execute("SELECT pg_shard.revert_job(%s)", (job,))
    refused = None
except psycopg.errors.ObjectNotInPrerequisiteState as e:
    refused = str(e).splitlines()[0]
holder.close()
state, phase = wait_job(meta, job, "2 minutes")
check(f"revert_job at {reached} refused ({refused}); the {kind} went on ({state}, {phase})",
      refused is not None and "has not published its new map" in refused
      and state == "done" and phase == "completed")

# Reverted, with the runner killed at the start of the revert's cutover
# and of its cleanup: the revert resumes; the shard is back on its old
# node (a split's, in one piece again) and nothing of the job is left.
shard_count = "SELECT count(*) FROM pg_shard.shards WHERE table_name = 'crash_items'::regclass"
for phase in ("reverting", "revert_cleanup"):
    shards_before = meta.execute(shard_count).fetchone()[0]
    holder, job = start_move(meta, phase, drop_delay="1h")
    reached = wait_phase(meta, job, "reverse_replicating")
    source = meta.execute("SELECT source_node FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]
    meta.execute("INSERT INTO crash_items SELECT g, 'moved' FROM generate_series(30001, 30100) g")
    meta.execute("UPDATE crash_items SET v = 'moved' WHERE id <= 1000")
    meta.execute("SELECT pg_shard.revert_job(%s)", (job,))
    at = wait_phase(meta, job, phase)
    runner, meta = kill_runner()
    state, last = wait_job(meta, job, "2 minutes")
    owners = meta.execute(
        "SELECT DISTINCT s.node_id FROM pg_shard.shards s JOIN pg_shard.shard h USING (shard_id) "
        "WHERE h.shard_group_id = (SELECT shard_group_id FROM pg_shard.job WHERE job_id = %s)",
        (job,)).fetchall()
    pieces = meta.execute(
        "SELECT count(*), count(*) FILTER (WHERE shard_id = (SELECT shard_id FROM pg_shard.job WHERE job_id = %s)) "
        "FROM pg_shard.shards WHERE table_name = 'crash_items'::regclass", (job,)).fetchone()
    pieces = (pieces[0] - shards_before, pieces[1])
    moved = meta.execute("SELECT count(*) FROM crash_items WHERE v = 'moved'").fetchone()[0]
    meta.execute("DELETE FROM crash_items WHERE id > 30000")
    meta.execute("UPDATE crash_items SET v = repeat('v', 100) WHERE id <= 1000")
    rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
    check(f"runner killed while reverting, at {at} (pid {runner}): job {state} ({last}), "
          f"back on node {owners} (was {source}), shards added and the old one back: {pieces}, "
          f"the new owner's writes kept ({moved} of 1100), "
          f"rows intact, map and shards agree, nothing left ({leftovers})",
          runner is not None and state == "done" and last == "reverted" and owners == [(source,)]
          and pieces == (0, 1) and moved == 1100 and rows_ok and owners_ok and not leftovers)

# Completed early: the reverse replication ends and the old tables go.
holder, job = start_move(meta, "none", drop_delay="1h")
holder.close()
reached = wait_phase(meta, job, "reverse_replicating")
completed = meta.execute("SELECT pg_shard.complete_job(%s)", (job,)).fetchone()[0]
state, last = wait_job(meta, job, "1 minute")
rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
check(f"complete_job at {reached}: {completed}, job {state} ({last}), rows intact, nothing left ({leftovers})",
      completed is True and state == "done" and last == "completed" and rows_ok and owners_ok
      and not leftovers)


def restart(port):
    """Restarts the server on `port` (fast shutdown) and waits for it."""
    offset = int(port) - int(metadata_port)
    data = os.path.join(cluster_dir, "metadata" if offset == 0 else f"worker{offset}")
    subprocess.run(["runuser", "-u", "postgres", "--", os.path.join(bindir, "pg_ctl"), "-D", data,
                    "-m", "fast", "-w", "-s", "restart", "-l", os.path.join(data, "server.log")],
                   cwd="/", check=True, stdout=subprocess.DEVNULL)


# A server restarted while the job waits at a phase: the source, the
# target, the metadata node (whose restart also ends the pause).
# (A split's source and target are one node.)
restarts = (("catch_up", "target"), ("cutover", "source"), ("cutover", "target"),
            ("copy", "metadata"), ("cutover", "metadata"))
if kind == "split":
    restarts = (("copy", "source"), ("catch_up", "source"), ("cutover", "source"),
                ("copy", "metadata"), ("cutover", "metadata"))
for phase, which in restarts:
    holder, job = start_move(meta, phase)
    reached = wait_phase(meta, job, phase)
    source_port, target_port = meta.execute(
        "SELECT s.port, t.port FROM pg_shard.job j JOIN pg_shard.node s ON s.node_id = j.source_node "
        "JOIN pg_shard.node t ON t.node_id = j.target_node WHERE j.job_id = %s", (job,)).fetchone()
    port = {"source": source_port, "target": target_port, "metadata": metadata_port}[which]
    restart(port)
    if which == "metadata":
        meta = connect()
    else:
        holder.close()
    state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
    rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
    check(f"{which} restarted at {phase} ({reached}): job {state}, rows intact, map and shards agree, "
          f"nothing left ({leftovers})",
          state in ("done", "failed") and rows_ok and owners_ok and not leftovers)

# The target down for a few seconds when the job goes on: the step is tried
# again (a node that cannot be reached gets a few tries) and the job ends
# done.
holder, job = start_move(meta, "catch_up")
reached = wait_phase(meta, job, "catch_up")
target_port = meta.execute(
    "SELECT t.port FROM pg_shard.job j JOIN pg_shard.node t ON t.node_id = j.target_node WHERE j.job_id = %s",
    (job,)).fetchone()[0]
data = os.path.join(cluster_dir, f"worker{int(target_port) - int(metadata_port)}")
pg_ctl = [os.path.join(bindir, "pg_ctl"), "-D", data, "-w", "-s"]
subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl, "-m", "fast", "stop"], cwd="/", check=True)
holder.close()
time.sleep(3)
subprocess.run(["runuser", "-u", "postgres", "--", *pg_ctl, "-l", os.path.join(data, "server.log"), "start"],
               cwd="/", check=True, stdout=subprocess.DEVNULL)
state, error = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes'), NULL", (job,)).fetchone()
error = meta.execute("SELECT error FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]
rows_ok, owners_ok, leftovers = consistent(meta, rows, total)
check(f"target down for 3 s at {reached}: job {state} (error {error}), rows intact, map and shards agree, "
      f"nothing left ({leftovers})",
      state == "done" and error is None and rows_ok and owners_ok and not leftovers)

# Rows whose text form depends on session settings (timestamps, bytea,
# floats, intervals), on nodes whose defaults differ: the verification reads
# both sides alike, so the copy is found equal.
settings = ("DateStyle", "bytea_output", "extra_float_digits", "IntervalStyle", "TimeZone")
ports = [r[0] for r in meta.execute("SELECT port FROM pg_shard.node ORDER BY node_id").fetchall()]
for port, values in zip(ports, (("SQL, DMY", "escape", "0", "sql_standard", "Asia/Kolkata"),
                                ("German", "hex", "3", "iso_8601", "America/Caracas"))):
    with connect(port) as node:
        for name, value in zip(settings, values):
            node.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        node.execute("SELECT pg_reload_conf()")
meta.execute("DROP TABLE IF EXISTS crash_typed")
meta.execute("CREATE TABLE crash_typed (id bigint PRIMARY KEY, at timestamptz, b bytea, f float8, i interval)")
meta.execute("INSERT INTO crash_typed SELECT g, now() - g * interval '1 hour', decode(md5(g::text), 'hex'), "
             "g / 7.0, g * interval '1 min' FROM generate_series(1, 2000) g")
meta.execute("SELECT pg_shard.create_distributed_table('crash_typed', 'id', shard_count => 2, colocate_with => 'none')")
shard, target = meta.execute(
    "SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id) "
    "FROM pg_shard.shards s WHERE s.table_name = 'crash_typed'::regclass ORDER BY s.range_start LIMIT 1").fetchone()
if kind == "split":
    job = meta.execute("SELECT pg_shard.split_shard(%s)", (shard,)).fetchone()[0]
else:
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
error, verified = meta.execute(
    "SELECT error, resources->'verified'->>'rows' FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()
for port in ports:
    with connect(port) as node:
        for name in settings:
            node.execute(f"ALTER SYSTEM RESET {name}")
        node.execute("SELECT pg_reload_conf()")
check(f"nodes with different output settings: job {state}, verified {verified} rows (error {error})",
      state == "done" and verified is not None and int(verified) > 0)

meta.execute("DROP TABLE crash_items")
meta.execute("DROP TABLE crash_typed")
sys.exit(1 if check.failures else 0)
