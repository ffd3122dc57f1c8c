"""What the shard-move test scripts share: TAP-style checks (`ok - …` /
`not ok - …`, counted by tests/coordinator/run.sh) and connections that
wait for a restarting server."""
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
