#!/usr/bin/env python3
"""Session state, pipelines and protocol details, as PostgreSQL has them.

Every check encodes what a plain PostgreSQL 15 server does: pointed straight
at the metadata node (PORT = METADATA_PORT) the script passes entirely; a
server in front of it (the coordinator) has to behave the same.

Usage: session_protocol.py PORT DATABASE METADATA_PORT [SECTION...]

  PORT           the server under test (the coordinator, or the metadata node)
  DATABASE       a database of the cluster, with pg_shard on the metadata node
  METADATA_PORT  the metadata node (127.0.0.1): the ground truth for stored
                 rows, pg_stat_activity and pg_terminate_backend; the workers'
                 ports come from its pg_shard.nodes
  SECTION        run only these sections (function names below, e.g.
                 long_pipelines listen_notify); default: all

The script makes its own tables and drops them at the end: sp_items
(distributed by id), sp_names (distributed by a text key), sp_ddl
(distributed, altered by a test), sp_local and sp_load (ordinary tables);
the role sp_role on every node (kept when SET ROLE leaked into other
sessions, as those may still run as it); and, for the SET ROLE checks, the
database DATABASE_sp_role on every node (kept: a leaked role stays in that
database's pooled connections, not in DATABASE's). It prints
"ok - session: ..." or "not ok - session: ... (details)" per check, and
"# session: ..." notes (measurements), and exits 1 when a check failed.

Sections: pipelines (psycopg pipeline mode); long pipelines and clients that
stop reading (raw protocol); session state (temporary tables, SET,
LISTEN/NOTIFY, PREPARE, WITH HOLD cursors, advisory locks, prepared
statements after DDL and DISCARD ALL, ParameterStatus, SET ROLE); client
encodings; backend identity (pg_terminate_backend, idle_session_timeout);
Close of unknown names. A section that raises or hangs is reported as a
failure and the next one runs.
"""
import multiprocessing
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

import psycopg
import psycopg.sql
from tap import Checks

port, database, metadata_port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
# Only what the script asks for: no settings from the environment.
for name in ("PGAPPNAME", "PGOPTIONS", "PGCLIENTENCODING", "PGTZ", "PGDATESTYLE", "PGSERVICE"):
    os.environ.pop(name, None)
check = Checks("session")


def note(text):
    print("# session: " + text, flush=True)


def connect(port_=None, **kwargs):
    """A psycopg connection (autocommit unless told) to the server under test."""
    kwargs.setdefault("autocommit", True)
    kwargs.setdefault("dbname", database)
    return psycopg.connect(host="127.0.0.1", port=port_ or port, user="postgres", connect_timeout=10, **kwargs)


def metadata(dbname=database):
    return connect(metadata_port, dbname=dbname)


def truth(sql, params=None, dbname=database):
    """Rows as the metadata node sees them (UTF-8, a fresh session)."""
    with metadata(dbname) as conn:
        return conn.execute(sql, params).fetchall()


def sqlstate_of(action):
    """Run action(); the SQLSTATE it raised, or None."""
    try:
        action()
    except psycopg.Error as error:
        return error.sqlstate or type(error).__name__
    return None


def worker_ports():
    return [p for (p,) in truth("SELECT port FROM pg_shard.nodes ORDER BY node_id")]


# ---------------------------------------------------------------------------
# The raw protocol (v3), for what a library would hide.

def message(tag, body=b""):
    return tag + struct.pack("!i", 4 + len(body)) + body


def cstring(text):
    return (text.encode() if isinstance(text, str) else text) + b"\0"


def query(sql):
    return message(b"Q", cstring(sql))


def parse(name, sql, types=()):
    return message(b"P", cstring(name) + cstring(sql) + struct.pack("!h", len(types))
                   + b"".join(struct.pack("!I", t) for t in types))


def bind(statement, values, portal=""):
    """Bind with text parameters (None is NULL) and text results."""
    body = cstring(portal) + cstring(statement) + b"\0\0" + struct.pack("!h", len(values))
    for item in values:
        if item is None:
            body += struct.pack("!i", -1)
        else:
            data = item.encode() if isinstance(item, str) else item
            body += struct.pack("!i", len(data)) + data
    return message(b"B", body + b"\0\0")


def execute(portal="", max_rows=0):
    return message(b"E", cstring(portal) + struct.pack("!i", max_rows))


def close(kind, name):
    return message(b"C", kind + cstring(name))


def sync():
    return message(b"S")


def fields(body):
    """The fields of an ErrorResponse or NoticeResponse: {'C': '57P01', ...}."""
    out = {}
    for part in body.split(b"\0"):
        if part:
            out[part[:1].decode()] = part[1:].decode(errors="replace")
    return out


def data_row(body):
    count = struct.unpack("!h", body[:2])[0]
    values, offset = [], 2
    for _ in range(count):
        length = struct.unpack("!i", body[offset:offset + 4])[0]
        offset += 4
        if length < 0:
            values.append(None)
        else:
            values.append(body[offset:offset + length])
            offset += length
    return values


class Raw:
    """A raw protocol connection: startup, then messages in and out."""

    def __init__(self, port_=None, **parameters):
        self.sock = socket.create_connection(("127.0.0.1", port_ or port), timeout=10)
        self.sock.settimeout(None)
        self.buffer, self.offset = b"", 0  # received bytes; where the next message starts
        self.eof = False
        params = {"user": "postgres", "database": database, **parameters}
        body = struct.pack("!i", 196608) + b"".join(cstring(k) + cstring(v) for k, v in params.items()) + b"\0"
        self.sock.sendall(struct.pack("!i", 4 + len(body)) + body)
        self.startup = self.until_ready()
        self.parameters = {}
        self.key_pid = None  # the process id of BackendKeyData
        for tag, payload in self.startup:
            if tag == b"S":
                name, setting = payload.split(b"\0")[:2]
                self.parameters[name.decode()] = setting.decode()
            elif tag == b"K":
                self.key_pid = struct.unpack_from("!i", payload)[0]
        if not self.startup or self.startup[-1][0] != b"Z":
            raise RuntimeError(f"startup failed: {tags(self.startup)} {errors(self.startup)}")

    def send(self, data):
        self.sock.sendall(data)

    def next(self, deadline):
        """The next message, or None at the end of the stream; TimeoutError at the deadline."""
        while True:
            data, at = self.buffer, self.offset
            if len(data) - at >= 5:
                length = struct.unpack_from("!i", data, at + 1)[0]
                if len(data) - at >= 1 + length:
                    self.offset = at + 1 + length
                    return data[at:at + 1], data[at + 5:at + 1 + length]
            if self.eof:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.sock], [], [], remaining)[0]:
                raise TimeoutError("no answer in time")
            try:
                chunk = self.sock.recv(1 << 20)
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self.eof = True
            self.buffer, self.offset = data[at:] + chunk, 0

    def until_ready(self, timeout=10):
        """Messages up to and including ReadyForQuery (or the end of the stream)."""
        deadline = time.monotonic() + timeout
        messages = []
        while True:
            item = self.next(deadline)
            if item is None:
                return messages
            messages.append(item)
            if item[0] == b"Z":
                return messages

    def run(self, sql, timeout=10):
        self.send(query(sql))
        return self.until_ready(timeout)

    def value(self, sql):
        """The first column of the first row of a simple query, as text."""
        for tag, body in self.run(sql):
            if tag == b"D":
                return data_row(body)[0].decode()
        return None

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def tags(messages):
    return b"".join(tag for tag, _ in messages).decode(errors="replace")


def errors(messages):
    return [fields(body) for tag, body in messages if tag == b"E"]


def rows(messages):
    return [[None if v is None else v.decode() for v in data_row(body)] for tag, body in messages if tag == b"D"]


def attempt(action):
    """What action() returns, or a one-line description of the psycopg error it raised."""
    try:
        return action()
    except psycopg.Error as error:
        first = str(error).splitlines()[0] if str(error) else ""
        return f"{type(error).__name__} {error.sqlstate}: {first}"


def fetch(conn, sql, params=None, **kwargs):
    """Rows of a statement, or the error it raised (as text)."""
    return attempt(lambda: conn.execute(sql, params, **kwargs).fetchall())


def value(conn, sql, params=None):
    """The first column of the first row, or the error (as text)."""
    got = fetch(conn, sql, params)
    return got[0][0] if isinstance(got, list) and got else got


def run_sql(conn, sql, params=None, **kwargs):
    """None when a statement succeeds, else its error (as text)."""
    return attempt(lambda: conn.execute(sql, params, **kwargs) and None)


# ---------------------------------------------------------------------------
# Setup and teardown, on the metadata node and the workers.

TABLES = ("sp_items", "sp_names", "sp_ddl", "sp_local", "sp_load")
# Set when SET ROLE leaked into other sessions: the role then stays (sessions
# of the server under test may still run as it).
role_leaked = False


def setup():
    with metadata() as conn:
        conn.execute("SET lock_timeout = '10s'")
        for table in TABLES:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("CREATE TABLE sp_items (id bigint PRIMARY KEY, v text)")
        conn.execute("SELECT pg_shard.create_distributed_table('sp_items', 'id')")
        conn.execute("CREATE TABLE sp_names (name text PRIMARY KEY, n int)")
        conn.execute("SELECT pg_shard.create_distributed_table('sp_names', 'name')")
        conn.execute("CREATE TABLE sp_ddl (id bigint PRIMARY KEY, v text)")
        conn.execute("SELECT pg_shard.create_distributed_table('sp_ddl', 'id')")
        conn.execute("CREATE TABLE sp_local (id bigint PRIMARY KEY, v text)")
        conn.execute("CREATE TABLE sp_load (id bigint PRIMARY KEY, v text)")
    # SET ROLE must find the role wherever the statement runs.
    for node in [metadata_port] + worker_ports():
        with connect(node) as conn:
            conn.execute("""DO $$ BEGIN CREATE ROLE sp_role;
                            EXCEPTION WHEN duplicate_object THEN NULL; END $$""")


