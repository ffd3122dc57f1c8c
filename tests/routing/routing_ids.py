#!/usr/bin/env python3
"""Self-routing ids through the coordinator and across nodes.

1. Uniqueness: four sessions, two on the metadata node and two on a worker,
   make ids for the same key (so the same prefix) at once; every id is
   distinct, carries the key's prefix, and the node's generator number in
   the sequence's low 5 bits.
2. Routing: orders distributed by customer, order ids from
   pg_shard.next_id, the column declared with pg_shard.set_routing_id. A
   read and an update by order id through the coordinator go to exactly one
   shard, the one owning the id's prefix (the coordinator's SHOW SHARDS
   counts one more statement there, and SHOW STATS none more on the
   metadata node), before and after a split of a shard and a move of one.

Usage: routing_ids.py METADATA_PORT COORDINATOR_PORT DATABASE"""
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "moves"))
from tap import Checks, connect  # noqa: E402

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("routing ids")
table = "rid_route_orders"

meta = connect(dsn.format(metadata_port))
meta.execute(f"DROP TABLE IF EXISTS {table}")
meta.execute(f"CREATE TABLE {table} (customer_id bigint NOT NULL, order_id bigint NOT NULL, "
             "amount int NOT NULL, PRIMARY KEY (customer_id, order_id))")
meta.execute(f"SELECT pg_shard.create_distributed_table('{table}', 'customer_id', "
             "shard_count => 4, colocate_with => 'none')")
meta.execute(f"INSERT INTO {table} SELECT c, pg_shard.next_id('{table}', c), n "
             "FROM generate_series(1::bigint, 300) c, generate_series(1, 4) n")
meta.execute(f"SELECT pg_shard.set_routing_id('{table}', 'order_id')")
ports = dict(meta.execute("SELECT node_id, port FROM pg_shard.node").fetchall())

# 1. Ids made at once on two nodes for one key.
worker_id = min(ports)
worker = connect(dsn.format(ports[worker_id]))
shard_table = worker.execute(
    "SELECT shard_rel::text FROM pg_shard.local_shard WHERE shard_rel::text LIKE %s LIMIT 1",
    (table + "%",)).fetchone()[0]
key = 42
prefix = meta.execute("SELECT pg_shard.key_prefix(%s::bigint)", (key,)).fetchone()[0]
made = {}
errors = []
start = threading.Barrier(4)


def make(name, port, relation):
    try:
        conn = connect(dsn.format(port))
        start.wait()
        rows = conn.execute("SELECT pg_shard.next_id(%s, %s::bigint) FROM generate_series(1, 30000)",
                            (relation, key)).fetchall()
        made[name] = [r[0] for r in rows]
    except Exception as e:  # noqa: BLE001 — reported below
        errors.append(f"{name}: {e}")


