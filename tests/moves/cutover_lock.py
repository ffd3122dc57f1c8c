#!/usr/bin/env python3
"""A cutover's lock waits a bounded time for the transactions in flight: a
transaction left open on the moved shard (through the metadata node) holds
the move at its cutover, which gives its lock up after 100 ms and tries
again, so other writers of the shard (through the coordinator) are never
held for long meanwhile, and pg_shard.jobs says why the job waits. Once the
transaction commits, the move ends done with every write there once.
Usage: cutover_lock.py METADATA_PORT COORDINATOR_PORT DATABASE"""
import sys
import time

from tap import Checks, Writer, connect

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("cutover lock")

meta = connect(dsn.format(metadata_port))
meta.execute("DROP TABLE IF EXISTS cl_items")
meta.execute("CREATE TABLE cl_items (id bigint PRIMARY KEY, v bigint NOT NULL)")
meta.execute("INSERT INTO cl_items SELECT g, 0 FROM generate_series(1, 2000) g")
meta.execute("SELECT pg_shard.create_distributed_table('cl_items', 'id', shard_count => 2, colocate_with => 'none')")
time.sleep(1)  # the coordinator hears of the new table
shard, target, held_id, written_id = meta.execute(
    "SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id), "
    "(SELECT min(id) FROM cl_items WHERE pg_shard.keyspace_id(id) BETWEEN s.range_start AND s.range_end), "
    "(SELECT max(id) FROM cl_items WHERE pg_shard.keyspace_id(id) BETWEEN s.range_start AND s.range_end) "
    "FROM pg_shard.shards s WHERE s.table_name = 'cl_items'::regclass ORDER BY s.range_start LIMIT 1").fetchone()


writer = Writer(dsn.format(coordinator_port), "UPDATE cl_items SET v = v + 1 WHERE id = %s", (written_id,))
# The job held at the start of its cutover (the runner's pause point; the
# verification before it takes a brief lock of its own), then a
# transaction left open: its row lock keeps the shard table's RowExclusive
# lock on the worker until it commits.
phase_holder = connect(dsn.format(metadata_port))
phase_holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('cutover'))")
meta.execute("SET pg_shard.move_drop_delay = 0")
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
deadline = time.time() + 120
while time.time() < deadline and meta.execute(
        "SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0] != "cutover":
    time.sleep(0.1)
holder = connect(dsn.format(metadata_port))
holder.execute("BEGIN")
holder.execute("UPDATE cl_items SET v = v + 100 WHERE id = %s", (held_id,))
phase_holder.close()
deadline = time.time() + 60
error = None
while time.time() < deadline:
    phase, error = meta.execute("SELECT phase, error FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()
    if phase == "cutover" and error:
        break
    time.sleep(0.1)
waiting_from = time.monotonic()
time.sleep(4)
phase, state, error = meta.execute("SELECT phase, state, error FROM pg_shard.jobs WHERE job_id = %s",
                                   (job,)).fetchone()
waiting = [seconds for started, seconds in writer.done if started >= waiting_from]
longest = max(waiting) if waiting else None
check(f"an open transaction holds the move at its cutover ({state}, {phase}; {error})",
      state == "running" and phase == "cutover" and "waited more than 100 ms" in (error or ""))
check(f"other writers of the shard are not held meanwhile: {len(waiting)} writes in 4 s, longest "
      f"{longest and round(longest * 1000)} ms",
      len(waiting) > 20 and longest is not None and longest < 1.0)
holder.execute("COMMIT")
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
time.sleep(0.5)
writer.stop()
moved = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
held_v, written_v = meta.execute(
    "SELECT (SELECT v FROM cl_items WHERE id = %s), (SELECT v FROM cl_items WHERE id = %s)",
    (held_id, written_id)).fetchone()
check(f"once it commits the move ends: {state}, on node {moved} (target {target})",
      state == "done" and moved == target)
check(f"every write there once: the held row {held_v} (100), the written one {written_v} "
      f"({len(writer.done)} acknowledged), errors {writer.errors[:3]}",
      held_v == 100 and written_v == len(writer.done) and not writer.errors)
meta.execute("DROP TABLE cl_items")
sys.exit(1 if check.failures else 0)
