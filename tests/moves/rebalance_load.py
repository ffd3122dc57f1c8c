#!/usr/bin/env python3
"""Rebalancing by load: statements through the coordinator hit two shard
groups on one node and none elsewhere; the coordinator reports its counts
per shard to the metadata node (every 10 s), and rebalance(strategy =>
'load') plans to move one of the two busy groups to the idle node, showing
the busiest/median ratio fall; within a byte budget too small for any
group it plans nothing.
Usage: rebalance_load.py METADATA_PORT COORDINATOR_PORT DATABASE"""
import sys
import time

import psycopg
from tap import Checks, connect

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("rebalance by load")

meta = connect(dsn.format(metadata_port))
meta.execute("DROP TABLE IF EXISTS hot_items")
meta.execute("CREATE TABLE hot_items (id bigint PRIMARY KEY, v int)")
meta.execute("INSERT INTO hot_items SELECT g, 0 FROM generate_series(1, 4000) g")
meta.execute("SELECT pg_shard.create_distributed_table('hot_items', 'id', shard_count => 4, colocate_with => 'none')")
shards = meta.execute(
    "SELECT shard_id, node_id, range_start, range_end FROM pg_shard.shards "
    "WHERE table_name = 'hot_items'::regclass ORDER BY node_id, range_start").fetchall()
busy_node = shards[0][1]
hot = [s for s in shards if s[1] == busy_node][:2]
idle = {s[1] for s in shards} - {busy_node}
keys = [meta.execute(
    "SELECT min(g) FROM generate_series(1, 4000) g WHERE pg_shard.keyspace_id(g::bigint) BETWEEN %s AND %s",
    (s[2], s[3])).fetchone()[0] for s in hot]
check(f"two shard groups on node {busy_node} to keep busy ({[s[0] for s in hot]}, keys {keys}), "
      f"another node idle ({idle})", len(hot) == 2 and all(keys) and idle)

time.sleep(1)  # the coordinator hears of the new table
client = psycopg.connect(dsn.format(coordinator_port), autocommit=True)
deadline = time.time() + 60
reported = False
statements = 0
while time.time() < deadline and not reported:
    for key in keys:
        client.execute("SELECT v FROM hot_items WHERE id = %s", (key,))
        statements += 1
    if statements % 200 == 0:
        reported = meta.execute(
            "SELECT count(*) = 2 FROM pg_shard.shard_load WHERE shard_id = ANY (%s) AND per_second > 0",
            ([s[0] for s in hot],)).fetchone()[0]
rates = meta.execute(
    "SELECT shard_id, round(per_second) FROM pg_shard.shard_load WHERE shard_id = ANY (%s) ORDER BY 1",
    ([s[0] for s in hot],)).fetchall()
check(f"the coordinator reported rates for both busy shards ({statements} statements sent; {rates})", reported)
client.close()

plan = meta.execute("SELECT * FROM pg_shard.rebalance(strategy => 'load')").fetchall()
check(f"the plan moves one busy group off node {busy_node} to an idle node, the busiest/median ratio "
      f"falling ({[(r[0], r[1], r[2], float(r[4]), float(r[5])) for r in plan]})",
      len(plan) >= 1 and plan[0][0] in [s[0] for s in hot] and plan[0][1] == busy_node
      and plan[0][2] in idle and plan[0][5] < plan[0][4] and all(r[6] is None for r in plan))
none = meta.execute("SELECT * FROM pg_shard.rebalance(strategy => 'load', max_bytes => 1)").fetchall()
check(f"within a byte budget too small for any group it plans nothing ({len(none)})", not none)
meta.execute("DROP TABLE hot_items")
sys.exit(1 if check.failures else 0)
