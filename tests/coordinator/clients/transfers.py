#!/usr/bin/env python3
"""Transactions on several nodes through coordinators: money moves between
accounts on different workers, and the total never changes.

1. A workload: clients through two coordinators move amounts between random
   accounts for a fixed time (two-phase commit whenever the two accounts
   live on different workers); deadlocks across nodes end in 40P01 and are
   retried. The total is checked at the end, and nothing is left prepared.
2. A coordinator SIGKILLed at each step of a two-phase commit (held there by
   PGSHARD_COORDINATOR_TEST_PAUSE): after pg_shard.recover_prepared_transactions()
   the transfer is there on both sides or on neither, as the step decides,
   and nothing is left prepared on any node.
3. A worker stopped in the middle of a transaction: a clear error, nothing
   half-committed.
4. Read after commit: once a client heard COMMIT on two nodes, another
   session sees both sides.

Usage: transfers.py METADATA_PORT COORDINATOR_PORT SECOND_COORDINATOR_PORT
       DATABASE CLUSTER_DIR COORDINATOR_BIN WORKER_PORTS(comma-separated)"""
import os
import random
import signal
import subprocess
import sys
import threading
import time

import psycopg
from tap import Checks

(metadata_port, first_port, second_port, database, cluster_dir, coordinator_bin,
 worker_ports) = sys.argv[1:8]
worker_ports = [int(p) for p in worker_ports.split(",")]
check = Checks("transfers")
ACCOUNTS = 200
START = 1000
CRASH_PORT = 28426


def connect(port, **kwargs):
    return psycopg.connect(f"host=127.0.0.1 port={port} dbname={database} user=postgres",
                           **kwargs)


def total():
    with connect(metadata_port, autocommit=True) as c:
        return c.execute("SELECT sum(balance), count(*) FROM transfer_accounts").fetchone()


def prepared_everywhere():
    """Prepared transactions left on any node of the cluster."""
    left = 0
    for port in [int(metadata_port)] + worker_ports:
        with connect(port, autocommit=True) as c:
            left += c.execute("SELECT count(*) FROM pg_prepared_xacts "
                              "WHERE database = current_database()").fetchone()[0]
    return left


def node_of(key):
    with connect(metadata_port, autocommit=True) as c:
        return c.execute(
            "SELECT node_id FROM pg_shard.shards WHERE table_name = 'transfer_accounts'::regclass "
            "AND pg_shard.keyspace_id(%s::bigint) BETWEEN range_start AND range_end",
            (key,)).fetchone()[0]


