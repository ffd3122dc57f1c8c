#!/usr/bin/env python3
"""A shard move or split under write load: writers through the coordinator
and through the metadata node insert rows and add to balances while a shard
group moves to another node (or splits in two; or moves, takes writes on its
new node, and is reverted to its old one; or splits, takes writes on its
halves, and is reverted to one shard; or isolates one account's keyspace id
on a shard of its own on the other node, by two splits and a move). Afterwards
every acknowledged write is present exactly once. Prints the longest write latency seen during
the job (the write pause), its duration and its copy rate.
Usage: under_load.py METADATA_PORT COORDINATOR_PORT DATABASE [ROWS [move|split|revert|split-revert|isolate]]"""
import sys
import threading
import time

import psycopg
from tap import Checks

metadata_port, coordinator_port, database = sys.argv[1], sys.argv[2], sys.argv[3]
rows = int(sys.argv[4]) if len(sys.argv) > 4 else 50000
kind = sys.argv[5] if len(sys.argv) > 5 else "move"
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks(f"{kind} under load")


meta = psycopg.connect(dsn.format(metadata_port), autocommit=True)
meta.execute("DROP TABLE IF EXISTS load_entries, load_accounts")
meta.execute("CREATE TABLE load_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL, pad text)")
meta.execute("CREATE TABLE load_entries (account bigint NOT NULL, entry bigint NOT NULL, "
             "amount int NOT NULL, PRIMARY KEY (account, entry))")
meta.execute("INSERT INTO load_accounts SELECT g, 0, repeat('x', 200) FROM generate_series(1, %s) g", (rows,))
meta.execute("SELECT pg_shard.create_distributed_table('load_accounts', 'id', shard_count => 4, colocate_with => 'none')")
meta.execute("SELECT pg_shard.create_distributed_table('load_entries', 'account', colocate_with => 'load_accounts')")
time.sleep(1)  # the coordinator hears of the new tables (NOTIFY)
shard, source, target, first_start, first_end = meta.execute(
    "SELECT s.shard_id, s.node_id, (SELECT min(node_id) FROM pg_shard.node n "
    "WHERE n.node_id <> s.node_id AND n.state = 'active'), s.range_start, s.range_end "
    "FROM pg_shard.shards s WHERE s.table_name = 'load_accounts'::regclass "
    "ORDER BY s.range_start LIMIT 1").fetchone()

stop = threading.Event()
lock = threading.Lock()
acknowledged = []        # (account, entry, amount)
errors = []
latencies = []           # (start, seconds)


def writer(name, port, first_entry):
    conn = psycopg.connect(dsn.format(port), autocommit=True)
    entry = first_entry
    account = 0
    while not stop.is_set():
        account = account % rows + 1
        entry += 1
        started = time.monotonic()
        try:
            with conn.transaction():
                conn.execute("UPDATE load_accounts SET balance = balance + 1 WHERE id = %s", (account,))
                conn.execute("INSERT INTO load_entries VALUES (%s, %s, 1)", (account, entry))
            ok = True
        except psycopg.Error as e:
            ok = False
            with lock:
                errors.append(f"{name}: {e.sqlstate} {str(e).splitlines()[0]}")
        elapsed = time.monotonic() - started
        with lock:
            latencies.append((started, elapsed))
            if ok:
                acknowledged.append((account, entry, 1))
        # Accounts 1.. are spread over every shard: stride to reach all.
        account += 7919


threads = [threading.Thread(target=writer, args=(f"coordinator-{i}", coordinator_port, i * 10**9), daemon=True)
           for i in range(3)]
threads.append(threading.Thread(target=writer, args=("metadata", metadata_port, 9 * 10**9), daemon=True))
for t in threads:
    t.start()
