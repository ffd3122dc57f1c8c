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
