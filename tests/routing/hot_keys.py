#!/usr/bin/env python3
"""Hot keys under a skewed pgbench run through the coordinator.

hk_accounts (aid) is distributed over 4 shards; pgbench reads by aid, 40%
of the time aid 42 and otherwise one of 10,000 at random. The coordinator's
sketch must name 42 the hottest key of the table with a share near 0.4
(SHOW HOT_KEYS and /metrics), and pg_shard.hot_keys() on the metadata node,
fed by the coordinator's reports, must name it too, with the shard and
node that hold it. Then the DBA's next step: isolating the hot key, which
leaves it alone in its shard.

Usage: hot_keys.py METADATA_PORT COORDINATOR_PORT METRICS_ADDRESS DATABASE"""
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect  # noqa: E402

metadata_port, coordinator_port, metrics, database = sys.argv[1:5]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("hot keys")
table = "hk_accounts"

meta = connect(dsn.format(metadata_port))
meta.execute(f"DROP TABLE IF EXISTS {table}")
meta.execute(f"CREATE TABLE {table} (aid bigint PRIMARY KEY, abalance int NOT NULL)")
meta.execute(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, 10000) g")
meta.execute(f"SELECT pg_shard.create_distributed_table('{table}', 'aid', shard_count => 4, "
             "colocate_with => 'none')")
time.sleep(1)

script = f"""\\set hot random(1, 100)
\\set aid random(1, 10000)
\\if :hot <= 40
\\set aid 42
\\endif
SELECT abalance FROM {table} WHERE aid = :aid;
"""
with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as f:
    f.write(script)
    script_path = f.name
for mode in ("simple", "extended"):
    run = subprocess.run(
        ["pgbench", "-n", "-M", mode, "-c", "4", "-j", "2", "-T", "4", "-h", "127.0.0.1",
         "-p", coordinator_port, "-U", "postgres", "-f", script_path, database],
        capture_output=True, text=True)
    check(f"pgbench ({mode} protocol) ran without error", run.returncode == 0)
os.unlink(script_path)

client = connect(dsn.format(coordinator_port))
rows = [r for r in client.execute("SHOW HOT_KEYS", prepare=False).fetchall() if r[1] == f"public.{table}"]
top = rows[0] if rows else None
check(f"SHOW HOT_KEYS names aid 42 the hottest key of {table} ({top})", top is not None and top[2] == "42")
share = float(top[5]) if top else 0.0
check(f"with a share near 0.4 ({share:.3f})", 0.33 <= share <= 0.47)
kid = meta.execute("SELECT pg_shard.keyspace_id(42::bigint)").fetchone()[0]
check("and its keyspace id", top is not None and int(top[3]) == kid)
others = [float(r[5]) for r in rows[1:]]
# (A count may hold up to total / 64 statements of keys it replaced.)
check(f"every other key's share is within the sketch's error bound, 1/64 (largest {max(others, default=0):.4f})",
      all(s <= 1 / 64 for s in others))
text = urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10).read().decode()
line = next((l for l in text.splitlines()
             if l.startswith("pg_shard_hot_key_share{") and f'table="public.{table}"' in l
             and 'key="42"' in l), None)
check(f"/metrics exports its share ({line})", line is not None and 0.33 <= float(line.rsplit(" ", 1)[1]) <= 0.47)

# The coordinator reports every 10 s.
deadline = time.time() + 40
reported = None
while time.time() < deadline:
    reported = meta.execute(
        "SELECT key, share, shard_id, node_id, coordinators FROM pg_shard.hot_keys() "
        "WHERE table_name = %s::regclass ORDER BY share DESC LIMIT 1", (table,)).fetchone()
    if reported:
        break
    time.sleep(1)
check(f"pg_shard.hot_keys() on the metadata node names it too ({reported})",
      reported is not None and reported[0] == "42" and 0.33 <= reported[1] <= 0.47)
holder = meta.execute(
    "SELECT shard_id, node_id FROM pg_shard.shards WHERE table_name = %s::regclass "
    "AND %s BETWEEN range_start AND range_end", (table, kid)).fetchone()
check(f"with the shard and node that hold it ({holder})",
      reported is not None and (reported[2], reported[3]) == tuple(holder))

# The DBA isolates it.
meta.execute("SET pg_shard.move_drop_delay = 0")
job = meta.execute("SELECT pg_shard.isolate_tenant(%s, %s::bigint)", (table, reported[0] if reported else "42")).fetchone()[0]
state = meta.execute("SELECT pg_shard.wait_job(%s, '3 minutes')", (job,)).fetchone()[0]
alone = meta.execute(
    "SELECT range_start = range_end FROM pg_shard.shards WHERE table_name = %s::regclass "
    "AND %s BETWEEN range_start AND range_end", (table, kid)).fetchone()[0]
check(f"isolate_tenant gave it a shard of its own ({state})", state == "done" and alone)
meta.execute(f"DROP TABLE {table}")
sys.exit(1 if check.failures else 0)