def wait_for_routing(dbname=database, tables=("sp_items", "sp_names", "sp_ddl")):
    """A coordinator learns of new distributed tables a moment after they are
    made: wait until its SHOW SHARDS lists them, so that every check sees the
    statements routed. (PostgreSQL has no SHOW SHARDS: nothing to wait for.)"""
    deadline = time.monotonic() + 10
    with connect(dbname=dbname) as conn:
        while time.monotonic() < deadline:
            try:
                listed = {str(row[0]) for row in conn.execute("SHOW SHARDS").fetchall()}
            except psycopg.Error:
                return
            if set(tables) <= {name.split(".")[-1] for name in listed}:
                return
            time.sleep(0.1)
    note(f"the server under test did not list {', '.join(tables)} of {dbname} in SHOW SHARDS within 10 s")


# The SET ROLE checks run in a database of their own: a role that leaks into
# a proxy's pooled connections then stays in that database's pools (pools are
# per database), and does not fail the tests that run after this script.
ROLE_DATABASE = database + "_sp_role"


def role_database():
    """Made on every node when missing and kept (it is small); its tables are
    made afresh, and dropped by teardown."""
    nodes = truth("SELECT host, port FROM pg_shard.nodes ORDER BY node_id")
    for node in [metadata_port] + [p for _, p in nodes]:
        with connect(node, dbname="postgres") as conn:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (ROLE_DATABASE,)).fetchall():
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(ROLE_DATABASE)))
    with metadata(ROLE_DATABASE) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_shard")
        known = {p for (p,) in conn.execute("SELECT port FROM pg_shard.nodes").fetchall()}
        for host, node in nodes:
            if node not in known:
                conn.execute("SELECT pg_shard.add_node(%s, %s)", (host, node))
        conn.execute("DROP TABLE IF EXISTS sp_items")
        conn.execute("DROP TABLE IF EXISTS sp_local")
        conn.execute("CREATE TABLE sp_items (id bigint PRIMARY KEY, v text)")
        conn.execute("SELECT pg_shard.create_distributed_table('sp_items', 'id')")
        conn.execute("CREATE TABLE sp_local (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO sp_items VALUES (10, 'hello'), (20, 'world')")
        conn.execute("INSERT INTO sp_local VALUES (40, 'local 40')")
    wait_for_routing(ROLE_DATABASE, ("sp_items",))


def teardown():
    try:
        with metadata() as conn:
            conn.execute("SET lock_timeout = '10s'")
            for table in TABLES:
                conn.execute(f"DROP TABLE IF EXISTS {table}")
        if "set_role" in sections_run:
            with metadata(ROLE_DATABASE) as conn:
                conn.execute("SET lock_timeout = '10s'")
                conn.execute("DROP TABLE IF EXISTS sp_items")
                conn.execute("DROP TABLE IF EXISTS sp_local")
        if not role_leaked:
            for node in [metadata_port] + worker_ports():
                with connect(node) as conn:
                    conn.execute("DROP ROLE IF EXISTS sp_role")
    except psycopg.Error as error:
        check("cleanup: tables and role dropped", False, f"{type(error).__name__}: {error}")


def colocated_ids(first, count, below):
    """`count` ids from `first` up (below `below`) in the shard of `first`."""
    return [i for (i,) in truth(
        """WITH s AS (SELECT range_start, range_end FROM pg_shard.shards
                      WHERE table_name = 'sp_items'::regclass
                        AND pg_shard.keyspace_id(%s::bigint) BETWEEN range_start AND range_end LIMIT 1)
           SELECT id FROM generate_series(%s::bigint, %s::bigint) id, s
           WHERE pg_shard.keyspace_id(id) BETWEEN s.range_start AND s.range_end
           ORDER BY id LIMIT %s""", (first, first, below - 1, count))]


def stored(low, high, table="sp_items"):
    return truth(f"SELECT id, v FROM {table} WHERE id BETWEEN %s AND %s ORDER BY id", (low, high))


# ---------------------------------------------------------------------------
# 1. Pipelines: every statement stores and answers its own rows.

def in_pipeline(conn, body):
    """Run body() inside conn.pipeline(); None, or the error psycopg raised."""
    def action():
        with conn.pipeline():
            body()
    return attempt(action)


def pipelines():
    insert = "INSERT INTO sp_items VALUES (%s, %s)"
    select_v = "SELECT v FROM sp_items WHERE id = %s"

    with connect() as conn:
        raised = in_pipeline(conn, lambda: conn.cursor().executemany(insert, [(10, "hello"), (20, "world")]))
        got = stored(1, 29)
        check("pipeline: executemany stores exactly its two rows",
              raised is None and got == [(10, "hello"), (20, "world")], f"raised {raised}, stored {got}")

    with connect() as conn:
        def two_inserts():
            conn.execute("INSERT INTO sp_items VALUES (30, 'thirty')")
            conn.execute("INSERT INTO sp_items VALUES (31, 'thirty-one')")
        raised = in_pipeline(conn, two_inserts)
        got = stored(30, 39)
        check("pipeline: two different parameterless INSERTs store both rows",
              raised is None and got == [(30, "thirty"), (31, "thirty-one")], f"raised {raised}, stored {got}")

    with connect() as conn:
        cursors = []

        def mixed():
            conn.execute("INSERT INTO sp_items VALUES (40, 'distributed 40')")
            conn.execute("INSERT INTO sp_local VALUES (40, 'local 40')")
            cursors.extend([conn.execute("SELECT v FROM sp_items WHERE id = 40"),
                            conn.execute("SELECT v FROM sp_local WHERE id = 40"),
                            conn.execute(select_v, (20,)),
                            conn.execute(select_v, (10,)),
                            conn.execute("SELECT count(*) FROM sp_local WHERE id = %s", (40,))])
        raised = in_pipeline(conn, mixed)
        answers = [attempt(cur.fetchall) for cur in cursors]
        expected = [[("distributed 40",)], [("local 40",)], [("world",)], [("hello",)], [(1,)]]
        check("pipeline mixing the distributed and an ordinary table: each statement its own answer",
              raised is None and answers == expected, f"raised {raised}, answers {answers}")
        got = (stored(40, 40), stored(40, 40, "sp_local"))
        check("pipeline mixing the distributed and an ordinary table: both rows stored",
              got == ([(40, "distributed 40")], [(40, "local 40")]), f"stored {got}")

    with connect() as conn:
        first, second = [], []

        def prepared_first():
            for i in range(3):
                conn.execute(insert, (50 + i, f"prepared {i}"), prepare=True)
            first.extend(conn.execute(select_v, (key,), prepare=True) for key in (50, 51, 52, 10))

        def prepared_again():
            conn.execute(insert, (53, "prepared 3"), prepare=True)
            conn.execute(insert, (54, "prepared 4"), prepare=True)
            second.extend(conn.execute(select_v, (key,), prepare=True) for key in (54, 20, 53))
        raised = [in_pipeline(conn, prepared_first), in_pipeline(conn, prepared_again)]
        answers = [attempt(cur.fetchall) for cur in first]
        again = [attempt(cur.fetchall) for cur in second]
        after = fetch(conn, select_v, (52,), prepare=True)
        got = stored(50, 59)
        check("pipeline with prepared statements (prepare=True): the right rows stored and answered",
              raised == [None, None] and got == [(50 + i, f"prepared {i}") for i in range(5)]
              and answers == [[("prepared 0",)], [("prepared 1",)], [("prepared 2",)], [("hello",)]]
              and again == [[("prepared 4",)], [("world",)], [("prepared 3",)]] and after == [("prepared 2",)],
              f"raised {raised}, stored {got}, answers {answers}, second pipeline {again}, then {after}")

    # Keys of one shard: the transaction stays on one node wherever it runs.
    outer, inner, undone = colocated_ids(100, 3, 1000)
    with connect() as conn:
        def transaction():
            with conn.transaction():
                conn.execute(insert, (outer, "outer"))
                with conn.transaction():
                    conn.execute(insert, (inner, "inner savepoint"))
                with conn.transaction():
                    conn.execute(insert, (undone, "rolled back"))
                    conn.execute("UPDATE sp_items SET v = 'changed, rolled back' WHERE id = %s", (outer,))
                    raise psycopg.Rollback()
                conn.execute("UPDATE sp_items SET v = 'outer, updated' WHERE id = %s", (outer,))
        raised = in_pipeline(conn, transaction)
        got = stored(100, 999)
        status = conn.info.transaction_status.name
        check("pipelined transaction with savepoints (keys of one shard) commits exactly the right rows",
              raised is None and got == sorted([(outer, "outer, updated"), (inner, "inner savepoint")])
              and status == "IDLE", f"raised {raised}; stored {got}, transaction status {status}")

    with connect() as conn:
        def failing():
            conn.execute("INSERT INTO sp_items VALUES (1001, 'before the error')")
            conn.execute("INSERT INTO sp_items VALUES (10, 'duplicate key')")
            conn.execute("INSERT INTO sp_items VALUES (1002, 'after the error')")
            conn.execute("INSERT INTO sp_local VALUES (1003, 'after the error')")
        raised = in_pipeline(conn, failing)
        check("pipeline error: psycopg raises the duplicate key error (23505)",
              isinstance(raised, str) and " 23505: " in raised, f"raised {raised}")
        after_error = (stored(1002, 1002), stored(1003, 1003, "sp_local"))
        check("pipeline error: the statements after it in the batch did not run",
              after_error == ([], []), f"stored {after_error}")
        before_error = stored(1001, 1001)
        check("pipeline error: the batch was one implicit transaction (the row before the error rolled back)",
              before_error == [], f"stored {before_error}")
        works = fetch(conn, "SELECT v FROM sp_items WHERE id = 20")
        raised = in_pipeline(conn, lambda: conn.execute("INSERT INTO sp_items VALUES (1004, 'next pipeline')"))
        check("pipeline error: the connection works afterwards (a read, another pipeline)",
              works == [("world",)] and raised is None and stored(1004, 1004) == [(1004, "next pipeline")]
              and conn.info.transaction_status.name == "IDLE",
              f"read {works}, next pipeline raised {raised}, stored {stored(1004, 1004)}")


# ---------------------------------------------------------------------------
# 2. Long pipelines and clients that stop reading.

LOAD_ROWS = 50_000
# The loads go to an ordinary table: through the metadata node's postgres_fdw
# the 150,000 INSERTs into a distributed table take a minute on two cores.
# (Routed pipelines are exercised by unread_pipeline and the pipelines section.)
LOAD_TABLE = "sp_load"


