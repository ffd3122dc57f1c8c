#!/usr/bin/env python3
"""Rebalancing and draining: a node joins a cluster of N workers, rebalance
plans (dry run) and then runs the moves that even out shard bytes (about
1/(N+1) of them move); draining the node moves everything back off it. Rows
are intact throughout.
Usage: rebalance.py METADATA_PORT NEW_WORKER_PORT DATABASE"""
import sys

import psycopg
from tap import Checks

metadata_port, new_port, database = sys.argv[1], int(sys.argv[2]), sys.argv[3]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("rebalance")


meta = psycopg.connect(dsn.format(metadata_port), autocommit=True)
meta.execute("SET synchronous_commit = on")
meta.execute("SET pg_shard.move_drop_delay = 0")
meta.execute("DROP TABLE IF EXISTS spread_items")
meta.execute("CREATE TABLE spread_items (id bigint PRIMARY KEY, v text)")
meta.execute("INSERT INTO spread_items SELECT g, repeat('r', 300) FROM generate_series(1, 30000) g")
meta.execute("SELECT pg_shard.create_distributed_table('spread_items', 'id', shard_count => 12, colocate_with => 'none')")
rows = meta.execute("SELECT count(*), sum(id) FROM spread_items").fetchone()


def bytes_by_node():
    return dict(meta.execute(
        "SELECT node_id, sum(bytes)::bigint FROM pg_shard.group_loads() GROUP BY node_id").fetchall())


def wait_all(jobs):
    return [meta.execute("SELECT pg_shard.wait_job(%s, '5 minutes')", (j,)).fetchone()[0] for j in jobs]


# Foreign keys between reference tables: the new node's copies must have
# them too.
meta.execute("DROP TABLE IF EXISTS rb_orders, rb_countries, rb_regions")
meta.execute("CREATE TABLE rb_regions (code text PRIMARY KEY)")
meta.execute("CREATE TABLE rb_countries (code text PRIMARY KEY, region text)")
meta.execute("INSERT INTO rb_regions VALUES ('EU'), ('NA')")
meta.execute("INSERT INTO rb_countries VALUES ('DE', 'EU'), ('US', 'NA')")
for table in ("rb_regions", "rb_countries"):
    meta.execute("SELECT pg_shard.create_reference_table(%s)", (table,))
meta.execute("ALTER TABLE rb_countries ADD FOREIGN KEY (region) REFERENCES rb_regions")

workers_before = meta.execute("SELECT count(*) FROM pg_shard.node WHERE state = 'active'").fetchone()[0]
node = meta.execute("SELECT pg_shard.add_node('127.0.0.1', %s)", (new_port,)).fetchone()[0]

newcomer = psycopg.connect(dsn.format(new_port), autocommit=True)
keys_query = ("SELECT k.conrelid::regclass::text, k.confrelid::regclass::text FROM pg_constraint k "
              "JOIN pg_class c ON c.oid = k.conrelid WHERE k.contype = 'f' AND c.relname ~ %s")
keys = newcomer.execute(keys_query, ("^rb_countries_",)).fetchall()
check(f"the new node's reference copies have their foreign keys ({keys})",
      len(keys) == 1 and keys[0][1].startswith("rb_regions_"))
newcomer.close()
before = bytes_by_node()
total = sum(before.values())
plan = meta.execute("SELECT * FROM pg_shard.rebalance()").fetchall()
planned_bytes = sum(r[3] for r in plan)
check(f"dry run plans moves onto the new node only ({len(plan)} moves, {planned_bytes} of {total} bytes) "
      "and queues nothing",
      plan and all(r[2] == node and r[6] is None for r in plan)
      and meta.execute("SELECT count(*) FROM pg_shard.job WHERE state IN ('queued', 'running')").fetchone()[0] == 0)
share = planned_bytes / total
expected = 1 / (workers_before + 1)
check(f"about 1/(N+1) of the bytes move ({share:.2f}, N = {workers_before}: {expected:.2f})",
      abs(share - expected) < 0.15)
# Within a movement budget: a number of moves, a number of bytes.
first = meta.execute("SELECT * FROM pg_shard.rebalance(max_moves => 1)").fetchall()
check(f"max_moves => 1 plans one move, the first of the full plan ({[r[:4] for r in first]})",
      len(first) == 1 and first[0][:4] == plan[0][:4])
# (Busiest over median node: with an empty node joining two full ones the
# median is a full node, so the ratio shows little before the plan.)
check(f"each planned move shows the busiest/median ratio before and after it "
      f"({[(float(r[4]), float(r[5])) for r in plan]})",
      all(r[4] is not None and r[5] is not None and r[4] >= 1 and r[5] >= 1 for r in plan)
      and all(a[5] == b[4] for a, b in zip(plan, plan[1:])))
