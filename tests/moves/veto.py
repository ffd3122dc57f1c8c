#!/usr/bin/env python3
"""A cutover that fails after its retire gives the shard back: the new side's
apply of the activation marker is slowed (a trigger of the test's own on the
job's marker table of the target sleeps 5 s) past the job's
pg_shard.cutover_apply_timeout (2 s), so the job gives up with the old side
retired and the marker on its way. The runner vetoes the activation on the
target and makes the old side active again; the job then rolls back.

ORDER says where the slow trigger sits:
  before  it sleeps before pg_shard's activation trigger: the veto is there
          first, and the apply, when it goes on, must not activate;
  after   it sleeps after the activation, holding it uncommitted: the veto
          waits for it and undoes it.
Either way the target never ends active, the source takes writes again
(through the coordinator) while the job is held before its rollback, every
acknowledged write is there once, the job fails, and a second move of the
shard then succeeds.
Usage: veto.py METADATA_PORT COORDINATOR_PORT DATABASE before|after"""
import sys
import time

from tap import Checks, Writer, connect, distributed_counters

metadata_port, coordinator_port, database, order = sys.argv[1:5]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks(f"veto ({order})")
trigger = {"before": "a_slow_apply", "after": "z_slow_apply"}[order]

meta = connect(dsn.format(metadata_port))
distributed_counters(meta, "veto_items", 2000, shard_count=2, colocate_with="none")
time.sleep(1)  # the coordinator hears of the new table
shard, source, target, written_id = meta.execute(
    "SELECT s.shard_id, s.node_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id), "
    "(SELECT max(id) FROM veto_items WHERE pg_shard.keyspace_id(id) BETWEEN s.range_start AND s.range_end) "
    "FROM pg_shard.shards s WHERE s.table_name = 'veto_items'::regclass ORDER BY s.range_start LIMIT 1").fetchone()


def node(node_id):
    host, port = meta.execute("SELECT host, port FROM pg_shard.node WHERE node_id = %s", (node_id,)).fetchone()
    return connect(f"host={host} port={port} dbname={database} user=postgres")


def states(conn):
    return [row[0] for row in conn.execute(
        "SELECT state FROM pg_shard.local_shard WHERE shard_id = %s", (shard,)).fetchall()]


# Refusals while the shard has no owner are expected: only acknowledged
# writes count.
writer = Writer(dsn.format(coordinator_port), "UPDATE veto_items SET v = v + 1 WHERE id = %s", (written_id,))
# The job held at the start of its cutover (and, later, of its rollback)
# while the slow trigger goes in.
cutover_holder = connect(dsn.format(metadata_port))
cutover_holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('cutover'))")
rollback_holder = connect(dsn.format(metadata_port))
rollback_holder.execute("SELECT pg_advisory_lock(hashtext('pg_shard job phase'), hashtext('rollback'))")
meta.execute("SET pg_shard.move_drop_delay = 0")
meta.execute("SET pg_shard.cutover_apply_timeout = '2s'")
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
meta.execute("RESET pg_shard.cutover_apply_timeout")
deadline = time.time() + 120
while time.time() < deadline and meta.execute(
        "SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0] != "cutover":
    time.sleep(0.1)
on_target, on_source = node(target), node(source)
marker = f"pg_shard.job_{job}_marker"
on_target.execute(f"""
    CREATE OR REPLACE FUNCTION public.veto_test_slow_apply() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN PERFORM pg_sleep(5); RETURN NEW; END $$;
    CREATE TRIGGER {trigger} BEFORE INSERT ON {marker} FOR EACH ROW
        WHEN (NEW.activate_version > 0) EXECUTE FUNCTION public.veto_test_slow_apply();
    ALTER TABLE {marker} ENABLE REPLICA TRIGGER {trigger};
""")
cutover_holder.close()
deadline = time.time() + 60
phase = error = None
while time.time() < deadline:
    phase, error = meta.execute("SELECT phase, error FROM pg_shard.jobs WHERE job_id = %s", (job,)).fetchone()
    if phase == "rollback":
        break
    time.sleep(0.1)
check(f"the cutover gave up past its apply timeout ({phase}: {error})",
      phase == "rollback" and "did not apply the last writes within 2s" in (error or ""))
# The slow apply ends (5 s) and commits the marker: its activation did not
# happen or was undone.
deadline = time.time() + 30
applied = 0
while time.time() < deadline:
    applied = on_target.execute(
        f"SELECT count(*) FROM {marker} WHERE activate_version > 0").fetchone()[0]
    if applied:
        break
    time.sleep(0.1)
time.sleep(0.5)
rows = on_target.execute(f"SELECT job, activate_version FROM {marker} ORDER BY job").fetchall()
vetoes = [job for job, _ in rows if job > 0 and job & (1 << 61)]
check(f"the marker was applied late ({applied}) against a veto ({len(vetoes)}); the target's copy is not "
      f"active: {states(on_target)} (marker rows {rows})",
      applied == 1 and len(vetoes) == 1 and states(on_target) == ["frozen"])
# The trigger notes the time of an activation it made: "before" must have
# been turned away by the veto, "after" must have activated (and been
# undone), or the test did not take the path it names.
activated = on_target.execute(
    f"SELECT applied_at IS NOT NULL FROM {marker} WHERE activate_version > 0").fetchone()[0]
check(f"the late apply {'activated, then was undone' if activated else 'did not activate'}",
      activated == (order == "after"))
check(f"the source's copy is active again: {states(on_source)}", states(on_source) == ["active"])
held_from = time.monotonic()
time.sleep(2)
while_held = len([started for started, _ in writer.done if started >= held_from])
check(f"writes go on through the coordinator while the job waits ({while_held} in 2 s)", while_held > 20)
rollback_holder.close()
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
owner = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
check(f"the job failed and the shard stayed: {state}, on node {owner} (source {source}); the target "
      f"kept no copy: {states(on_target)}",
      state == "failed" and owner == source and states(on_target) == [])
# Nothing left behind stands in the way of the next move.
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
state = meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,)).fetchone()[0]
time.sleep(0.5)
writer.stop()
owner = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
check(f"a second move succeeds: {state}, on node {owner} (target {target})", state == "done" and owner == target)
written = meta.execute("SELECT v FROM veto_items WHERE id = %s", (written_id,)).fetchone()[0]
check(f"every acknowledged write there once: {written} ({len(writer.done)} acknowledged; "
      f"{len(writer.errors)} refused, e.g. {writer.errors[:1]})", written == len(writer.done))
on_target.execute("DROP FUNCTION public.veto_test_slow_apply() CASCADE")
meta.execute("DROP TABLE veto_items")
sys.exit(1 if check.failures else 0)
