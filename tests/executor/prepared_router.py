#!/usr/bin/env python3
"""Router statements prepared through the protocol, as drivers prepare them.

After five runs the plan cache keeps a generic plan, whose key is a
parameter: the router then picks the shard from the parameter's value each
time the statement runs, and the worker keeps the statement prepared too.
Every answer is compared with the same statement over postgres_fdw (the
router turned off), for keys on every shard.

Usage: prepared_router.py METADATA_PORT DATABASE
"""
import os
import sys

import psycopg

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect  # noqa: E402

port, database = sys.argv[1], sys.argv[2]
dsn = f"host=127.0.0.1 port={port} dbname={database} user=postgres"
check = Checks("prepared router")

conn = connect(dsn)
fdw = connect(dsn)
fdw.execute("SET pg_shard.enable_router_executor = off")
fdw.execute("SET pg_shard.enable_pushdown_executor = off")
conn.execute("DROP TABLE IF EXISTS pr_orders, pr_items")
conn.execute("CREATE TABLE pr_orders (id bigint PRIMARY KEY, v int NOT NULL, note text)")
conn.execute("CREATE TABLE pr_items (order_id bigint, line int, qty int, PRIMARY KEY (order_id, line))")
conn.execute("INSERT INTO pr_orders SELECT g, g, 'n' || g FROM generate_series(1, 200) g")
conn.execute("INSERT INTO pr_items SELECT g, l, l FROM generate_series(1, 200) g, generate_series(1, 3) l")
conn.execute("SELECT pg_shard.create_distributed_table('pr_orders', 'id', shard_count => 8)")
conn.execute("SELECT pg_shard.create_distributed_table('pr_items', 'order_id', colocate_with => 'pr_orders')")

read = "SELECT v, note FROM pr_orders WHERE id = %s"
join = ("SELECT o.id, sum(i.qty) FROM pr_orders o JOIN pr_items i ON i.order_id = o.id "
        "WHERE o.id = %s GROUP BY o.id")
write = "UPDATE pr_orders SET v = v + 1 WHERE id = %s RETURNING v"

mismatches = []
for key in list(range(1, 201)) + [None, 999999]:
    for sql in (read, join):
        got = conn.execute(sql, (key,), prepare=True).fetchall()
        want = fdw.execute(sql, (key,)).fetchall()
        if got != want:
            mismatches.append((sql, key, got, want))
check(f"reads of 202 keys (every shard, NULL, a missing key) agree with postgres_fdw ({mismatches[:2]})",
      not mismatches)

updated = [conn.execute(write, (key,), prepare=True).fetchone()[0] for key in range(1, 201)]
check("prepared updates of every key return the new values", updated == [k + 1 for k in range(1, 201)])
check("and the rows hold them",
      fdw.execute("SELECT sum(v) FROM pr_orders").fetchone()[0] == sum(k + 1 for k in range(1, 201)))

plans = conn.execute(
    "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE 'SELECT v, note%'"
).fetchone()
check(f"the plan cache settled on a generic plan ({plans})", plans and plans[0] > 100)

# A statement across shard groups with a parameter and an `IN (SELECT …)`
# (whose own parameter is part of the statement) is pushed down too.
across = ("SELECT count(*), sum(qty) FROM pr_items WHERE qty > %s "
          "AND order_id IN (SELECT id FROM pr_orders WHERE v < 50)")
plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (COSTS OFF) " + across, (1,)).fetchall())
check("a parameter beside an IN sublink keeps the statement on the pushdown class",
      "pg_shard Pushdown" in plan)
got = [conn.execute(across, (q,), prepare=True).fetchone() for q in (0, 1, 2, 3)]
want = [fdw.execute(across, (q,)).fetchone() for q in (0, 1, 2, 3)]
check(f"and its answers agree with postgres_fdw ({got}, {want})", got == want)

# Parameters that choose a condition's form (as an intermediate statement's
# restriction does): the workers get only the form that applies, so a
# sublink left alone becomes a condition of its own, which their planner
# can make a join.
either = ("SELECT count(*), sum(qty) FROM pr_items WHERE (%s OR qty > 1) "
          "AND (%s OR order_id IN (SELECT id FROM pr_orders WHERE v < 50))")
plan = "\n".join(r[0] for r in conn.execute("EXPLAIN (VERBOSE, COSTS OFF) " + either,
                                            (True, False)).fetchall())
conditions = [line.strip() for line in plan.splitlines() if "WHERE" in line and "order_id" in line]
check(f"a parameter's true OR and false OR are folded before the workers get the statement "
      f"({conditions[:1]})",
      "pg_shard Pushdown" in plan and conditions
      and all(c.startswith("WHERE (order_id IN") for c in conditions)
      and " OR " not in plan and "qty > " not in plan)
flags = [(True, True), (True, False), (False, True), (False, False), (None, False), (True, None)]
got = [conn.execute(either, f, prepare=True).fetchone() for f in flags]
want = [fdw.execute(either, f).fetchone() for f in flags]
check(f"and its answers for every flag, NULL too, agree with postgres_fdw ({got}, {want})", got == want)

try:
    conn.execute("INSERT INTO pr_orders (id, v) VALUES (%s, 1)", (None,), prepare=True)
    inserted_null = "no error"
except psycopg.Error as e:
    inserted_null = e.sqlstate
check(f"a NULL key is refused ({inserted_null})", inserted_null != "no error")

conn.execute("DROP TABLE pr_items, pr_orders")
conn.close()
fdw.close()
sys.exit(1 if check.failures else 0)
