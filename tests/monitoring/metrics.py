#!/usr/bin/env python3
"""Per-shard statistics from traffic to what Prometheus scrapes: statements
through the coordinator, most of them to one key, reach
pg_shard.shard_stats (rate, p50 and p99 from the coordinator's reports)
and pg_shard.imbalance() (that key's node is the busiest); the
coordinator's /metrics serves the same as series, and every series the
shipped alert rules (docs/monitoring/pg_shard.rules.yml) use is among them.
A paced move shows its job on its shards while it runs.
Usage: metrics.py METADATA_PORT COORDINATOR_PORT METRICS_ADDRESS DATABASE RULES_FILE"""
import os
import re
import sys
import time
import urllib.request

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect  # noqa: E402

metadata_port, coordinator_port, metrics_address, database, rules_file = sys.argv[1:6]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("monitoring")


def scrape():
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as response:
        return response.read().decode()


def series(text, name):
    """{labels: value} of one metric."""
    found = {}
    for line in text.splitlines():
        match = re.match(rf"^{name}\{{(.*)\}} (\S+)$", line)
        if match:
            found[match.group(1)] = float(match.group(2))
    return found


meta = connect(dsn.format(metadata_port))
via = connect(dsn.format(coordinator_port))
meta.execute("DROP TABLE IF EXISTS watched_load")
meta.execute("CREATE TABLE watched_load (id bigint PRIMARY KEY, v text)")
meta.execute("INSERT INTO watched_load SELECT g, repeat('w', 100) FROM generate_series(1, 20000) g")
meta.execute("SELECT pg_shard.create_distributed_table('watched_load', 'id', shard_count => 4, "
             "colocate_with => 'none')")
hot_shard, hot_node = meta.execute(
    "SELECT s.shard_id, s.node_id FROM pg_shard.shards s WHERE s.table_name = 'watched_load'::regclass "
    "AND pg_shard.keyspace_id(7::bigint) BETWEEN s.range_start AND s.range_end").fetchone()

# A scrape asks the coordinator to read the cluster's statistics from now on.
scrape()
# 25 s of statements, 9 in 10 for key 7: two reports (10 s apart) give a rate.
deadline = time.monotonic() + 25
sent = 0
while time.monotonic() < deadline:
    key = 7 if sent % 10 else 1 + sent % 20000
    via.execute("SELECT v FROM watched_load WHERE id = %s", (key,)).fetchone()
    sent += 1
time.sleep(11)

rows = meta.execute(
    "SELECT shard_id, node_id, size_bytes, estimated_rows, statements_per_second, p50_ms, p99_ms, "
    "now() - last_report < interval '30 seconds' FROM pg_shard.shard_stats "
    "WHERE table_name = 'watched_load'::regclass").fetchall()
hot = [r for r in rows if r[0] == hot_shard]
busiest = max(rows, key=lambda r: r[4]) if rows else None
check(f"shard_stats: every placement has a size ({[r[2] for r in rows]})",
      len(rows) == 4 and all(r[2] and r[2] > 0 for r in rows))
check(f"shard_stats: the hot key's shard is the busiest, {hot[0][4] if hot else None:.0f}/s "
      f"({sent} statements sent)", bool(hot) and busiest is not None and busiest[0] == hot_shard
      and hot[0][4] > 10)
check(f"shard_stats: its p50 and p99 come from the coordinator ({hot[0][5] if hot else None} ms, "
      f"{hot[0][6] if hot else None} ms)", bool(hot) and hot[0][5] is not None and hot[0][6] is not None
      and 0 < hot[0][5] <= hot[0][6] and hot[0][7])
imbalance = dict((r[0], r[1:]) for r in meta.execute(
    "SELECT measure, busiest_node, ratio FROM pg_shard.imbalance()").fetchall())
check(f"imbalance(): the hot shard's node is the busiest by statements ({imbalance})",
      set(imbalance) == {"size_bytes", "statements_per_second"}
      and imbalance["statements_per_second"][0] == hot_node)

text = scrape()
label = f'shard="{hot_shard}"'
rates = {k: v for k, v in series(text, "pg_shard_shard_statements_per_second").items() if label in k}
check(f"/metrics: the hot shard's rate ({rates})", len(rates) == 1 and list(rates.values())[0] > 10)
sizes = {k: v for k, v in series(text, "pg_shard_shard_size_bytes").items() if "watched_load" in k}
check(f"/metrics: a size for each shard ({len(sizes)})", len(sizes) == 4 and all(v > 0 for v in sizes.values()))
p99 = {k: v for k, v in series(text, "pg_shard_shard_latency_p99_seconds").items() if label in k}
check(f"/metrics: the hot shard's p99 ({p99})", len(p99) == 1 and 0 < list(p99.values())[0] < 5)
ratios = series(text, "pg_shard_imbalance_ratio")
check(f"/metrics: imbalance by statements ({ratios})",
      any('measure="statements_per_second"' in k and v >= 1 for k, v in ratios.items()))
up = series(text, "pg_shard_node_up")
check(f"/metrics: every worker up ({up})", len(up) >= 2 and all(v == 1 for v in up.values()))
prepared = series(text, "pg_shard_prepared_transactions")
check(f"/metrics: nothing left prepared ({prepared})", prepared and all(v == 0 for v in prepared.values()))

# The alert rules use only series /metrics serves, in valid expressions.
with open(rules_file) as f:
    rules = yaml.safe_load(f)
alerts = [rule for group in rules["groups"] for rule in group["rules"]]
served = set(re.findall(r"^# TYPE (\S+) ", text, re.M))
used = {name for rule in alerts for name in re.findall(r"\b(pg_shard_[a-z0-9_]+)\b", rule["expr"])}
check(f"alert rules: {len(alerts)} rules on served series ({sorted(used - served)} missing)",
      len(alerts) >= 4 and used and used <= served
      and all(rule.get("alert") and rule.get("for") and rule["labels"].get("severity") for rule in alerts))
names = {rule["alert"] for rule in alerts}
check(f"alert rules: imbalance, node down, replication lag, prepared transactions ({sorted(names)})",
      {"PgShardImbalance", "PgShardNodeDown", "PgShardReplicationLag",
       "PgShardPreparedTransactionsLeftBehind"} <= names)

# A paced move: its shards show the job while it runs.
meta.execute("SET pg_shard.copy_rate_limit = 1")
meta.execute("SET pg_shard.move_drop_delay = 0")
job = meta.execute(
    "SELECT pg_shard.move_shard(%s, (SELECT min(node_id) FROM pg_shard.node WHERE node_id <> %s))",
    (hot_shard, hot_node)).fetchone()[0]
seen = None
for _ in range(100):
    seen = meta.execute("SELECT job_id, job_kind, job_phase FROM pg_shard.shard_stats "
                        "WHERE shard_id = %s AND job_id IS NOT NULL", (hot_shard,)).fetchone()
    if seen:
        break
    time.sleep(0.1)
check(f"shard_stats shows the move of the shard while it runs ({seen})",
      seen is not None and seen[0] == job and seen[1] == "move")
state = meta.execute("SELECT pg_shard.wait_job(%s, '3 minutes')", (job,)).fetchone()[0]
after = meta.execute("SELECT count(*) FROM pg_shard.shard_stats WHERE job_id = %s", (job,)).fetchone()[0]
check(f"after the move ({state}) no shard shows it", state == "done" and after == 0)
meta.execute("DROP TABLE watched_load")
sys.exit(1 if check.failures else 0)