INSERT_COMPLETE = message(b"C", b"INSERT 0 1\0")
READY_IDLE = message(b"Z", b"I")


def load(base, count, results, go):
    """A loader (its own process): Parse, `count` Bind/Execute INSERTs, one Sync;
    sent by one thread, once `go` is set, while this one counts the answers
    (by their bytes: the loaders must leave the CPU to the servers and the reader)."""
    os.nice(10)
    try:
        raw = Raw()
        batch = [parse("", f"INSERT INTO {LOAD_TABLE} VALUES ($1, $2)")]
        batch += [bind("", [str(base + i), f"load {i}"]) + execute() for i in range(count)]
        batch.append(sync())
        batch = b"".join(batch)
        results.put(("ready", base))
        go.wait(60)
        started = time.monotonic()
        sender = threading.Thread(target=raw.send, args=(batch,), daemon=True)
        sender.start()
        deadline = time.monotonic() + 70
        completes, errors_seen, ready, carry = 0, [], False, raw.buffer[raw.offset:]
        while time.monotonic() < deadline:
            if not select.select([raw.sock], [], [], 1)[0]:
                continue
            chunk = raw.sock.recv(1 << 20)
            if not chunk:
                break
            data = carry + chunk
            completes += data.count(INSERT_COMPLETE)
            if b"SERROR\0" in data or b"SFATAL\0" in data:
                errors_seen.append(repr(data[data.find(b"SERROR\0") - 8:][:200]))
            carry = data[-(len(INSERT_COMPLETE) - 1):]
            if data.endswith(READY_IDLE) or data[-6:-1] == READY_IDLE[:-1]:
                ready = data.endswith(READY_IDLE)
                break
        raw.close()
        results.put((base, completes, ready, errors_seen[:3], time.monotonic() - started))
    except Exception as error:  # reported by the parent
        results.put((base, -1, False, [f"{type(error).__name__}: {error}"], 0))


def percentile(samples, fraction):
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * fraction))] * 1000 if ordered else float("inf")


def long_pipelines():
    """Three long pipelines at once, and point reads meanwhile. Each read through
    the server under test is paired with the same read made on the metadata
    node directly, PostgreSQL itself: the reads' p99 must stay under 10 ms,
    or, on a machine too busy for PostgreSQL to manage that, under 3 times
    PostgreSQL's p99 (a read stalled behind the pipelines takes far longer)."""
    key = 90
    with metadata() as conn:
        conn.execute("INSERT INTO sp_items VALUES (%s, 'point read') ON CONFLICT DO NOTHING", (key,))
    context = multiprocessing.get_context("fork")
    results, go = context.Queue(), context.Event()
    bases = [1_000_000, 2_000_000, 3_000_000]
    loaders = [context.Process(target=load, args=(base, LOAD_ROWS, results, go), daemon=True) for base in bases]
    for loader in loaders:
        loader.start()
    latencies, control, wrong = [], [], []
    reports = {}
    point_read = "SELECT v FROM sp_items WHERE id = %s"
    with connect() as reader, metadata() as direct:
        for _ in range(20):  # warm up: psycopg prepares the reads after 5 runs
            reader.execute(point_read, (key,))
            direct.execute(point_read, (key,))
        ready = 0
        while ready < len(bases):
            report = results.get(timeout=30)
            if report[0] == "ready":
                ready += 1
            else:
                reports[report[0]] = report
        go.set()
        deadline = time.monotonic() + 75
        while len(reports) < len(bases) and time.monotonic() < deadline:
            started = time.perf_counter()
            got = reader.execute(point_read, (key,)).fetchall()
            latencies.append(time.perf_counter() - started)
            if got != [("point read",)]:
                wrong.append(got)
            started = time.perf_counter()
            direct.execute(point_read, (key,)).fetchall()
            control.append(time.perf_counter() - started)
            while not results.empty():
                report = results.get()
                reports[report[0]] = report
    for loader in loaders:
        loader.join(timeout=5)
        if loader.is_alive():
            loader.terminate()
    counts = {base: truth(f"SELECT count(*) FROM {LOAD_TABLE} WHERE id >= %s AND id < %s",
                          (base, base + LOAD_ROWS))[0][0] for base in bases}
    finished = all(base in reports and reports[base][1] == LOAD_ROWS and reports[base][2] for base in bases)
    check(f"three concurrent pipelines of {LOAD_ROWS} INSERTs into {LOAD_TABLE} (one Sync each) finish, "
          "every row stored",
          finished and all(count == LOAD_ROWS for count in counts.values()),
          "; ".join(f"loader {base}: " + (f"{reports[base][1]} CommandCompletes, ReadyForQuery {reports[base][2]}, "
                                          f"errors {reports[base][3]}, {reports[base][4]:.1f} s"
                                          if base in reports else "no report (stuck)")
                    + f", {counts[base]} rows stored" for base in bases))
    p99, median = percentile(latencies, 0.99), percentile(latencies, 0.5)
    control_p99 = percentile(control, 0.99)
    limit = max(10.0, 3 * control_p99)
    note(f"point reads during the load: {len(latencies)} reads, median {median:.2f} ms, p99 {p99:.2f} ms, "
         f"max {percentile(latencies, 1):.1f} ms; the same reads on the metadata node: median "
         f"{percentile(control, 0.5):.2f} ms, p99 {control_p99:.2f} ms; loaders took "
         + ", ".join(f"{reports[b][4]:.1f} s" for b in bases if b in reports))
    check(f"point reads during the load: p99 {p99:.2f} ms, under {limit:.0f} ms, every answer right",
          len(latencies) >= 30 and p99 < limit and not wrong,
          f"{len(latencies)} reads, median {median:.2f} ms, max {percentile(latencies, 1):.1f} ms, "
          f"wrong answers {wrong[:3]}")


def unread_pipeline():
    """Parse, 30,000 Bind/Execute pairs and a Sync sent before reading anything."""
    count, base = 30_000, 5_000_000
    raw = Raw()
    batch = [parse("", "INSERT INTO sp_items VALUES ($1, $2)")]
    batch += [bind("", [str(base + i), "unread"]) + execute() for i in range(count)]
    batch.append(sync())
    raw.sock.settimeout(60)
    started = time.monotonic()
    try:
        raw.send(b"".join(batch))
        sent = True
    except (socket.timeout, OSError) as error:
        sent = f"{type(error).__name__} after {time.monotonic() - started:.0f} s"
    raw.sock.settimeout(None)
    counts = {}
    error_messages = []
    ready = False
    if sent is True:
        deadline = started + 60
        try:
            while True:
                item = raw.next(deadline)
                if item is None:
                    break
                counts[item[0]] = counts.get(item[0], 0) + 1
                if item[0] == b"E":
                    error_messages.append(fields(item[1]).get("M"))
                if item[0] == b"Z":
                    ready = True
                    break
        except TimeoutError:
            pass
    raw.close()
    elapsed = time.monotonic() - started
    rows_stored = truth("SELECT count(*) FROM sp_items WHERE id >= %s AND id < %s", (base, base + count))[0][0]
    summary = {tag.decode(): n for tag, n in counts.items()}
    check(f"Parse, {count} Bind/Execute and Sync sent without reading: every answer, ReadyForQuery, "
          f"no deadlock ({elapsed:.1f} s)",
          sent is True and ready and counts.get(b"C") == count and counts.get(b"2") == count
          and counts.get(b"1") == 1 and not error_messages and rows_stored == count,
          f"send: {sent}, messages {summary}, errors {error_messages[:3]}, {rows_stored} rows stored")


def long_pipeline_across_workers():
    """A pipeline longer than the coordinator's batch (sent on in pieces, the
    first of which picks the node) whose last INSERT belongs on another
    worker: a clear error, nothing stored, the connection still works."""
    base, count = 7_000_000, 4_200
    ids = colocated_ids(base, count, base + 200_000)
    first_port = next(port for port, key in key_on_each_worker(ids[0], ids[0]).items())
    other = [key for port, key in key_on_each_worker(base + 200_000, base + 201_000).items()
             if port != first_port]
    if len(ids) < count or not other:
        check("pipeline across workers: test keys found", False, f"{len(ids)} ids, other worker's key {other}")
        return
    raw = Raw()
    batch = [parse("", "INSERT INTO sp_items VALUES ($1, $2)")]
    batch += [bind("", [str(key), "spanning"]) + execute() for key in ids + other[:1]]
    batch.append(sync())
    raw.send(b"".join(batch))
    messages = raw.until_ready(60)
    states = [error.get("C") for error in errors(messages)]
    after = raw.run("SELECT v FROM sp_items WHERE id = 10")
    raw.close()
    kept = truth("SELECT count(*) FROM sp_items WHERE id >= %s AND id <= %s", (base, base + 201_000))[0][0]
    check(f"pipeline of {count} INSERTs on one worker, then one for another worker (one Sync): 0A000, "
          "nothing stored, the connection works",
          states == ["0A000"] and messages[-1][0] == b"Z" and kept == 0 and rows(after) == [["hello"]],
          f"errors {errors(messages)[:2]}, last message {tags(messages[-1:])}, {kept} rows stored, "
          f"then {tags(after)} {rows(after)}")


def stuck_backends(ports):
    found = {}
    for node in ports:
        with connect(node) as conn:
            stuck = conn.execute(
                """SELECT pid, state, wait_event, left(query, 50) FROM pg_stat_activity
                   WHERE datname = current_database() AND pid <> pg_backend_pid()
                     AND (state LIKE 'idle in transaction%%' OR wait_event = 'ClientWrite')""").fetchall()
        if stuck:
            found[node] = stuck
    return found


