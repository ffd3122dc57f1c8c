#!/usr/bin/env python3
"""Progress of a long move, as a DBA watching pg_shard.wait_job sees it: a
move whose copy is held to 1 MB/s (pg_shard.copy_rate_limit) prints a
NOTICE every second (pg_shard.job_progress_interval) naming the job, its
phase and how much of its copy is done; the percentages go up, at least one
lies strictly between 0 and 100, and pg_shard.job_progress() says `done`
once it ended. With the interval at 0, a wait prints nothing.
Usage: progress.py METADATA_PORT DATABASE"""
import re
import sys

from tap import Checks, connect

metadata_port, database = sys.argv[1], sys.argv[2]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("progress")

meta = connect(dsn.format(metadata_port))
notices = []
meta.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
meta.execute("DROP TABLE IF EXISTS watched")
meta.execute("CREATE TABLE watched (id bigint PRIMARY KEY, v text)")
meta.execute("INSERT INTO watched SELECT g, repeat('w', 300) FROM generate_series(1, 30000) g")
meta.execute("SELECT pg_shard.create_distributed_table('watched', 'id', shard_count => 2, colocate_with => 'none')")


def move_first_shard():
    shard, target = meta.execute(
        "SELECT s.shard_id, (SELECT min(node_id) FROM pg_shard.node n WHERE n.node_id <> s.node_id) "
        "FROM pg_shard.shards s WHERE s.table_name = 'watched'::regclass "
        "ORDER BY s.range_start LIMIT 1").fetchone()
    return meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]


# A copy of about 5 MB at 1 MB/s, watched every second.
meta.execute("SET pg_shard.copy_rate_limit = 1")
meta.execute("SET pg_shard.move_drop_delay = 0")
meta.execute("SET pg_shard.job_progress_interval = '1s'")
job = move_first_shard()
notices.clear()
state = meta.execute("SELECT pg_shard.wait_job(%s, '3 minutes')", (job,)).fetchone()[0]
check(f"the paced move ended done ({state})", state == "done")
ours = [n for n in notices if n.startswith(f"job {job} (move of shard ")]
copying = [n for n in ours if ": copy, copied " in n]
percents = [int(m.group(1)) for m in (re.search(r"copied (\d+)% of ", n) for n in copying) if m]
phases = sorted({n.split(": ")[1].split(",")[0] for n in ours})
check(f"wait_job printed the copy's progress every second ({len(copying)} of {len(ours)} NOTICEs, "
      f"phases {phases}: {copying[:2]})", len(copying) >= 2 and len(ours) == len(notices))
check(f"the percentages go up, and one lies between 0 and 100 ({percents})",
      len(percents) >= 2 and percents == sorted(percents) and any(0 < p < 100 for p in percents))
final = meta.execute("SELECT pg_shard.job_progress(%s)", (job,)).fetchone()[0]
check(f"job_progress says it is done ({final})", final.endswith(": done"))

# With the interval at 0, nothing.
notices.clear()
meta.execute("SET pg_shard.copy_rate_limit = 1")
meta.execute("SET pg_shard.job_progress_interval = 0")
job = move_first_shard()
state = meta.execute("SELECT pg_shard.wait_job(%s, '3 minutes')", (job,)).fetchone()[0]
check(f"with pg_shard.job_progress_interval = 0 the wait prints nothing ({state}, {notices[:2]})",
      state == "done" and not notices)
meta.execute("DROP TABLE watched")
sys.exit(1 if check.failures else 0)
