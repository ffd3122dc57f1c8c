"""TLS between clients and the coordinator, with psycopg 3 (libpq).

Usage: tls_test.py REQUIRE_PORT ALLOW_PORT DATABASE CA_FILE OTHER_CA_FILE

REQUIRE_PORT is a coordinator with tls = require, ALLOW_PORT one with
tls = allow, both with a certificate for localhost and 127.0.0.1 signed by
CA_FILE (made by tests/coordinator/run.sh); OTHER_CA_FILE signed nothing of
theirs. Checks what a client of a TLS server relies on: verify-full finds
the certificate good and a wrong CA is refused, large results and COPY go
through whole, pipelines, prepared statements and cancel requests work,
a plain client is refused by `require` and served by `allow`, and SHOW
CLIENTS tells which clients use TLS.
"""

import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import psycopg  # noqa: E402
from tap import Checks  # noqa: E402

require_port, allow_port, database, ca_file, other_ca = sys.argv[1:6]
check = Checks("tls")


def dsn(port, sslmode, host="localhost", rootcert=ca_file, user="postgres"):
    return (f"host={host} hostaddr=127.0.0.1 port={port} dbname={database} user={user} "
            f"sslmode={sslmode} sslrootcert={rootcert} connect_timeout=10")


def show_clients(conn):
    """SHOW CLIENTS rows (the simple protocol, as admin commands need)."""
    result = conn.pgconn.exec_(b"SHOW CLIENTS")
    columns = [result.fname(i).decode() for i in range(result.nfields)]
    return [dict(zip(columns, (result.get_value(row, col).decode()
                               for col in range(result.nfields))))
            for row in range(result.ntuples)]


# verify-full: the chain and the name check out.
with psycopg.connect(dsn(require_port, "verify-full"), autocommit=True) as conn:
    check("verify-full connects", conn.info.pgconn.ssl_in_use)
    rows = show_clients(conn)
    check("SHOW CLIENTS shows the TLS session",
          len(rows) == 1 and rows[0]["tls"].startswith("TLSv1.")
          and rows[0]["user"] == "postgres" and rows[0]["addr"] == "127.0.0.1",
          repr(rows))

    conn.execute("DROP TABLE IF EXISTS tls_items")
    conn.execute("CREATE TABLE tls_items (id bigint PRIMARY KEY, body text NOT NULL)")
    conn.execute("SELECT pg_shard.create_distributed_table('tls_items', 'id', shard_count => 4)")

    # Large answers cross many TLS records and fill the socket.
    rows = conn.execute("SELECT repeat(chr(65 + g % 26), 1000000) FROM generate_series(1, 8) g").fetchall()
    check("an 8 MB result arrives whole",
          [len(r[0]) for r in rows] == [1000000] * 8
          and all(r[0] == chr(65 + (i + 1) % 26) * 1000000 for i, r in enumerate(rows)))

    # COPY in: 20,000 rows of 200 bytes, spread over the shards.
    with conn.cursor() as cur:
        with cur.copy("COPY tls_items (id, body) FROM STDIN") as copy:
            for i in range(1, 20001):
                copy.write_row((i, format(i, "0200d")))
    count, total = conn.execute("SELECT count(*), sum(length(body)) FROM tls_items").fetchone()
    check("COPY of 4 MB in", (count, total) == (20000, 20000 * 200), f"{count} rows, {total} bytes")

    # A pipeline of single-shard statements.
    with conn.pipeline():
        cursors = [conn.execute("SELECT body FROM tls_items WHERE id = %s", (i,))
                   for i in range(1, 301)]
    bodies = [cur.fetchone()[0] for cur in cursors]
    check("a pipeline of 300 statements", bodies == [format(i, "0200d") for i in range(1, 301)])

    # Prepared on the server (past psycopg's prepare threshold).
    found = [conn.execute("SELECT id FROM tls_items WHERE id = %s", (i,), prepare=True).fetchone()[0]
             for i in range(1, 21)]
    check("prepared statements", found == list(range(1, 21)))

    # A cancel request comes on a plain connection of its own (libpq), even
    # to a coordinator that takes only TLS clients.
    def cancel_soon():
        time.sleep(0.5)
        conn.cancel()
    threading.Thread(target=cancel_soon).start()
    started = time.monotonic()
    try:
        conn.execute("SELECT pg_sleep(20)")
        check("a cancel request ends a statement", False, "not canceled")
    except psycopg.errors.QueryCanceled:
        check("a cancel request ends a statement", time.monotonic() - started < 10)
    check("the session goes on after the cancel", conn.execute("SELECT 1").fetchone()[0] == 1)

# A certificate from another CA is refused by the client.
try:
    psycopg.connect(dsn(require_port, "verify-full", rootcert=other_ca)).close()
    check("verify-full refuses a server certificate of another CA", False, "connected")
except psycopg.OperationalError as e:
    check("verify-full refuses a server certificate of another CA", "certificate verify failed" in str(e),
          str(e))

# tls = require refuses a plain client, saying why.
try:
    psycopg.connect(dsn(require_port, "disable")).close()
    check("a plain client is refused by tls = require", False, "connected")
except psycopg.OperationalError as e:
    check("a plain client is refused by tls = require", "accepts only TLS connections" in str(e), str(e))

# tls = allow: both kinds, told apart in SHOW CLIENTS.
with psycopg.connect(dsn(allow_port, "disable"), autocommit=True) as plain, \
        psycopg.connect(dsn(allow_port, "require"), autocommit=True) as secure:
    check("tls = allow serves a plain client", plain.execute("SELECT count(*) FROM tls_items").fetchone()[0] == 20000)
    check("tls = allow serves a TLS client", secure.info.pgconn.ssl_in_use
          and secure.execute("SELECT count(*) FROM tls_items").fetchone()[0] == 20000)
    tls_column = sorted(row["tls"][:6] for row in show_clients(secure))
    check("SHOW CLIENTS tells plain from TLS", tls_column == ["", "TLSv1."], repr(tls_column))

# A role that is not a superuser sees only its own clients.
with psycopg.connect(dsn(require_port, "require"), autocommit=True) as admin:
    admin.execute("DROP ROLE IF EXISTS tls_viewer")
    admin.execute("CREATE ROLE tls_viewer LOGIN")
    with psycopg.connect(dsn(require_port, "require", user="tls_viewer"), autocommit=True) as viewer:
        everyone = show_clients(admin)
        own = show_clients(viewer)
        check("SHOW CLIENTS: a superuser sees every client, a role its own",
              len(everyone) == 2 and [row["user"] for row in own] == ["tls_viewer"],
              f"{everyone!r} / {own!r}")
    admin.execute("DROP ROLE tls_viewer")
    time.sleep(0.2)
    check("clients that left are gone from SHOW CLIENTS", len(show_clients(admin)) == 1)
    admin.execute("DROP TABLE tls_items")

sys.exit(1 if check.failures else 0)