def vanishing_client():
    """BEGIN and a long pipeline of INSERTs, never read; then the socket closes."""
    ports = [metadata_port] + worker_ports()
    already = {node: {row[0] for row in rows_} for node, rows_ in stuck_backends(ports).items()}
    if already:
        note(f"backends waiting before the test (ignored): {already}")
    base, count, filler = 6_000_000, 10_000, "x" * 2000
    raw = Raw()
    batch = [query("BEGIN"), parse("", "INSERT INTO sp_items VALUES ($1, $2) RETURNING v")]
    batch += [bind("", [str(base + i), filler]) + execute() for i in range(count)]
    raw.sock.settimeout(3)
    try:
        raw.send(b"".join(batch))
    except (socket.timeout, OSError):
        pass  # the server stopped reading: it waits for this client to read
    time.sleep(1)

    def new_ones():
        found = {}
        for node, stuck in stuck_backends(ports).items():
            stuck = [row for row in stuck if row[0] not in already.get(node, set())]
            if stuck:
                found[node] = stuck
        return found
    note(f"before the client closed: waiting backends {new_ones() or 'none'}")
    raw.close()
    deadline = time.monotonic() + 5
    while True:
        left = new_ones()
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    check("a client that sent BEGIN and a pipeline and never read, then closed: within 5 s no backend "
          "'idle in transaction' or in ClientWrite on any node", not left, f"still there: {left}")
    kept = truth("SELECT count(*) FROM sp_items WHERE id >= %s AND id < %s", (base, base + count))[0][0]
    check("...its transaction rolled back (no row stored)", kept == 0, f"{kept} rows stored")
    started = time.monotonic()
    with connect() as conn:
        read = fetch(conn, "SELECT v FROM sp_items WHERE id = %s", (20,))
        inserted = run_sql(conn, "INSERT INTO sp_items VALUES (6999999, 'served')")
        local = fetch(conn, "SELECT count(*) FROM sp_local WHERE id = 40")
    check("...other clients are still served (a read, an insert, an ordinary table)",
          read == [("world",)] and inserted is None and stored(6999999, 6999999) == [(6999999, "served")]
          and local == [(1,)], f"read {read}, insert {inserted}, ordinary table {local}, "
                               f"in {time.monotonic() - started:.1f} s")


# ---------------------------------------------------------------------------
# 3. Session state.

def backend_pid(conn):
    return value(conn, "SELECT pg_backend_pid()")


