"""What the shard-move test scripts share: TAP-style checks (`ok - …` /
`not ok - …`, counted by tests/coordinator/run.sh) and connections that
wait for a restarting server."""
import threading
import time

import psycopg


class Checks:
    """check(description, condition) prints one TAP line; failures counts
    the lines that were not ok."""

    def __init__(self, prefix):
        self.prefix = prefix
        self.failures = 0

    def __call__(self, description, condition):
        print(("ok - " if condition else "not ok - ") + self.prefix + ": " + description)
        if not condition:
            self.failures += 1


def connect(dsn, tries=100):
    """An autocommit connection, waiting up to tries × 0.2 s for the server."""
    for _ in range(tries):
        try:
            return psycopg.connect(dsn, autocommit=True)
        except psycopg.OperationalError:
            time.sleep(0.2)
    raise RuntimeError(f"no connection ({dsn})")


class Writer:
    """Runs one statement over and over, a few milliseconds apart, on a
    connection of its own in a thread, until stop(): `done` holds (start,
    seconds) of each acknowledged run, `errors` the first line of each
    failure."""

    def __init__(self, dsn, sql, params=(), pause=0.005):
        self.done, self.errors = [], []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(dsn, sql, params, pause), daemon=True)
        self._thread.start()

    def _run(self, dsn, sql, params, pause):
        conn = connect(dsn)
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                conn.execute(sql, params)
                self.done.append((started, time.monotonic() - started))
            except Exception as e:  # noqa: BLE001 — every failure is reported
                self.errors.append(str(e).splitlines()[0])
            time.sleep(pause)

    def stop(self):
        self._stopping.set()
        self._thread.join(30)


def distributed_counters(conn, table, rows, **options):
    """(Re)creates `table` (id bigint PRIMARY KEY, v int NOT NULL) holding
    ids 1..rows with v = 0, distributed by id; `options` (shard_count,
    colocate_with) go to create_distributed_table as named arguments."""
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (id bigint PRIMARY KEY, v int NOT NULL)")
    conn.execute(f"INSERT INTO {table} SELECT g, 0 FROM generate_series(1, %s) g", (rows,))
    named = "".join(f", {name} => %s" for name in options)
    conn.execute(f"SELECT pg_shard.create_distributed_table(%s, 'id'{named})",
                 (table, *options.values()))