def setup():
    with connect(first_port, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS transfer_accounts")
        c.execute("CREATE TABLE transfer_accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)")
        c.execute("SELECT pg_shard.create_distributed_table('transfer_accounts', 'id', shard_count => 8)")
        c.execute("INSERT INTO transfer_accounts SELECT g, %s FROM generate_series(1, %s) g",
                  (START, ACCOUNTS))
    time.sleep(1)  # the coordinators hear of the new table


def transfer(conn, source, target, amount):
    with conn.transaction():
        conn.execute("UPDATE transfer_accounts SET balance = balance - %s WHERE id = %s",
                     (amount, source))
        conn.execute("UPDATE transfer_accounts SET balance = balance + %s WHERE id = %s",
                     (amount, target))


def workload(seconds=8, clients_per_coordinator=3):
    stats = {"committed": 0, "deadlocks": 0, "serialization": 0, "other": []}
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def client(port, seed):
        rng = random.Random(seed)
        with connect(port) as conn:
            while time.monotonic() < stop:
                source, target = rng.sample(range(1, ACCOUNTS + 1), 2)
                try:
                    transfer(conn, source, target, rng.randint(1, 50))
                    with lock:
                        stats["committed"] += 1
                except psycopg.errors.DeadlockDetected:
                    with lock:
                        stats["deadlocks"] += 1
                except psycopg.errors.SerializationFailure:
                    with lock:
                        stats["serialization"] += 1
                except psycopg.Error as e:
                    with lock:
                        stats["other"].append(f"{type(e).__name__}: {e}")
                    return

    threads = [threading.Thread(target=client, args=(port, i * 7919 + k))
               for k, port in enumerate([first_port, second_port])
               for i in range(clients_per_coordinator)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stats


def start_crash_coordinator(step, pause_ms):
    env = dict(os.environ, PGSHARD_COORDINATOR_TEST_PAUSE=f"{step}:{pause_ms}")
    log = open(os.path.join(cluster_dir, f"coordinator-crash-{step}.log"), "w")
    process = subprocess.Popen(
        [coordinator_bin, "--listen", f"127.0.0.1:{CRASH_PORT}", "--metadata",
         f"127.0.0.1:{metadata_port}", "--metrics-listen", "", "--server-socket-dir", cluster_dir],
        env=env, stdout=log, stderr=subprocess.STDOUT)
    for _ in range(100):
        try:
            with connect(CRASH_PORT, autocommit=True) as c:
                if c.execute("SHOW SHARDS").fetchall():
                    break
        except psycopg.Error:
            pass
        time.sleep(0.1)
    time.sleep(0.5)
    return process, log


def two_accounts_on_two_nodes():
    first = 1
    first_node = node_of(first)
    for candidate in range(2, ACCOUNTS + 1):
        if node_of(candidate) != first_node:
            return first, candidate
    raise RuntimeError("every account on one node")


def balances(keys):
    with connect(metadata_port, autocommit=True) as c:
        rows = c.execute("SELECT id, balance FROM transfer_accounts WHERE id = ANY(%s) ORDER BY id",
                         (list(keys),)).fetchall()
    return dict(rows)


def crash_at(step, commits):
    source, target = two_accounts_on_two_nodes()
    before = balances([source, target])
    sum_before = total()
    process, log = start_crash_coordinator(step, 4000)
    outcome = {}

    def client():
        try:
            with connect(CRASH_PORT) as conn:
                transfer(conn, source, target, 10)
            outcome["result"] = "committed"
        except psycopg.Error as e:
            outcome["result"] = f"{type(e).__name__}"

    thread = threading.Thread(target=client)
    thread.start()
    # The coordinator logs when it reaches the pause.
    deadline = time.monotonic() + 10
    reached = False
    while time.monotonic() < deadline:
        with open(log.name) as f:
            if "test pause in a two-phase commit" in f.read():
                reached = True
                break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.wait()
    log.close()
    thread.join(timeout=10)
    with connect(metadata_port, autocommit=True) as c:
        c.execute("SELECT pg_shard.recover_prepared_transactions()")
    after = balances([source, target])
    expected = ({source: before[source] - 10, target: before[target] + 10} if commits else before)
    check(f"coordinator killed {step.replace('_', ' ')}: reached the step", reached)
    check(f"...the client got an error, not COMMIT ({outcome.get('result')})",
          outcome.get("result") not in (None, "committed"))
    check(f"...after recovery the transfer is {'on both sides' if commits else 'on neither side'}",
          after == expected, f"before {before}, after {after}")
    check("...the total is unchanged", total() == sum_before, f"{sum_before} -> {total()}")
    check("...nothing is left prepared on any node", prepared_everywhere() == 0)


def worker_down_mid_transaction():
    source, target = two_accounts_on_two_nodes()
    before = balances([source, target])
    target_node = node_of(target)
    with connect(metadata_port, autocommit=True) as c:
        port = c.execute("SELECT port FROM pg_shard.node WHERE node_id = %s",
                         (target_node,)).fetchone()[0]
    data = os.path.join(cluster_dir, f"worker{worker_ports.index(port) + 1}")
    error = None
    with connect(first_port) as conn:
        conn.execute("UPDATE transfer_accounts SET balance = balance - 10 WHERE id = %s", (source,))
        conn.execute("UPDATE transfer_accounts SET balance = balance + 10 WHERE id = %s", (target,))
        subprocess.run(["runuser", "-u", "postgres", "--", "pg_ctl", "-D", data, "-m", "immediate",
                        "stop"], cwd="/", check=True, capture_output=True)
        try:
            conn.execute("COMMIT")
        except psycopg.Error as e:
            error = e
    subprocess.run(["runuser", "-u", "postgres", "--", "pg_ctl", "-D", data, "-w", "-l",
                    os.path.join(data, "log"), "start"], cwd="/", check=True, capture_output=True)
    check("a worker down before COMMIT: the client gets a connection error",
          error is not None and error.sqlstate == "08006", repr(error))
    time.sleep(1)
    check("...and nothing of the transaction committed", balances([source, target]) == before)
    with connect(metadata_port, autocommit=True) as c:
        c.execute("SELECT pg_shard.recover_prepared_transactions()")
    check("...nothing left prepared", prepared_everywhere() == 0)
    # The coordinators' pooled connections to the restarted worker are dead:
    # the next transfers (two-phase commit) get new ones.
    try:
        for port in (first_port, second_port):
            with connect(port) as conn:
                transfer(conn, source, target, 1)
                transfer(conn, target, source, 1)
        error = None
    except psycopg.Error as e:
        error = e
    check("...after the worker is back, transfers across nodes commit at once", error is None,
          repr(error))


def disconnect_mid_transaction():
    """A client that goes away in the middle of a transaction on two nodes:
    nothing of it stays, and its row locks are gone at once."""
    a, b = two_accounts_on_two_nodes()
    before = balances([a, b])
    conn = connect(first_port)
    conn.execute("UPDATE transfer_accounts SET balance = balance - 7 WHERE id = %s", (a,))
    conn.execute("UPDATE transfer_accounts SET balance = balance + 7 WHERE id = %s", (b,))
    conn.pgconn.finish()  # the socket closes: no ROLLBACK, no Terminate
    time.sleep(0.5)
    try:
        with connect(second_port) as other:
            other.execute("SET lock_timeout = '2s'")
            transfer(other, a, b, 1)
            transfer(other, b, a, 1)
        error = None
    except psycopg.Error as e:
        error = e
    check("a client gone mid-transaction on two nodes: nothing of it stays, its locks are free",
          error is None and balances([a, b]) == before, f"{error!r}, {before} -> {balances([a, b])}")


def batch_across_nodes():
    """A pipeline (one Sync) whose statements need two nodes inside a
    transaction: refused before anything runs, with the coordinator's hint."""
    a, b = two_accounts_on_two_nodes()
    before = balances([a, b])
    error = None
    with connect(first_port) as conn:
        conn.execute("UPDATE transfer_accounts SET balance = balance WHERE id = %s", (a,))
        try:
            with conn.pipeline():
                conn.execute("UPDATE transfer_accounts SET balance = balance - 1 WHERE id = %s", (a,))
                conn.execute("UPDATE transfer_accounts SET balance = balance + 1 WHERE id = %s", (b,))
        except psycopg.Error as e:
            error = e
        conn.rollback()
    check("a pipeline needing two nodes in a transaction: 0A000 with a hint, nothing changed",
          error is not None and error.sqlstate == "0A000" and balances([a, b]) == before,
          repr(error))


def deadlock_across_nodes():
    """Two transactions lock an account each on different workers, then
    each waits for the other's: no node sees the cycle; the coordinator's
    timeout ends one with 40P01 and the other commits."""
    a, b = two_accounts_on_two_nodes()
    before = balances([a, b])
    outcomes = {}
    locked = threading.Barrier(2)

    def client(name, port, first, second):
        try:
            with connect(port) as conn:
                with conn.transaction():
                    conn.execute("UPDATE transfer_accounts SET balance = balance - 1 WHERE id = %s",
                                 (first,))
                    locked.wait()
                    conn.execute("UPDATE transfer_accounts SET balance = balance + 1 WHERE id = %s",
                                 (second,))
            outcomes[name] = "committed"
        except psycopg.Error as e:
            outcomes[name] = e.sqlstate

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=("one", first_port, a, b)),
               threading.Thread(target=client, args=("two", second_port, b, a))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    elapsed = time.monotonic() - started
    check(f"a deadlock across two nodes ends: one transaction gets 40P01, the other commits "
          f"({sorted(outcomes.values())}, {elapsed:.1f} s)",
          sorted(outcomes.values()) == ["40P01", "committed"] and elapsed < 15)
    after = balances([a, b])
    check("...the committed one's transfer is there, the other's not",
          sum(after.values()) == sum(before.values()) and after != before, f"{before} -> {after}")


def deallocate_all_between_statements():
    """psycopg sends DEALLOCATE ALL (and forgets its statements) after a
    failed transaction that prepared one: the server statements the
    coordinator shares between clients on that connection must then be
    prepared again, not assumed."""
    with connect(first_port, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS metadata_only")
        c.execute("CREATE TABLE metadata_only (id int PRIMARY KEY, v int)")
        c.execute("INSERT INTO metadata_only VALUES (1, 0)")
    errors = []
    with connect(first_port) as conn:
        for _ in range(3):
            for table in ["metadata_only", "transfer_accounts"]:
                try:
                    with conn.transaction():
                        conn.execute(f"SELECT * FROM {table} WHERE id = %s", (1,), prepare=True)
                        conn.execute("SELECT 1 / 0")
                except psycopg.errors.DivisionByZero:
                    pass
                except psycopg.Error as e:
                    errors.append(f"{table}: {e}")
    check("prepared statements work again after the client's DEALLOCATE ALL",
          not errors, "; ".join(errors[:2]))


def read_after_commit(rounds=300):
    """Once a client has heard COMMIT of a transaction on two nodes, another
    session (through the other coordinator) reads it on both."""
    source, target = two_accounts_on_two_nodes()
    stale = []
    with connect(first_port, autocommit=True) as writer, \
            connect(second_port, autocommit=True) as reader:
        for step in range(1, rounds + 1):
            transfer(writer, source, target, 1)
            # (Each read routed to its worker.)
            seen = tuple(
                reader.execute("SELECT balance FROM transfer_accounts WHERE id = %s",
                               (key,)).fetchone()[0]
                for key in (source, target))
            if seen != (START - step, START + step):
                stale.append((step, seen))
        transfer(writer, target, source, rounds)
    check(f"after COMMIT on two nodes another session reads both sides ({rounds} rounds)",
          not stale, f"stale reads: {stale[:3]}")


setup()
read_after_commit()
disconnect_mid_transaction()
batch_across_nodes()
deallocate_all_between_statements()
deadlock_across_nodes()
stats = workload()
sum_after, rows = total()
check(f"workload through two coordinators: {stats['committed']} transfers, "
      f"{stats['deadlocks']} deadlocks across nodes, no other error",
      stats["committed"] > 100 and not stats["other"], "; ".join(stats["other"][:3]))
check("...the total is unchanged", (sum_after, rows) == (START * ACCOUNTS, ACCOUNTS),
      f"{sum_after} over {rows} accounts")
check("...nothing is left prepared on any node", prepared_everywhere() == 0)
with connect(metadata_port, autocommit=True) as c:
    records = c.execute("SELECT count(*) FROM pg_shard.remote_transaction").fetchone()[0]
    c.execute("SELECT pg_shard.recover_prepared_transactions()")
    cleaned = c.execute("SELECT count(*) FROM pg_shard.remote_transaction").fetchone()[0]
check(f"...the recovery clears the decisions' records ({records} before, {cleaned} after)",
      cleaned == 0)
for step, commits in [("before_prepare", False), ("between_prepares", False),
                      ("after_decision", True), ("between_commit_prepareds", True)]:
    crash_at(step, commits)
worker_down_mid_transaction()
sys.exit(1 if check.failures else 0)