def temp_tables():
    with connect() as conn:
        created = run_sql(conn, "CREATE TEMP TABLE sp_tmp (id int, v text)")
        pids = [backend_pid(conn)]
        steps = [run_sql(conn, "INSERT INTO sp_tmp VALUES (1, 'one')"),
                 run_sql(conn, "SELECT v FROM sp_items WHERE id = 10"),
                 run_sql(conn, "SELECT v FROM public.sp_items WHERE id = %s", (20,))]
        pids.append(backend_pid(conn))
        steps.append(run_sql(conn, "INSERT INTO sp_tmp VALUES (%s, %s)", (2, "two")))
        got = fetch(conn, "SELECT id, v FROM sp_tmp ORDER BY id")
        check("temporary table: INSERT and SELECT in later statements",
              created is None and steps == [None] * 4 and got == [(1, "one"), (2, "two")],
              f"CREATE: {created}; then {steps}; SELECT gave {got}")

        def later_transaction():
            with conn.transaction():
                conn.execute("INSERT INTO sp_tmp VALUES (3, 'three')")
                read = conn.execute("SELECT v FROM public.sp_items WHERE id = 10").fetchall()
                count = conn.execute("SELECT count(*) FROM sp_tmp").fetchone()[0]
                pids.append(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
                return count, read
        in_transaction = attempt(later_transaction)
        after = fetch(conn, "SELECT count(*) FROM sp_tmp")
        check("temporary table in a later transaction (with a read of the distributed table)",
              in_transaction == (3, [("hello",)]) and after == [(3,)], f"got {in_transaction}, then {after}")

        def routed_first():
            with conn.transaction():
                conn.execute("SELECT v FROM public.sp_items WHERE id = 20")
                pids.append(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        failed = attempt(routed_first)
        if failed:
            pids.append(failed)
        pids.append(backend_pid(conn))
        check("pg_backend_pid() is the same in every statement of a session with a temporary table",
              len(set(pids)) == 1 and isinstance(pids[0], int), f"pids {pids}")
    with connect() as conn:
        gone = sqlstate_of(lambda: conn.execute("SELECT count(*) FROM sp_tmp"))
    check("temporary table is gone for a new connection (42P01)", gone == "42P01", f"got {gone}")


def sequences():
    """currval and lastval are per session: never another client's value."""
    with metadata() as conn:
        conn.execute("DROP SEQUENCE IF EXISTS sp_seq")
        conn.execute("CREATE SEQUENCE sp_seq")
    seen_by_other, own, rounds = [], [], 50
    try:
        with connect() as a, connect() as b:
            for _ in range(rounds):
                got = value(a, "SELECT nextval('sp_seq')")
                seen_by_other.append((value(b, "SELECT currval('sp_seq')"),
                                      value(b, "SELECT lastval()")))
                own.append((got, value(a, "SELECT currval('sp_seq')"), value(a, "SELECT lastval()")))
            # In a transaction of its own, as PostgreSQL: the value lasts.
            with b.transaction():
                mine = value(b, "SELECT nextval('sp_seq')")
            later = value(b, "SELECT currval('sp_seq')")
    finally:
        with metadata() as conn:
            conn.execute("DROP SEQUENCE IF EXISTS sp_seq")
    leaked = [pair for pair in seen_by_other
              if not all(isinstance(v, str) and "not yet defined" in v for v in pair)]
    check(f"currval/lastval: another client never sees this client's value ({rounds} rounds), "
          "it gets 55000 as in a new session", not leaked, f"the other client saw {leaked[:3]}")
    check("currval/lastval after nextval in the client's next statements (its connection was free)",
          all(n == c == l for n, c, l in own), f"got {[t for t in own if not t[0] == t[1] == t[2]][:3]}")
    check("...and after a transaction of its own", later == mine, f"nextval {mine}, then currval {later}")


def settings():
    with metadata() as conn:
        default = conn.execute("SHOW work_mem").fetchone()[0]
    with connect() as conn:
        def show():
            return value(conn, "SHOW work_mem")
        conn.execute("BEGIN")
        conn.execute("SET work_mem = '7MB'")
        conn.execute("COMMIT")
        seen = [show()]
        run_sql(conn, "SELECT v FROM sp_items WHERE id = 10")
        seen.append(value(conn, "SELECT current_setting('work_mem')"))
        seen.append(show())
        check("SET inside a transaction that commits lasts after COMMIT", seen == ["7MB"] * 3, f"SHOW gave {seen}")
        conn.execute("SET work_mem = '7MB'")  # what the next checks start from
        conn.execute("BEGIN")
        conn.execute("SET work_mem = '5MB'")
        inside = show()
        conn.execute("ROLLBACK")
        after = show()
        check("SET inside a transaction that rolls back is undone", (inside, after) == ("5MB", "7MB"),
              f"inside {inside}, after ROLLBACK {after}")
        conn.execute("BEGIN")
        conn.execute("SET LOCAL work_mem = '11MB'")
        inside = show()
        conn.execute("COMMIT")
        after = show()
        check("SET LOCAL ends with its transaction", (inside, after) == ("11MB", "7MB"),
              f"inside {inside}, after COMMIT {after}")
        conn.execute("SELECT set_config('work_mem', '9MB', false)")
        run_sql(conn, "SELECT v FROM sp_items WHERE id = 20")
        seen = [show(), show()]
        check("set_config(..., false) lasts for the session", seen == ["9MB", "9MB"], f"SHOW gave {seen}")
        fresh = []
        for _ in range(3):
            with connect() as other:
                fresh.append(value(other, "SHOW work_mem"))
        check(f"other connections keep the default work_mem ({default})", fresh == [default] * 3, f"got {fresh}")


def wait_for_notification(raw, timeout):
    """NotificationResponses that arrive while the connection is idle."""
    deadline = time.monotonic() + timeout
    found = []
    try:
        while True:
            item = raw.next(deadline)
            if item is None:
                break
            if item[0] == b"A":
                found.extend(notifications_in([item]))
                deadline = min(deadline, time.monotonic() + 0.2)  # and any right behind it
    except TimeoutError:
        pass
    return found


def notifications_in(messages):
    out = []
    for tag, body in messages:
        if tag == b"A":
            channel, payload = body[4:].split(b"\0")[:2]
            out.append((struct.unpack("!i", body[:4])[0], channel.decode(), payload.decode()))
    return out


def listen_notify():
    listener = Raw()
    early = notifications_in(listener.run("LISTEN sp_chan") + listener.run("SELECT v FROM sp_items WHERE id = 10")
                             + listener.run("SELECT 1"))
    # A notification names its sender by the process id a client knows it
    # by: that of the sender's BackendKeyData (psycopg's info.backend_pid).
    own_pid = listener.key_pid
    with connect() as notifier:
        notifier.execute("SELECT pg_notify('sp_chan', 'from another')")
        notifier_pid = notifier.info.backend_pid
        got = early + wait_for_notification(listener, 5)
        check("LISTEN: a NOTIFY of another connection reaches the idle listener (its BackendKeyData pid, "
              "channel, payload)",
              got == [(notifier_pid, "sp_chan", "from another")], f"got {got}, notifier pid {notifier_pid}")
        notifier.execute("BEGIN")
        notifier.execute("NOTIFY sp_chan, 'rolled back'")
        notifier.execute("ROLLBACK")
        notifier.execute("NOTIFY sp_chan, 'after the rollback'")
        got = wait_for_notification(listener, 5)
        check("LISTEN: a rolled-back NOTIFY is not delivered, the next one is",
              [payload for _, _, payload in got] == ["after the rollback"], f"got {got}")
        own = notifications_in(listener.run("NOTIFY sp_chan, 'own'")) + wait_for_notification(listener, 0.5)
        check("LISTEN: the listener's own NOTIFY reaches it", own == [(own_pid, "sp_chan", "own")],
              f"got {own}, own pid {own_pid}")
        listener.run("UNLISTEN sp_chan")
        notifier.execute("NOTIFY sp_chan, 'too late'")
        late = wait_for_notification(listener, 1) + notifications_in(listener.run("SELECT 1"))
        check("UNLISTEN: nothing more arrives", late == [], f"got {late}")
    listener.close()


def sql_prepare():
    with connect() as conn:
        prepared = run_sql(conn, "PREPARE sp_q (bigint) AS SELECT v FROM sp_items WHERE id = $1")
        run_sql(conn, "SELECT 1")
        run_sql(conn, "SELECT v FROM sp_items WHERE id = 20")
        first = fetch(conn, "EXECUTE sp_q (10)")
        conn.execute("BEGIN")
        second = fetch(conn, "EXECUTE sp_q (20)")
        conn.execute("ROLLBACK")
        listed = fetch(conn, "SELECT statement FROM pg_prepared_statements WHERE name = 'sp_q'")
        check("SQL PREPARE, then EXECUTE in later statements and in a transaction",
              prepared is None and first == [("hello",)] and second == [("world",)]
              and isinstance(listed, list) and len(listed) == 1,
              f"PREPARE {prepared}; EXECUTE gave {first}, {second}; pg_prepared_statements {listed}")
        deallocated = run_sql(conn, "DEALLOCATE sp_q")
        gone = sqlstate_of(lambda: conn.execute("EXECUTE sp_q (10)"))
        check("DEALLOCATE, then EXECUTE fails (26000)", deallocated is None and gone == "26000",
              f"DEALLOCATE {deallocated}; EXECUTE gave {gone}")


def hold_cursor():
    with connect() as conn:
        conn.execute("BEGIN")
        declared = run_sql(conn, "DECLARE sp_cur CURSOR WITH HOLD FOR "
                                 "SELECT id FROM sp_items WHERE id IN (10, 20, 30) ORDER BY id")
        conn.execute("COMMIT")
        run_sql(conn, "SELECT v FROM sp_items WHERE id = 10")
        first = fetch(conn, "FETCH 1 FROM sp_cur")
        run_sql(conn, "SELECT 1")
        rest = fetch(conn, "FETCH ALL FROM sp_cur")
        closed = run_sql(conn, "CLOSE sp_cur")
        check("WITH HOLD cursor survives its transaction",
              (declared, first, rest, closed) == (None, [(10,)], [(20,), (30,)], None),
              f"DECLARE {declared}; FETCH 1 gave {first}, FETCH ALL {rest}; CLOSE {closed}")


def advisory_lock():
    with connect() as holder:
        locked = value(holder, "SELECT pg_advisory_lock(770011)")
        run_sql(holder, "SELECT v FROM sp_items WHERE id = 10")
        run_sql(holder, "SELECT 1")
        held = value(holder, """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                                AND objid = 770011 AND pid = pg_backend_pid()""")
        with connect() as other, metadata() as direct:
            via = value(other, "SELECT pg_try_advisory_lock(770011)")
            on_metadata = value(direct, "SELECT pg_try_advisory_lock(770011)")
            check("session advisory lock held across statements: another connection cannot take it",
                  held == 1 and via is False and on_metadata is False,
                  f"lock {locked!r}; holder's pg_locks rows {held}; another connection got {via}, "
                  f"one on the metadata node {on_metadata}")
            other.execute("SELECT pg_advisory_unlock_all()")
            direct.execute("SELECT pg_advisory_unlock_all()")
            unlocked = value(holder, "SELECT pg_advisory_unlock(770011)")
            taken = value(other, "SELECT pg_try_advisory_lock(770011)")
            other.execute("SELECT pg_advisory_unlock_all()")
            check("...released by its holder, then another connection takes it", unlocked is True and taken is True,
                  f"unlock gave {unlocked}, then another connection got {taken}")


def key_on_each_worker(low, high, dbname=database):
    """{worker port: the smallest id in [low, high] whose shard of sp_items is there}."""
    return dict(truth(
        """SELECT DISTINCT ON (s.port) s.port, id FROM generate_series(%s::bigint, %s::bigint) id
           JOIN pg_shard.shards s ON s.table_name = 'sp_items'::regclass
            AND pg_shard.keyspace_id(id) BETWEEN s.range_start AND s.range_end
           ORDER BY s.port, id""", (low, high), dbname))


def role_probe(conn, keys, rounds):
    """What a connection meets, `rounds` times: current_user (in autocommit and
    in a transaction), and for a key on each worker a read, an UPDATE and a
    transaction's read, and a read of the ordinary table (SQLSTATE or None)."""
    def state(sql, params=None):
        def action():
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if sql.startswith("SELECT") else None
        return sqlstate_of(action)

    def in_transaction(sql, params=None):
        def action():
            with conn.transaction():
                return conn.execute(sql, params).fetchall()
        return attempt(action)
    seen = set()
    for _ in range(rounds):
        seen.add(("current_user", value(conn, "SELECT current_user")))
        seen.add(("current_user in a transaction", str(in_transaction("SELECT current_user"))))
        for key in keys:
            seen.add((f"read of id {key}", state("SELECT v FROM sp_items WHERE id = %s", (key,))))
            seen.add((f"update of id {key}", state("UPDATE sp_items SET v = 'role probe' WHERE id = %s", (key,))))
            seen.add((f"read of id {key} in a transaction",
                      str(in_transaction("SELECT v FROM sp_items WHERE id = %s", (key,)))))
        seen.add(("read of sp_local", state("SELECT count(*) FROM sp_local")))
    return seen


def set_role():
    """SET ROLE lasts for its session and only there. The other sessions run many
    statements, so that they meet every pooled connection a proxy might hand out."""
    global role_leaked
    role_database()
    keys = sorted(key_on_each_worker(7000, 7999, ROLE_DATABASE).values())
    with metadata(ROLE_DATABASE) as conn:
        for key in keys:
            conn.execute("INSERT INTO sp_items VALUES (%s, 'role probe') ON CONFLICT DO NOTHING", (key,))
    clean = {("current_user", "postgres"), ("current_user in a transaction", "[('postgres',)]"),
             ("read of sp_local", None)}
    for key in keys:
        clean |= {(f"read of id {key}", None), (f"update of id {key}", None),
                  (f"read of id {key} in a transaction", "[('role probe',)]")}
    with connect(dbname=ROLE_DATABASE) as conn:
        conn.execute("SET ROLE sp_role")
        who = fetch(conn, "SELECT current_user, session_user")
        check("SET ROLE: current_user in the next statement", who == [("sp_role", "postgres")], f"got {who}")
        denied = [sqlstate_of(lambda: conn.execute("SELECT v FROM public.sp_items WHERE id = 10")),
                  sqlstate_of(lambda: conn.execute("SELECT v FROM public.sp_items WHERE id = %s", (20,)))]
        denied += [sqlstate_of(lambda: conn.execute("SELECT v FROM public.sp_items WHERE id = %s", (key,)))
                   for key in keys]
        denied.append(sqlstate_of(lambda: conn.execute("SELECT v FROM sp_local WHERE id = 40")))
        check("SET ROLE: the role's privileges apply (no SELECT on sp_items, sp_local: 42501)",
              denied == ["42501"] * len(denied), f"got {denied}")
        with connect(dbname=ROLE_DATABASE) as meanwhile:
            other = role_probe(meanwhile, keys, 25)
        check("SET ROLE: not seen by another connection at the same time (25 rounds of statements)",
              other == clean, f"met {sorted(other - clean, key=str)}")
        still = fetch(conn, "SELECT current_user")
    after = set()
    for _ in range(5):
        with connect(dbname=ROLE_DATABASE) as conn:
            after |= role_probe(conn, keys, 5)
    check("SET ROLE: after its session ends, new connections are postgres and may read sp_items and sp_local",
          after == clean and still == [("sp_role",)], f"met {sorted(after - clean, key=str)}; "
                                                       f"the SET ROLE session then had {still}")
    role_leaked = other != clean or after != clean
    if role_leaked:
        note(f"SET ROLE leaked into other sessions (of database {ROLE_DATABASE}): sp_role is not dropped")


def prepared_after_ddl():
    insert = "INSERT INTO sp_ddl (id, v) VALUES (%s, %s)"
    select_v = "SELECT id, v FROM sp_ddl WHERE id = %s"
    star = "SELECT * FROM sp_ddl WHERE id = %s"
    with connect() as conn, connect() as ddl:
        before = (run_sql(conn, insert, (1, "one"), prepare=True), fetch(conn, select_v, (1,), prepare=True),
                  fetch(conn, star, (1,), prepare=True))
        altered = run_sql(ddl, "ALTER TABLE sp_ddl ADD COLUMN extra int")
        inserted = run_sql(conn, insert, (2, "two"), prepare=True)
        selected = fetch(conn, select_v, (2,), prepare=True)
        check("prepared statements keep working after ALTER TABLE ADD COLUMN on their table",
              before == (None, [(1, "one")], [(1, "one")]) and altered is None and inserted is None
              and selected == [(2, "two")] and stored(1, 2, "sp_ddl") == [(1, "one"), (2, "two")],
              f"before {before}, ALTER {altered}, insert {inserted}, select {selected}, "
              f"stored {stored(1, 2, 'sp_ddl')}")
        changed = fetch(conn, star, (1,), prepare=True)
        # PostgreSQL's answer where the statement is still prepared on the
        # connection; prepared anew on another one, the new columns.
        check("prepared SELECT * after ADD COLUMN: 0A000 cached plan must not change result type, "
              "or the new columns where it was prepared anew",
              changed in ("FeatureNotSupported 0A000: cached plan must not change result type",
                          [(1, "one", None)]), f"got {changed}")
        conn.execute("SET work_mem = '6MB'")
        discarded = run_sql(conn, "DISCARD ALL")
        after = sqlstate_of(lambda: conn.execute(select_v, (1,), prepare=True))
        reset = value(conn, "SHOW work_mem")
        listed = value(conn, "SELECT count(*) FROM pg_prepared_statements")
        check("DISCARD ALL drops psycopg's prepared statements (26000 on the next use, as PostgreSQL) and "
              "resets settings", discarded is None and after == "26000" and reset != "6MB" and listed == 0,
              f"DISCARD ALL {discarded}; next use {after}, work_mem {reset}, pg_prepared_statements {listed} rows")
    raw = Raw()
    raw.send(parse("sp_stmt", "SELECT v FROM sp_items WHERE id = $1") + sync())
    raw.until_ready()
    raw.send(bind("sp_stmt", ["10"]) + execute() + sync())
    first = rows(raw.until_ready())
    raw.run("DISCARD ALL")
    raw.send(bind("sp_stmt", ["10"]) + execute() + sync())
    messages = raw.until_ready()
    after = raw.run("SELECT 1")
    check("raw protocol: a named statement is gone after DISCARD ALL (Bind: 26000), the connection works",
          first == [["hello"]] and [e.get("C") for e in errors(messages)] == ["26000"] and rows(after) == [["1"]],
          f"before {first}, after: {tags(messages)} {errors(messages)} {rows(messages)}, then {tags(after)}")
    raw.close()


def metadata_pool_size():
    """The size of the coordinator's pool of connections to the metadata node
    for this database and user (SHOW POOLS); None directly against PostgreSQL."""
    with connect() as conn:
        pools = fetch(conn, "SHOW POOLS")
    if not isinstance(pools, list):
        return None
    sizes = [int(row[4]) for row in pools
             if row[:4] == (database, "postgres", f"127.0.0.1:{metadata_port}", "transaction")]
    return sizes[0] if sizes else None


def connection_limits():
    """A role's CONNECTION LIMIT holds for its clients, as on the server, and
    clients that left do not use it up."""
    with metadata() as conn:
        conn.execute("DROP ROLE IF EXISTS sp_limited")
        conn.execute("DROP ROLE IF EXISTS sp_limited_one")
        conn.execute("CREATE ROLE sp_limited LOGIN CONNECTION LIMIT 2")

    def limited():
        return psycopg.connect(host="127.0.0.1", port=port, user="sp_limited", dbname=database,
                               connect_timeout=10, autocommit=True)

    def value_closing(conn, sql):
        # Closed here, not when the garbage collector gets to it: an open
        # client holds its slot, on the coordinator as on the server.
        with conn:
            return value(conn, sql)

    try:
        first, second = limited(), limited()
        both = [value(first, "SELECT 1"), value(second, "SELECT 1")]
        third = attempt(lambda: limited().close())
        second.close()
        replaced = attempt(lambda: value_closing(limited(), "SELECT 2"))
        first.close()
        check("CONNECTION LIMIT 2: two clients are served, a third is refused ('too many connections for role'), "
              "and one may come once one left",
              both == [1, 1] and isinstance(third, str)
              and 'too many connections for role "sp_limited"' in third and replaced == 2,
              f"two: {both}; third: {third}; after one left: {replaced}")
        rounds = []
        for _ in range(4):
            pair = [limited(), limited()]
            rounds.append([value(c, "SELECT 3") for c in pair])
            for c in pair:
                c.close()
        check("CONNECTION LIMIT 2: four rounds of two new clients after others left are all served",
              rounds == [[3, 3]] * 4, f"got {rounds}")
        # A role the coordinator has no pool for yet: its first login must
        # not take a second connection (the limit is 1).
        with metadata() as conn:
            conn.execute("CREATE ROLE sp_limited_one LOGIN CONNECTION LIMIT 1")
        alone = []
        for n in range(3):
            alone.append(attempt(lambda: value_closing(
                psycopg.connect(host="127.0.0.1", port=port, user="sp_limited_one", dbname=database,
                                connect_timeout=10, autocommit=True), f"SELECT {n}")))
            time.sleep(0.1)  # the server's backend of the one before has ended
        check("CONNECTION LIMIT 1, a role's first clients one after another: each is served",
              alone == [0, 1, 2], f"got {alone}")
    finally:
        time.sleep(0.2)
        with metadata() as conn:
            # Pooled connections of the roles may remain; they end with the roles.
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                         "WHERE usename IN ('sp_limited', 'sp_limited_one')")
            conn.execute("DROP ROLE IF EXISTS sp_limited")
            conn.execute("DROP ROLE IF EXISTS sp_limited_one")


def search_paths():
    """Unqualified names mean what the node resolves them to, whatever sets the
    search_path: the role's or the database's default, startup options, SET
    and RESET. sp_tenant.sp_items is an ordinary table on the metadata node
    named like the distributed public.sp_items."""
    key = 31001
    quoted_db = psycopg.sql.Identifier(database)
    with metadata() as conn:
        conn.execute("CREATE SCHEMA IF NOT EXISTS sp_tenant")
        conn.execute("CREATE SCHEMA IF NOT EXISTS sp_empty")
        conn.execute("DROP TABLE IF EXISTS sp_tenant.sp_items")
        conn.execute("CREATE TABLE sp_tenant.sp_items (id bigint PRIMARY KEY, v text)")
        conn.execute("INSERT INTO sp_tenant.sp_items VALUES (%s, 'tenant')", (key,))
        conn.execute("DELETE FROM public.sp_items WHERE id = %s", (key,))
        conn.execute("INSERT INTO public.sp_items VALUES (%s, 'public')", (key,))
    time.sleep(1.5)  # the coordinator's map learns of the shadowing table

    def read_and_write(label, **kwargs):
        """The value read by an unqualified name, and where an INSERT landed."""
        inserted = key + 1 + len(label)
        with connect(**kwargs) as conn:
            shown = value(conn, "SHOW search_path")
            read = value(conn, "SELECT v FROM sp_items WHERE id = %s", (key,))
            read_prepared = fetch(conn, "SELECT v FROM sp_items WHERE id = %s", (key,), prepare=True)
            written = run_sql(conn, "INSERT INTO sp_items VALUES (%s, %s)", (inserted, label))
        where = truth("SELECT (SELECT count(*) FROM sp_tenant.sp_items WHERE id = %s), "
                      "(SELECT count(*) FROM public.sp_items WHERE id = %s)", (inserted, inserted))[0]
        with metadata() as conn:
            conn.execute("DELETE FROM sp_tenant.sp_items WHERE id = %s", (inserted,))
            conn.execute("DELETE FROM public.sp_items WHERE id = %s", (inserted,))
        return shown, read, read_prepared, written, tuple(where)

    tenant = ("tenant", [("tenant",)], None, (1, 0))
    try:
        with metadata() as conn:
            conn.execute(psycopg.sql.SQL("ALTER ROLE postgres IN DATABASE {} SET search_path = sp_tenant, public")
                         .format(quoted_db))
        got = read_and_write("role")
        check("ALTER ROLE … IN DATABASE … SET search_path: reads and writes the role's sp_tenant.sp_items",
              got[1:] == tenant, f"got {got}")
        with metadata() as conn:
            conn.execute(psycopg.sql.SQL("ALTER ROLE postgres IN DATABASE {} RESET search_path").format(quoted_db))
            conn.execute(psycopg.sql.SQL("ALTER DATABASE {} SET search_path = sp_tenant, public").format(quoted_db))
        got = read_and_write("database")
        check("ALTER DATABASE … SET search_path: reads and writes sp_tenant.sp_items",
              got[1:] == tenant, f"got {got}")
        with metadata() as conn:
            conn.execute(psycopg.sql.SQL("ALTER DATABASE {} RESET search_path").format(quoted_db))
        got = read_and_write("options", options="-c search_path=sp_tenant,public")
        check("options -c search_path: reads and writes sp_tenant.sp_items", got[1:] == tenant, f"got {got}")
        got = read_and_write("empty", options="-c search_path=sp_empty,public")
        check("a search_path whose first schema has no such table: public.sp_items",
              got[1:] == ("public", [("public",)], None, (0, 1)), f"got {got}")
        with connect(options="-c search_path=sp_tenant,public") as conn:
            before = value(conn, "SELECT v FROM sp_items WHERE id = %s", (key,))
            conn.execute("SET search_path = public")
            after_set = value(conn, "SELECT v FROM sp_items WHERE id = %s", (key,))
            conn.execute("RESET search_path")
            after_reset = value(conn, "SELECT v FROM sp_items WHERE id = %s", (key,))
            conn.execute("SET search_path = public")
            conn.execute("RESET ALL")
            after_reset_all = value(conn, "SELECT v FROM sp_items WHERE id = %s", (key,))
            conn.execute("SET search_path = public")
            conn.execute("DISCARD ALL")
            after_discard = value(conn, "SELECT v FROM sp_items WHERE id = %s", (key,))
            path_after = value(conn, "SHOW search_path")
        check("SET search_path, then RESET, RESET ALL and DISCARD ALL go back to the startup search_path",
              (before, after_set, after_reset, after_reset_all, after_discard) ==
              ("tenant", "public", "tenant", "tenant", "tenant") and path_after == "sp_tenant,public",
              f"got {before}, {after_set}, {after_reset}, {after_reset_all}, {after_discard}; "
              f"search_path {path_after}")
    finally:
        with metadata() as conn:
            conn.execute(psycopg.sql.SQL("ALTER ROLE postgres IN DATABASE {} RESET search_path").format(quoted_db))
            conn.execute(psycopg.sql.SQL("ALTER DATABASE {} RESET search_path").format(quoted_db))
            conn.execute("DROP SCHEMA sp_tenant CASCADE")
            conn.execute("DROP SCHEMA sp_empty CASCADE")
            conn.execute("DELETE FROM public.sp_items WHERE id = %s", (key,))


def prepared_visibility():
    """Statements a client prepared are not in another's pg_prepared_statements,
    even on the server connection it left them on."""
    secret = "SELECT count(*) FROM sp_local WHERE id = %s AND v <> 'sp_secret_text'"
    listing = "SELECT count(*), coalesce(string_agg(statement, ' | '), '') FROM pg_prepared_statements"
    with connect() as owner:
        kept = [fetch(owner, secret, (-key,), prepare=True) for key in range(1, 4)]
        # As many clients in transactions at once as the pool has
        # connections: one of them gets the one the owner left its
        # statements on. (Connected first: logins add idle connections.)
        size = metadata_pool_size()
        count = size or 8
        seen, own = [], []
        others = [connect() for _ in range(count)]
        try:
            for other in others:
                other.execute("BEGIN")
                seen.append(tuple(fetch(other, listing)[0]))
            for other in others:
                other.execute("COMMIT")
            for other in others[:2]:
                fetch(other, "SELECT count(*) FROM sp_local WHERE id = %s", (-1,), prepare=True)
                own.append(fetch(other, listing)[0][0])
        finally:
            for other in others:
                other.close()
        check(f"pg_prepared_statements: another client's prepared statements are not listed "
              f"({count} clients at once, the pool's size: {size})",
              seen == [(0, "")] * count, f"got {seen}")
        check("pg_prepared_statements: a client's own prepared statement is listed",
              own == [1, 1], f"got {own}")
        again = fetch(owner, secret, (-2,), prepare=True)
        check("a client's prepared statement still works after its server connection served others",
              kept == [[(0,)]] * 3 and again == [(0,)], f"before {kept}, after {again}")


PG15_REPORTED = {"application_name", "client_encoding", "DateStyle", "default_transaction_read_only",
                 "in_hot_standby", "integer_datetimes", "IntervalStyle", "is_superuser", "server_encoding",
                 "server_version", "session_authorization", "standard_conforming_strings", "TimeZone"}


def parameter_status():
    with metadata() as conn:
        default_zone = conn.info.parameter_status("TimeZone")
    raw, direct = Raw(), Raw(metadata_port)
    missing = PG15_REPORTED - set(raw.parameters)
    differ = {k: (raw.parameters.get(k), v) for k, v in direct.parameters.items() if raw.parameters.get(k) != v}
    check("startup ParameterStatus: every parameter PostgreSQL 15 reports, with the metadata node's values",
          not missing and not differ, f"missing {sorted(missing)}, different (here, metadata node) {differ}")
    raw.close()
    direct.close()
    with connect() as conn:
        plain = (conn.info.parameter_status("application_name"), value(conn, "SHOW application_name"))
    with connect(application_name="sp_app") as conn:
        named = (conn.info.parameter_status("application_name"), value(conn, "SHOW application_name"))
    check("ParameterStatus application_name: '' when none given, else the given name",
          plain == ("", "") and named == ("sp_app", "sp_app"),
          f"(ParameterStatus, SHOW) none given: {plain}, sp_app given: {named}")
    with connect() as changer:
        changer.execute("SET TimeZone = 'Asia/Tokyo'")
        changer.execute("SET application_name = 'sp_changed'")
        reported = (changer.info.parameter_status("TimeZone"), changer.info.parameter_status("application_name"))
        check("SET TimeZone / application_name: ParameterStatus reports the new values",
              reported == ("Asia/Tokyo", "sp_changed"), f"got {reported}")
        changer.execute("BEGIN")
        changer.execute("SET application_name = 'sp_in_transaction'")
        inside = changer.info.parameter_status("application_name")
        changer.execute("ROLLBACK")
        after = changer.info.parameter_status("application_name")
        check("ROLLBACK of a SET: ParameterStatus reports the value restored",
              (inside, after) == ("sp_in_transaction", "sp_changed"), f"inside {inside}, after ROLLBACK {after}")
        run_sql(changer, "SELECT v FROM sp_items WHERE id = 10")
        fresh = []
        for _ in range(3):
            with connect() as conn:
                fresh.append((conn.info.parameter_status("TimeZone"), conn.info.parameter_status("application_name"),
                              value(conn, "SHOW TimeZone"), value(conn, "SHOW application_name")))
        check(f"after another client's SET, fresh connections report the defaults ({default_zone}, '')",
              fresh == [(default_zone, "", default_zone, "")] * 3,
              f"(ParameterStatus TimeZone, application_name, SHOW TimeZone, application_name) {fresh}")


# ---------------------------------------------------------------------------
# 4. Client encodings.

TEXT = "é€"  # LATIN9 e9 a4, UTF-8 c3 a9 e2 82 ac


def encodings():
    with connect(client_encoding="latin9") as conn:
        reported = conn.info.parameter_status("client_encoding")
        check("client_encoding=latin9: ParameterStatus client_encoding is LATIN9", reported == "LATIN9",
              f"got {reported!r}")
        steps = [run_sql(conn, f"INSERT INTO {table} VALUES (2001, 'é€')") for table in ("sp_items", "sp_local")]
        back = [value(conn, f"SELECT v FROM {table} WHERE id = 2001 AND v = 'é€'")
                for table in ("sp_items", "sp_local")]
        check("client_encoding=latin9: 'é€' by literal round-trips (distributed and ordinary table)",
              steps == [None, None] and back == [TEXT] * 2, f"INSERTs {steps}, read back {back!r}")
    with connect(client_encoding="latin9") as conn:
        steps = [run_sql(conn, f"INSERT INTO {table} VALUES (%s, %s)", (2002, TEXT))
                 for table in ("sp_items", "sp_local")]
        back = [value(conn, f"SELECT v FROM {table} WHERE id = %s AND v = %s", (2002, TEXT))
                for table in ("sp_items", "sp_local")]
        check("client_encoding=latin9: 'é€' by parameter round-trips (distributed and ordinary table)",
              steps == [None, None] and back == [TEXT] * 2, f"INSERTs {steps}, read back {back!r}")
    utf8 = [truth(f"SELECT id, v, octet_length(v) FROM {table} WHERE id IN (2001, 2002) ORDER BY id")
            for table in ("sp_items", "sp_local")]
    check("client_encoding=latin9: stored as UTF-8 'é€' (5 bytes)", utf8 == [[(2001, TEXT, 5), (2002, TEXT, 5)]] * 2,
          f"the metadata node reads {utf8!r}")
    with connect(client_encoding="latin9") as conn:
        steps = [run_sql(conn, "INSERT INTO sp_names VALUES (%s, 1)", (TEXT,)),
                 run_sql(conn, "INSERT INTO sp_names VALUES ('€uro', 2)")]
        keyed = [fetch(conn, "SELECT n FROM sp_names WHERE name = %s", (TEXT,)),
                 fetch(conn, "SELECT n FROM sp_names WHERE name = '€uro'"),
                 fetch(conn, "SELECT n FROM sp_names WHERE name = %s", ("€uro",))]
    direct = truth("SELECT name, n FROM sp_names ORDER BY n")
    check("client_encoding=latin9: rows with a non-ASCII text distribution key are stored and found",
          steps == [None, None] and keyed == [[(1,)], [(2,)], [(2,)]] and direct == [(TEXT, 1), ("€uro", 2)],
          f"INSERTs {steps}, reads {keyed}, the metadata node has {direct!r}")
    with metadata() as conn:  # rows written in UTF-8, for the checks below
        conn.execute("INSERT INTO sp_items VALUES (2003, '日本'), (2006, 'é€')")
        conn.execute("INSERT INTO sp_local VALUES (2003, '日本')")
    with connect(client_encoding="latin9") as conn:
        untranslatable = [sqlstate_of(lambda t=t: conn.execute(f"SELECT v FROM {t} WHERE id = 2003").fetchall())
                          for t in ("sp_items", "sp_local")]
    check("client_encoding=latin9: a character LATIN9 lacks is an error (22P05)",
          untranslatable == ["22P05", "22P05"], f"got {untranslatable}")
    with connect(options="-c client_encoding=LATIN9") as conn:
        by_option = (conn.info.parameter_status("client_encoding"),
                     value(conn, "SELECT v FROM sp_items WHERE id = 2006"))
    check("options='-c client_encoding=LATIN9': reported and converted", by_option == ("LATIN9", TEXT),
          f"got {by_option!r}")
    with connect(client_encoding="utf-8") as conn:
        spelled = (conn.info.parameter_status("client_encoding"), value(conn, "SHOW client_encoding"))
        conn.execute("SET client_encoding = 'latin9'")
        switched = (conn.info.parameter_status("client_encoding"),
                    value(conn, "SELECT v FROM sp_items WHERE id = 2006"),
                    attempt(lambda: conn.pgconn.exec_(b"SELECT v FROM sp_items WHERE id = 2006").get_value(0, 0)))
    check("client_encoding 'utf-8' is reported as UTF8 (ParameterStatus and SHOW)", spelled == ("UTF8", "UTF8"),
          f"got {spelled}")
    check("SET client_encoding = 'latin9' mid-session: reported, and values converted (é€ = e9 a4)",
          switched == ("LATIN9", TEXT, b"\xe9\xa4"), f"got {switched!r}")
    utf8_bytes = TEXT.encode()
    with connect(client_encoding="SQL_ASCII") as conn:
        reported = conn.info.parameter_status("client_encoding")

        def named():
            cur = conn.execute(b'SELECT v AS "\xc3\xa9" FROM sp_items WHERE id = 2006')
            return cur.pgresult.fname(0), cur.fetchall()
        answer = attempt(named)
        keyed = fetch(conn, b"SELECT n FROM sp_names WHERE name = '" + utf8_bytes + b"'")
        param = fetch(conn, "SELECT v FROM sp_items WHERE id = %s", (2006,))
        inserted = run_sql(conn, b"INSERT INTO sp_items VALUES (2004, '" + utf8_bytes + b"')")
    invalid = []
    for statement in (b"SELECT '\xe9'::text", b"INSERT INTO sp_items VALUES (2005, '\xe9')"):
        with connect(client_encoding="SQL_ASCII") as conn:
            invalid.append(fetch(conn, statement))
    check("client_encoding SQL_ASCII: reported as SQL_ASCII", reported == "SQL_ASCII", f"got {reported!r}")
    check("client_encoding SQL_ASCII: names and strings come as the database's bytes (psycopg gives bytes)",
          answer == (b"\xc3\xa9", [(utf8_bytes,)]) and keyed == [(1,)] and param == [(utf8_bytes,)],
          f"got {answer!r}, key lookup {keyed}, by parameter {param!r}")
    check("client_encoding SQL_ASCII: UTF-8 bytes are stored as they are; invalid UTF-8 is refused (22021)",
          inserted is None and stored(2004, 2004) == [(2004, TEXT)] and len(invalid) == 2 and all(
              str(got).startswith('CharacterNotInRepertoire 22021: invalid byte sequence for encoding "UTF8": 0xe9')
              for got in invalid) and stored(2005, 2005) == [],
          f"INSERT {inserted}, stored {stored(2004, 2005)!r}, invalid bytes gave {invalid}")


# ---------------------------------------------------------------------------
# 5. Backend identity and errors.

def replication_and_fast_path():
    # A replication connection (replication=database) is the metadata node's
    # walsender: IDENTIFY_SYSTEM answers with the node's system id.
    with metadata() as direct:
        system_id = value(direct, "SELECT system_identifier::text FROM pg_control_system()")
        int4pl = int(value(direct, "SELECT 'pg_catalog.int4pl'::regproc::oid"))
    walsender = Raw(replication="database")
    identified = walsender.value("IDENTIFY_SYSTEM")
    walsender.close()
    check("replication connection: IDENTIFY_SYSTEM gives the metadata node's system id",
          identified == system_id, f"got {identified}, expected {system_id}")
    # A fast-path FunctionCall (libpq's large-object functions use it):
    # int4pl(3, 4) with binary arguments and result.
    raw = Raw()
    args = b"".join(struct.pack("!i", 4) + struct.pack("!i", n) for n in (3, 4))
    raw.send(message(b"F", struct.pack("!ihhh", int4pl, 1, 1, 2) + args + struct.pack("!h", 1)))
    answer = raw.until_ready()
    result = [body for tag, body in answer if tag == b"V"]
    check("fast-path FunctionCall: int4pl(3, 4) answers 7, then ReadyForQuery",
          result == [struct.pack("!i", 4) + struct.pack("!i", 7)] and tags(answer).endswith("Z"),
          f"got {tags(answer)} {result} {errors(answer)}")
    check("...and the connection goes on", raw.value("SELECT 6 * 7") == "42")
    raw.close()


def terminate_backend():
    with connect() as conn, metadata() as direct:
        created = run_sql(conn, "CREATE TEMP TABLE sp_tmp5 (id int)")
        pid = backend_pid(conn)
        known = value(direct, "SELECT count(*) FROM pg_stat_activity WHERE pid = %s AND datname = current_database()",
                      (pid,)) if isinstance(pid, int) else 0
        check("pg_backend_pid() of a session with a temporary table is a backend of the metadata node",
              created is None and known == 1,
              f"CREATE {created}; pid {pid} not in the metadata node's pg_stat_activity")
        terminated = known == 1 and value(direct, "SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.5)
        try:
            conn.execute("SELECT count(*) FROM sp_tmp5")
            outcome = "the statement succeeded"
        except psycopg.Error as error:
            outcome = f"{type(error).__name__}: {error}"
        check("pg_terminate_backend: the next statement fails with 'terminating connection due to administrator "
              "command' (OperationalError), connection closed",
              terminated is True and outcome.startswith("OperationalError") and
              "terminating connection due to administrator command" in outcome and conn.closed,
              f"terminated {terminated}; {outcome!r}; closed {conn.closed}")
    raw = Raw()
    raw.run("CREATE TEMP TABLE sp_tmp5 (id int)")
    pid = int(raw.value("SELECT pg_backend_pid()"))
    with metadata() as direct:
        terminated = direct.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE pid = %s AND datname = current_database()", (pid,)).fetchall()
    time.sleep(0.5)
    try:
        raw.send(query("SELECT count(*) FROM sp_tmp5"))
    except OSError:
        pass
    messages = raw.until_ready(5)
    got = [(e.get("S"), e.get("C"), e.get("M")) for e in errors(messages)]
    check("pg_terminate_backend (raw protocol): FATAL 57P01, then the connection closes",
          terminated == [(True,)] and got == [("FATAL", "57P01", "terminating connection due to administrator command")]
          and raw.eof, f"terminated {terminated}; errors {got}; messages {tags(messages)}; closed {raw.eof}")
    raw.close()


def idle_session_timeout():
    with connect() as conn:
        conn.execute("SET idle_session_timeout = '1s'")
        time.sleep(2)
        try:
            conn.execute("SELECT 1")
            outcome = "the statement succeeded"
        except psycopg.Error as error:
            outcome = f"{type(error).__name__}: {error}"
        check("idle_session_timeout = 1s, 2 s idle: the next statement fails with the idle-session timeout, "
              "connection closed", "idle-session timeout" in outcome and conn.closed,
              f"{outcome!r}; closed {conn.closed}")
    fresh = []
    for _ in range(3):
        try:
            with connect() as conn:
                fresh.append((fetch(conn, "SELECT 1"), fetch(conn, "SELECT v FROM sp_items WHERE id = 10")))
        except psycopg.Error as error:
            fresh.append(f"{type(error).__name__}: {error}")
    check("...new connections right after it log in and are served",
          fresh == [([(1,)], [("hello",)])] * 3, f"got {fresh}")
    try:
        raw = Raw()
    except RuntimeError as error:
        check("idle_session_timeout (raw protocol): FATAL 57P05, then the connection closes", False, str(error))
        return
    raw.run("SET idle_session_timeout = '1s'")
    time.sleep(2)
    try:
        raw.send(query("SELECT 1"))
    except OSError:
        pass
    messages = raw.until_ready(5)
    got = [(e.get("S"), e.get("C"), e.get("M")) for e in errors(messages)]
    check("idle_session_timeout (raw protocol): FATAL 57P05, then the connection closes",
          got == [("FATAL", "57P05", "terminating connection due to idle-session timeout")] and raw.eof,
          f"errors {got}; messages {tags(messages)}; closed {raw.eof}")
    raw.close()
    drain_after_idle_timeout()


def drain_after_idle_timeout():
    """A proxy may have pooled server connections that kept the 1 s timeout and
    were closed by their server meanwhile: log in until five logins in a row
    are served, so that such connections fail these logins and not the tests
    that run after this script."""
    time.sleep(1.5)
    failed, served = [], 0
    for _ in range(30):
        try:
            with connect() as conn:
                conn.execute("SELECT 1")
                conn.execute("SELECT v FROM sp_items WHERE id = 10")
            served += 1
            if served == 5:
                break
        except psycopg.Error as error:
            failed.append(str(error).splitlines()[0])
            served = 0
    if failed:
        note(f"after the idle_session_timeout checks {len(failed)} logins failed: {sorted(set(failed))}")


def close_unknown():
    raw = Raw()
    raw.send(close(b"P", "sp_no_such_portal") + sync())
    portal = raw.until_ready()
    raw.send(close(b"S", "sp_no_such_statement") + sync())
    statement = raw.until_ready()
    check("Close of a portal / statement that does not exist: CloseComplete, ReadyForQuery",
          (tags(portal), tags(statement)) == ("3Z", "3Z"), f"got {tags(portal)} {errors(portal)}, "
                                                            f"{tags(statement)} {errors(statement)}")
    raw.send(parse("", "SELECT v FROM sp_items WHERE id = $1") + bind("", ["10"]) + execute()
             + close(b"P", "sp_no_such_portal") + bind("", ["20"]) + execute() + sync())
    messages = raw.until_ready()
    check("...also between statements of one batch, whose answers stay right",
          tags(messages) == "12DC32DCZ" and rows(messages) == [["hello"], ["world"]],
          f"got {tags(messages)} {rows(messages)} {errors(messages)}")
    raw.close()


def flush_batches():
    # pg8000's way in a transaction: every message followed by Flush, Sync
    # only after Parse, Describe and Execute; the Bind comes before its
    # Execute's batch. Each batch must continue the same transaction.
    flush_message = message(b"H")
    raw = Raw()
    began = raw.run("BEGIN")
    raw.send(parse("", "SELECT v FROM sp_items WHERE id = $1", (20,)) + flush_message + sync())
    parsed = raw.until_ready()
    raw.send(message(b"D", b"S" + cstring("")) + flush_message + sync())
    described = raw.until_ready()
    raw.send(bind("", ["10"]) + flush_message + execute() + flush_message + sync())
    executed = raw.until_ready()
    raw.send(execute() + flush_message + sync())
    again = raw.until_ready()
    ended = raw.run("COMMIT")
    check("Flush-separated batches in a transaction (as pg8000 sends them): one transaction, right rows",
          (tags(began), tags(parsed), tags(described), tags(executed), rows(executed), tags(again),
           tags(ended)) == ("CZ", "1Z", "tTZ", "2DCZ", [["hello"]], "CZ", "CZ")
          and began[-1][1] == parsed[-1][1] == executed[-1][1] == b"T",
          f"got {[tags(m) for m in (began, parsed, described, executed, again, ended)]} "
          f"{rows(executed)} {errors(executed + again)}")
    # BEGIN itself that way: bound in one batch, executed in the next.
    raw.send(parse("", "BEGIN") + flush_message + sync())
    parsed = raw.until_ready()
    raw.send(bind("", []) + flush_message)
    raw.send(execute() + flush_message + sync())
    began = raw.until_ready()
    ended = raw.run("ROLLBACK")
    check("...BEGIN bound in one Flush batch and executed in the next begins the transaction",
          (tags(parsed), tags(began), tags(ended)) == ("1Z", "2CZ", "CZ") and began[-1][1] == b"T",
          f"got {tags(parsed)} {tags(began)} {began[-1:]} {tags(ended)} {errors(began)}")
    raw.close()


# ---------------------------------------------------------------------------

class Timeout(Exception):
    pass


def run(section, seconds):
    """Run a section; one that raises or hangs is a failure, and the next runs."""
    def on_alarm(*_):
        raise Timeout(f"no progress within {seconds} s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        section()
    except Exception as error:
        check(f"{section.__name__}: ran to the end", False, f"{type(error).__name__}: {error}")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


started = time.monotonic()
setup()
wait_for_routing()
chosen = sys.argv[4:]
sections_run = set()
if chosen and "pipelines" not in chosen:  # the rows later sections read
    with metadata() as conn:
        conn.execute("INSERT INTO sp_items VALUES (10, 'hello'), (20, 'world'), (30, 'thirty')")
        conn.execute("INSERT INTO sp_local VALUES (40, 'local 40')")
for section, seconds in [(pipelines, 30), (temp_tables, 15), (settings, 15), (sequences, 15), (listen_notify, 30),
                         (sql_prepare, 15), (hold_cursor, 15), (advisory_lock, 15),
                         (prepared_after_ddl, 20), (prepared_visibility, 20),
                         (parameter_status, 15), (encodings, 20),
                         (long_pipelines, 90), (unread_pipeline, 130), (long_pipeline_across_workers, 60),
                         (vanishing_client, 30),
                         (terminate_backend, 20), (close_unknown, 15), (set_role, 20),
                         (replication_and_fast_path, 15), (flush_batches, 15), (search_paths, 30),
                         (connection_limits, 30),
                         # last: pooled connections a proxy leaves with the timeout die meanwhile
                         (idle_session_timeout, 40)]:
    if not chosen or section.__name__ in chosen:
        sections_run.add(section.__name__)
        run(section, seconds)
teardown()
note(f"{time.monotonic() - started:.0f} s")
sys.exit(1 if check.failures else 0)