none = meta.execute("SELECT * FROM pg_shard.rebalance(max_bytes => 1)").fetchall()
check(f"a byte budget below any group's size plans nothing ({len(none)} moves)", not none)
budget = planned_bytes // 2
within = meta.execute("SELECT * FROM pg_shard.rebalance(max_bytes => %s)", (budget,)).fetchall()
check(f"max_bytes => {budget} plans {len(within)} moves of {sum(r[3] for r in within)} bytes, within it",
      within and sum(r[3] for r in within) <= budget)
for bad, sqlstate in (("SELECT * FROM pg_shard.rebalance(strategy => 'bogus')", "22023"),
                      ("SELECT * FROM pg_shard.rebalance(max_moves => -1)", "22023")):
    try:
        meta.execute(bad)
        check(f"{bad} is refused", False)
    except psycopg.Error as e:
        check(f"{bad} is refused ({e.sqlstate}: {str(e).splitlines()[0]})", e.sqlstate == sqlstate)
moves = meta.execute("SELECT * FROM pg_shard.rebalance(dry_run => false)").fetchall()
states = wait_all([r[6] for r in moves])
after = bytes_by_node()
spread = (max(after.values()) - min(after.values())) / total
check(f"{len(moves)} moves done ({set(states)}); bytes per node {after} (spread {spread:.2f})",
      states and all(s == "done" for s in states) and after.get(node, 0) > 0)
check("every row still there after rebalancing",
      meta.execute("SELECT count(*), sum(id) FROM spread_items").fetchone() == rows)
again = meta.execute("SELECT * FROM pg_shard.rebalance()").fetchall()
check(f"balanced: a second dry run plans nothing ({len(again)} moves)", not again)

# A distributed table's foreign key to a reference table, on a shard moved
# to the new node.
meta.execute("CREATE TABLE rb_orders (id bigint PRIMARY KEY, country text)")
meta.execute("INSERT INTO rb_orders SELECT g, CASE WHEN g % 2 = 0 THEN 'DE' ELSE 'US' END "
             "FROM generate_series(1, 100) g")
meta.execute("SELECT pg_shard.create_distributed_table('rb_orders', 'id', shard_count => 2, "
             "colocate_with => 'none')")
meta.execute("ALTER TABLE rb_orders ADD FOREIGN KEY (country) REFERENCES rb_countries")
newcomer = psycopg.connect(dsn.format(new_port), autocommit=True)
moving = meta.execute("SELECT shard_id FROM pg_shard.shards WHERE table_name = 'rb_orders'::regclass "
                      "ORDER BY range_start LIMIT 1").fetchone()[0]
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (moving, node)).fetchone()[0]
state = meta.execute("SELECT pg_shard.wait_job(%s, '5 minutes')", (job,)).fetchone()[0]
keys = newcomer.execute(keys_query, ("^rb_orders_",)).fetchall()
check(f"a shard moved there keeps its foreign key to the node's copy ({state}: {keys})",
      state == "done" and len(keys) == 1 and keys[0][1].startswith("rb_countries_"))
try:
    meta.execute("INSERT INTO rb_orders SELECT g, 'XX' FROM generate_series(101, 200) g")
    refused = False
except psycopg.errors.ForeignKeyViolation:
    refused = True
check("rows are still checked against the node's copy", refused)
newcomer.close()

# Draining the node moves every shard off it and keeps new ones away.
drained = meta.execute("SELECT * FROM pg_shard.drain_node(%s)", (node,)).fetchall()
states = wait_all([r[2] for r in drained])
left = meta.execute("SELECT count(*) FROM pg_shard.shards WHERE node_id = %s AND table_name <> ALL "
                    "(SELECT table_rel FROM pg_shard.logical_table WHERE kind = 'reference')", (node,)).fetchone()[0]
check(f"drain_node moved {len(drained)} shard groups off ({set(states)}); {left} left; node inactive",
      all(s == "done" for s in states) and left == 0
      and meta.execute("SELECT state FROM pg_shard.node WHERE node_id = %s", (node,)).fetchone()[0] == "inactive")
check("every row still there after draining",
      meta.execute("SELECT count(*), sum(id) FROM spread_items").fetchone() == rows)
for bad, sqlstate in (("SELECT * FROM pg_shard.drain_node(9999)", "42704"),):
    try:
        meta.execute(bad)
        check(f"{bad} is refused", False)
    except psycopg.Error as e:
        check(f"{bad} is refused ({e.sqlstate}: {str(e).splitlines()[0]})", e.sqlstate == sqlstate)
meta.execute("DROP TABLE spread_items, rb_orders, rb_countries, rb_regions")
sys.exit(1 if check.failures else 0)