time.sleep(2)
reverting = kind in ("revert", "split-revert")
meta.execute("SET pg_shard.move_drop_delay = " + ("'1h'" if reverting else "0"))
move_started = time.monotonic()
tenant = 7
if kind in ("split", "split-revert"):
    job = meta.execute("SELECT pg_shard.split_shard(%s)", (shard,)).fetchone()[0]
elif kind == "isolate":
    # To the node that does not hold the account's shard now.
    target = meta.execute(
        "SELECT min(n.node_id) FROM pg_shard.node n WHERE n.state = 'active' AND n.node_id <> "
        "(SELECT s.node_id FROM pg_shard.shards s WHERE s.table_name = 'load_accounts'::regclass "
        " AND pg_shard.keyspace_id(%s::bigint) BETWEEN s.range_start AND s.range_end)",
        (tenant,)).fetchone()[0]
    job = meta.execute("SELECT pg_shard.isolate_tenant('load_accounts', %s::bigint, target_node => %s)",
                       (tenant, target)).fetchone()[0]
else:
    job = meta.execute("SELECT pg_shard.move_shard(%s, %s)", (shard, target)).fetchone()[0]
if reverting:
    # Moved (split): writes go to the new node (the halves) for a while,
    # and back to the old copy by reverse replication; then the job is
    # reverted.
    deadline = time.monotonic() + 300
    while meta.execute("SELECT phase FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()[0] \
            != "reverse_replicating" and time.monotonic() < deadline:
        time.sleep(0.1)
    if kind == "revert":
        moved_to = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
        check(f"the shard moved to the target first (node {moved_to})", moved_to == target)
    else:
        halves = meta.execute(
            "SELECT count(*) FROM pg_shard.shards s WHERE s.table_name = 'load_accounts'::regclass "
            "AND s.range_start BETWEEN %s AND %s", (first_start, first_end)).fetchone()[0]
        check(f"the shard became two first ({halves})", halves == 2)
    # The old copy receives the new owner's writes, but stays retired: the
    # cutover activated the new side only.
    source_port = meta.execute("SELECT port FROM pg_shard.node WHERE node_id = %s", (source,)).fetchone()[0]
    with psycopg.connect(dsn.format(source_port), autocommit=True) as old_node:
        old_states = old_node.execute(
            "SELECT state FROM pg_shard.local_shard WHERE shard_id = %s", (shard,)).fetchall()
    check(f"the old copy stays retired after the cutover ({old_states})", old_states == [("retired",)])
    time.sleep(3)
    reverted = meta.execute("SELECT pg_shard.revert_job(%s)", (job,)).fetchone()[0]
    check("revert_job accepted the request", reverted is True)
state = meta.execute("SELECT pg_shard.wait_job(%s, '5 minutes')", (job,)).fetchone()[0]
move_ended = time.monotonic()
time.sleep(2)
stop.set()
for t in threads:
    t.join(30)

check(f"job {job} ended done ({state})", state == "done")
if kind == "split-revert":
    phase, revert_ms = meta.execute(
        "SELECT phase, resources->>'revert_ms' FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()
    back = meta.execute(
        "SELECT array_agg(shard_id ORDER BY shard_id) FROM pg_shard.shards s "
        "WHERE s.table_name = 'load_accounts'::regclass AND s.range_start BETWEEN %s AND %s",
        (first_start, first_end)).fetchone()[0]
    check(f"the job ended reverted ({phase}; pause {revert_ms}), the old shard back in one piece ({back})",
          phase == "reverted" and back == [shard])
elif kind == "revert":
    phase, revert_ms = meta.execute(
        "SELECT phase, resources->>'revert_ms' FROM pg_shard.job WHERE job_id = %s", (job,)).fetchone()
    back = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
    check(f"the job ended reverted ({phase}; pause {revert_ms}), the shard back on its old node ({back})",
          phase == "reverted" and back == source)
elif kind == "isolate":
    isolated = meta.execute(
        "SELECT s.table_name::text, s.range_start = s.range_end, s.node_id FROM pg_shard.shards s "
        "WHERE s.table_name IN ('load_accounts'::regclass, 'load_entries'::regclass) "
        "AND pg_shard.keyspace_id(%s::bigint) BETWEEN s.range_start AND s.range_end ORDER BY 1",
        (tenant,)).fetchall()
    check(f"account {tenant} has a shard of its own on node {target} in both tables ({isolated})",
          isolated == [("load_accounts", True, target), ("load_entries", True, target)])
    steps = meta.execute("SELECT array_agg(kind || ':' || state ORDER BY job_id) FROM pg_shard.job "
                         "WHERE job_id >= %s", (job,)).fetchone()[0]
    check(f"by two splits and a move ({steps})", steps == ["split:done", "split:done", "move:done"])
    again = meta.execute("SELECT pg_shard.isolate_tenant('load_accounts', %s::bigint, target_node => %s)",
                         (tenant, target)).fetchone()[0]
    check("isolating it again queues nothing", again is None)
elif kind == "split":
    halves = meta.execute(
        "SELECT count(*), count(DISTINCT node_id) FROM pg_shard.shards s WHERE s.table_name = 'load_accounts'::regclass "
        "AND s.range_start BETWEEN %s AND %s", (first_start, first_end)).fetchone()
    check(f"the shard became two on its node ({halves})", tuple(halves) == (2, 1))
else:
    moved = meta.execute("SELECT node_id FROM pg_shard.shards WHERE shard_id = %s", (shard,)).fetchone()[0]
    check("the shard is on the target", moved == target)
# Every acknowledged entry exactly once; balances equal acknowledged adds.
entries = meta.execute("SELECT account, entry, count(*) FROM load_entries GROUP BY 1, 2").fetchall()
present = {(a, e): n for a, e, n in entries}
missing = [(a, e) for a, e, _ in acknowledged if present.get((a, e)) != 1]
check(f"{len(acknowledged)} acknowledged entries, each present exactly once ({len(missing)} not)", not missing)
expected_total = len(acknowledged)
total_balance = meta.execute("SELECT sum(balance) FROM load_accounts").fetchone()[0]
total_entries = meta.execute("SELECT count(*) FROM load_entries").fetchone()[0]
check(f"balances equal the entries ({total_balance} = {total_entries}) and the acknowledged writes ({expected_total})",
      total_balance == total_entries == expected_total)
coordinator_errors = [e for e in errors if e.startswith("coordinator")]
check(f"writes through the coordinator saw no error ({coordinator_errors[:3]})", not coordinator_errors)
leftovers = []
for port in [r[0] for r in meta.execute("SELECT port FROM pg_shard.node").fetchall()]:
    with psycopg.connect(dsn.format(port), autocommit=True) as worker:
        leftovers += worker.execute(
            "SELECT 'slot ' || slot_name FROM pg_replication_slots UNION ALL "
            "SELECT 'publication ' || pubname FROM pg_publication UNION ALL "
            "SELECT 'subscription ' || subname FROM pg_subscription").fetchall()
check(f"no replication object left behind ({leftovers})", not leftovers)

during = [seconds for started, seconds in latencies if move_started <= started <= move_ended]
duration, copied = meta.execute(
    "SELECT extract(epoch FROM finished_at - started_at), bytes_copied FROM pg_shard.job WHERE job_id = %s",
    (job,)).fetchone()
metadata_errors = [e for e in errors if e.startswith("metadata")]
print(f"# {kind}: {float(duration):.2f} s, {copied / 1e6:.1f} MB copied "
      f"({copied / 1e6 / float(duration):.1f} MB/s); {len(during)} writes during the {kind}, "
      f"longest {max(during) * 1000:.0f} ms; writes through the metadata node refused: {len(metadata_errors)}"
      + (f" (e.g. {metadata_errors[0]})" if metadata_errors else ""))
meta.execute("DROP TABLE load_entries, load_accounts")
sys.exit(1 if check.failures else 0)