threads = [threading.Thread(target=make, args=(f"metadata {i}", metadata_port, table)) for i in range(2)]
threads += [threading.Thread(target=make, args=(f"worker {i}", ports[worker_id], shard_table)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
check("four sessions on two nodes made their ids without error", not errors and len(made) == 4)
every = [i for ids in made.values() for i in ids]
check(f"all {len(every)} ids are distinct", len(every) == 120000 and len(set(every)) == len(every))
check("every id carries the key's prefix", all((i >> 12) & 1023 == prefix for i in every))
generators = {name: {i & 31 for i in ids} for name, ids in made.items()}
check("the metadata node's ids have generator 0, the worker's its node id",
      generators.get("metadata 0") == {0} and generators.get("metadata 1") == {0}
      and generators.get("worker 0") == {worker_id} and generators.get("worker 1") == {worker_id})
now_ms = int(time.time() * 1000) - 1767225600000
check("their times are now (within a minute)", all(abs((i >> 22) - now_ms) < 60000 for i in every))

# 2. Routing by id through the coordinator.
time.sleep(1)  # the coordinator hears of the new map
client = connect(dsn.format(coordinator_port))
# (psycopg would prepare a statement after 5 runs, which the coordinator
# describes once on the metadata node: counted separately below.)
client.prepare_threshold = None
admin = client


def counters():
    shards = {int(row[1]): int(row[6]) for row in admin.execute("SHOW SHARDS", prepare=False).fetchall()
              if row[0].endswith("." + table)}
    servers = {row[0]: int(row[1]) for row in admin.execute("SHOW STATS", prepare=False).fetchall()}
    return shards, servers


def owner_of(order_id):
    return meta.execute(
        "SELECT shard_id FROM pg_shard.shards WHERE table_name = %s::regclass "
        "AND pg_shard.id_keyspace_start(%s) BETWEEN range_start AND range_end",
        (table, order_id)).fetchone()[0]


def routed_reads(stage):
    orders = meta.execute(f"SELECT order_id, customer_id, amount FROM {table} ORDER BY order_id "
                          "LIMIT 40").fetchall()
    wrong_rows, wrong_shards, scattered = 0, 0, 0
    # A statement text new to the coordinator is described once on the
    # metadata node (the server statement cache); count what follows.
    client.execute(f"SELECT customer_id, amount FROM {table} WHERE order_id = %s", (orders[0][0],))
    client.execute(f"UPDATE {table} SET amount = amount WHERE order_id = %s", (orders[0][0],))
    for order_id, customer_id, amount in orders:
        shards_before, servers_before = counters()
        row = client.execute(f"SELECT customer_id, amount FROM {table} WHERE order_id = %s",
                             (order_id,)).fetchone()
        updated = client.execute(f"UPDATE {table} SET amount = amount WHERE order_id = %s",
                                 (order_id,)).rowcount
        shards_after, servers_after = counters()
        if row != (customer_id, amount) or updated != 1:
            wrong_rows += 1
        grown = {s: shards_after.get(s, 0) - shards_before.get(s, 0) for s in shards_after}
        owner = owner_of(order_id)
        if grown.get(owner) != 2 or sum(grown.values()) != 2:
            wrong_shards += 1
        # SHOW SHARDS and SHOW STATS themselves are answered by the coordinator.
        if sum(servers_after.values()) - sum(servers_before.values()) != 2:
            scattered += 1
            print(f"# {stage}: order {order_id}: servers {servers_before} -> {servers_after}")
    # A prepared statement (named, run with binary-or-text parameters as
    # psycopg chooses) routes the same way once prepared.
    query = f"SELECT customer_id FROM {table} WHERE order_id = %s"
    client.execute(query, (orders[0][0],), prepare=True)
    for order_id, customer_id, _ in orders[:10]:
        shards_before, _ = counters()
        row = client.execute(query, (order_id,), prepare=True).fetchone()
        shards_after, _ = counters()
        grown = {s: shards_after.get(s, 0) - shards_before.get(s, 0) for s in shards_after}
        if row != (customer_id,):
            wrong_rows += 1
        if grown.get(owner_of(order_id)) != 1 or sum(grown.values()) != 1:
            wrong_shards += 1
    check(f"{stage}: 40 reads and updates by order id found their row", wrong_rows == 0)
    check(f"{stage}: each went to the one shard owning the id's prefix ({wrong_shards} did not)",
          wrong_shards == 0)
    check(f"{stage}: each was one statement to one server ({scattered} were not)", scattered == 0)


routed_reads("before any job")

meta.execute("SET pg_shard.move_drop_delay = 0")
shard = meta.execute("SELECT shard_id FROM pg_shard.shards WHERE table_name = %s::regclass "
                     "ORDER BY range_start LIMIT 1", (table,)).fetchone()[0]
job = meta.execute("SELECT pg_shard.split_shard(%s)", (shard,)).fetchone()[0]
meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,))
state, aligned = meta.execute("SELECT state, split_at %% 18014398509481984 = 0 FROM pg_shard.job "
                              "WHERE job_id = %s", (job,)).fetchone()
check("the split ended done, at a multiple of 2^54", state == "done" and aligned)
time.sleep(1)
routed_reads("after a split")

shard, node = meta.execute("SELECT shard_id, node_id FROM pg_shard.shards WHERE table_name = %s::regclass "
                           "ORDER BY range_start LIMIT 1", (table,)).fetchone()
target = next(n for n in sorted(ports) if n != node)
job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
meta.execute("SELECT pg_shard.wait_job(%s, '2 minutes')", (job,))
state = meta.execute("SELECT state FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0]
check("the move ended done", state == "done")
time.sleep(1)
routed_reads("after a move")

total, found = meta.execute(
    f"SELECT count(*), count(*) FILTER (WHERE (SELECT count(*) FROM {table} i "
    f"WHERE i.order_id = o.order_id) = 1) FROM {table} o").fetchone()
check(f"on the metadata node every order ({total}) is found by its id", total == 1200 and found == total)
meta.execute(f"DROP TABLE {table}")
sys.exit(1 if check.failures else 0)
