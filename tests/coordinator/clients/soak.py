"""A bounded soak of the coordinator: a few hundred clients connect, query,
cancel and vanish for a while; afterwards its memory and its server
connections are back near where they were.

Usage: soak.py COORDINATOR_PORT COORDINATOR_PID DATABASE METADATA_PORT SECONDS

The coordinator under test runs with a short --server-idle-timeout, so that
its idle server connections close soon after the load ends. Prints TAP-like
"ok -" / "not ok -" lines; exits 1 when a check failed.
"""

import random
import sys
import threading
import time

import psycopg
from rawclient import login, query_message
from tap import Checks

port, pid, database, metadata_port, seconds = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                               int(sys.argv[4]), float(sys.argv[5]))
CLIENTS = 200
check = Checks("soak")


def rss_mib():
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def server_backends():
    """Client backends in the database on the metadata node, other than this one."""
    with psycopg.connect(host="127.0.0.1", port=metadata_port, user="postgres", dbname=database,
                         autocommit=True) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s "
                            "AND backend_type = 'client backend' AND pid <> pg_backend_pid()",
                            (database,)).fetchone()[0]


def connect():
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname=database,
                           autocommit=True, connect_timeout=10)


def vanish():
    """Logs in over a raw socket, sends a query and drops the connection
    without reading the answer or saying goodbye."""
    sock = login(port, database)
    if isinstance(sock, str):
        raise OSError(f"refused: {sock}")
    sock.sendall(query_message("SELECT g, repeat('x', 100) FROM generate_series(1, 20000) g"))
    sock.close()


errors = []
counts = {"queries": 0, "cancels": 0, "missed_cancels": 0, "vanished": 0, "connections": 0}
lock = threading.Lock()


def client(deadline, seed):
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        try:
            choice = rng.random()
            if choice < 0.15:
                vanish()
                with lock:
                    counts["vanished"] += 1
                continue
            with connect() as conn:
                with lock:
                    counts["connections"] += 1
                for _ in range(rng.randint(1, 5)):
                    got = conn.execute("SELECT %s::int + 1", (seed,)).fetchone()[0]
                    if got != seed + 1:
                        errors.append(f"wrong answer {got} for {seed}")
                    with lock:
                        counts["queries"] += 1
                if choice < 0.3:
                    timer = threading.Timer(0.2, conn.cancel)
                    timer.start()
                    try:
                        conn.execute("SELECT pg_sleep(2)")
                        # A cancel that comes before the statement was read
                        # is dropped, by a server too: rare, not never.
                        with lock:
                            counts["missed_cancels"] += 1
                    except psycopg.errors.QueryCanceled:
                        with lock:
                            counts["cancels"] += 1
                    timer.join()
                    # The connection goes on after a cancel.
                    if conn.execute("SELECT 7").fetchone()[0] != 7:
                        errors.append("a wrong answer after a cancel")
        except psycopg.Error as error:
            errors.append(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        except OSError as error:
            errors.append(f"{type(error).__name__}: {error}")


def load(duration, seed_base):
    deadline = time.monotonic() + duration
    threads = [threading.Thread(target=client, args=(deadline, seed_base + i)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def settle(limit, target_backends):
    """Waits up to `limit` seconds for the server backends to come down."""
    deadline = time.monotonic() + limit
    backends = server_backends()
    while backends > target_backends and time.monotonic() < deadline:
        time.sleep(0.5)
        backends = server_backends()
    return backends


start_backends = server_backends()
# A short warm-up: the allocator's and the caches' working set.
load(min(5.0, seconds / 6), 0)
settle(15, start_backends)
warm_rss = rss_mib()
load(seconds, 1000)
after_load = dict(counts)
backends = settle(20, start_backends)
time.sleep(1)
end_rss = rss_mib()
tried = after_load["cancels"] + after_load["missed_cancels"]
check(f"{CLIENTS} clients for {seconds:.0f} s: {after_load['connections']} connections, {after_load['queries']} "
      f"queries, {after_load['cancels']} of {tried} cancels took, {after_load['vanished']} vanished, no error",
      not errors and after_load["cancels"] > 0 and after_load["missed_cancels"] <= max(2, tried // 20)
      and after_load["vanished"] > 0, f"{len(errors)} errors: {errors[:3]}")
check(f"server connections back to the starting level ({start_backends}) after the load: {backends}",
      backends <= start_backends)
check(f"coordinator memory back near its level after a warm-up: {warm_rss:.0f} MiB, then {end_rss:.0f} MiB",
      end_rss <= warm_rss * 1.5 + 16)
with connect() as conn:
    served = conn.execute("SELECT 1").fetchone()[0]
check("a client is served after the soak", served == 1)
sys.exit(1 if check.failures else 0)
