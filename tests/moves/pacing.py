#!/usr/bin/env python3
"""A move's copy paced by the source's replication lag: a consumer of the
source's WAL that stopped reading (a logical slot nobody reads, as a paused
subscriber leaves) lags by more than pg_shard.max_replication_lag, so the
job waits in its copy, and pg_shard.jobs shows for how long and why; once
the consumer is gone the job goes on and ends done with every row. Its
catch-up is held the same way, with its subscription disabled. A job
queued with the limit off does not wait.
Usage: pacing.py METADATA_PORT DATABASE"""
import sys
import time

from tap import Checks, connect

metadata_port, database = sys.argv[1], sys.argv[2]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("pacing")

meta = connect(dsn.format(metadata_port))
meta.execute("DROP TABLE IF EXISTS paced")
meta.execute("CREATE TABLE paced (id bigint PRIMARY KEY, v text)")
meta.execute("INSERT INTO paced SELECT g, repeat('p', 200) FROM generate_series(1, 20000) g")
meta.execute("SELECT pg_shard.create_distributed_table('paced', 'id', shard_count => 2, colocate_with => 'none')")
rows, total = meta.execute("SELECT count(*), sum(id) FROM paced").fetchone()


def first_shard():
    return meta.execute(
        "SELECT s.shard_id, s.port, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id) "
        "FROM pg_shard.shards s WHERE s.table_name = 'paced'::regclass ORDER BY s.range_start LIMIT 1").fetchone()


shard, source_port, target = first_shard()
source = connect(dsn.format(source_port))
source.execute("SELECT pg_create_logical_replication_slot('pacing_paused', 'pgoutput')")
# WAL the slot does not read: 8 MB of it.
source.execute("CREATE TABLE pacing_wal (v text)")
source.execute("INSERT INTO pacing_wal SELECT repeat('w', 1000) FROM generate_series(1, 8000)")
lag = source.execute(
    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn) FROM pg_replication_slots "
    "WHERE slot_name = 'pacing_paused'").fetchone()[0]

meta.execute("SET pg_shard.move_drop_delay = 0")
meta.execute("SET pg_shard.copy_rate_limit = 0")
meta.execute("SET pg_shard.max_replication_lag = '1MB'")
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
deadline = time.time() + 60
while time.time() < deadline:
    phase, throttled_by = meta.execute(
        "SELECT phase, throttled_by FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()
    if throttled_by:
        break
    time.sleep(0.1)
time.sleep(3)
phase, state, copied, throttled, throttled_by = meta.execute(
    "SELECT phase, state, rows_copied, extract(epoch FROM throttled), throttled_by "
    "FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()
check(f"a slot lagging {float(lag) / 1e6:.1f} MB holds the copy: {state}, {phase}, {copied} rows copied, "
      f"waited {throttled} s ({throttled_by})",
      state == "running" and phase == "copy" and copied == 0 and throttled is not None and float(throttled) >= 2
      and "slot pacing_paused" in (throttled_by or "") and "pg_shard.max_replication_lag" in throttled_by)

source.execute("SELECT pg_drop_replication_slot('pacing_paused')")
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
moved = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
count, summed = meta.execute("SELECT count(*), sum(id) FROM paced").fetchone()
check(f"the slot gone, the job goes on: {state}, shard on node {moved}, {count} rows",
      state == "done" and moved == target and (count, summed) == (rows, total))

# The catch-up is paced too: a job held at the start of its catch-up
# while a consumer of the source's WAL stops reading waits there, with its
# subscription disabled (the source's walsender stops with it), until the
# consumer is gone.
source.execute("DROP TABLE pacing_wal")
shard, source_port, target = first_shard()
source = connect(dsn.format(source_port))
holder = connect(dsn.format(metadata_port))
holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('catch_up'))")
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
deadline = time.time() + 60
while time.time() < deadline and meta.execute(
        "SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0] != "catch_up":
    time.sleep(0.1)
throttled_before = meta.execute("SELECT throttled FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()[0]
source.execute("SELECT pg_create_logical_replication_slot('pacing_paused', 'pgoutput')")
source.execute("CREATE TABLE pacing_wal (v text)")
source.execute("INSERT INTO pacing_wal SELECT repeat('w', 1000) FROM generate_series(1, 8000)")
holder.close()
deadline = time.time() + 60
while time.time() < deadline and not meta.execute(
        "SELECT throttled_by FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()[0]:
    time.sleep(0.1)
time.sleep(3)
phase, state, throttled, throttled_by = meta.execute(
    "SELECT phase, state, extract(epoch FROM throttled), throttled_by FROM pg_shard.jobs WHERE job_id = %s",
    (job,)).fetchone()
target_port = meta.execute("SELECT port FROM pg_shard.node WHERE node_id = %s", (target,)).fetchone()[0]
with connect(dsn.format(target_port)) as target_node:
    enabled = target_node.execute(
        "SELECT subenabled FROM pg_subscription WHERE subname = %s", (f"pg_shard_job_{job}",)).fetchone()
check(f"a slot lagging holds the catch-up: {state}, {phase} (throttled before: {throttled_before}), "
      f"waited {throttled} s ({throttled_by}), subscription enabled: {enabled}",
      state == "running" and phase == "catch_up" and throttled_before is None and throttled is not None
      and float(throttled) >= 2 and "slot pacing_paused" in (throttled_by or "") and enabled == (False,))
source.execute("SELECT pg_drop_replication_slot('pacing_paused')")
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
moved = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
count, summed = meta.execute("SELECT count(*), sum(id) FROM paced").fetchone()
check(f"the slot gone, the catch-up goes on: {state}, shard on node {moved}, {count} rows",
      state == "done" and moved == target and (count, summed) == (rows, total))

# The limit off (0): a job does not wait for the same lag (on the shard's
# source now, the other node).
source.execute("DROP TABLE pacing_wal")
shard, source_port, target = first_shard()
source = connect(dsn.format(source_port))
source.execute("SELECT pg_create_logical_replication_slot('pacing_paused', 'pgoutput')")
source.execute("CREATE TABLE pacing_wal (v text)")
source.execute("INSERT INTO pacing_wal SELECT repeat('w', 1000) FROM generate_series(1, 8000)")
meta.execute("SET pg_shard.max_replication_lag = 0")
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
throttled = meta.execute("SELECT throttled FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()[0]
check(f"with the limit off the job does not wait: {state}, throttled {throttled}",
      state == "done" and throttled is None)
source.execute("SELECT pg_drop_replication_slot('pacing_paused')")
source.execute("DROP TABLE pacing_wal")
meta.execute("DROP TABLE paced")
sys.exit(1 if check.failures else 0)
