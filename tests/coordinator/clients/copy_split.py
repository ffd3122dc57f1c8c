#!/usr/bin/env python3
"""COPY FROM STDIN into a distributed table through the coordinator, split by
key and streamed to the shards: text, CSV (header, quoted newlines) and
binary; many rows over every worker; a bad row in the middle (the client gets
its line number, nothing is kept anywhere); inside a transaction that rolls
back or commits; and the same data loaded into one PostgreSQL table directly
(the metadata node's own local table) compared row for row.

Usage: copy_split.py COORDINATOR_PORT METADATA_PORT DATABASE"""
import sys

import psycopg
from tap import Checks

coordinator, metadata, database = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
check = Checks("copy")
ROWS = 60000


def connect(port, **kwargs):
    return psycopg.connect(f"host=127.0.0.1 port={port} dbname={database} user=postgres",
                           **kwargs)


def routed_statements():
    """Statements the coordinator sent to workers (its SHOW SHARDS counts)."""
    with connect(coordinator, autocommit=True) as c:
        rows = c.execute("SHOW SHARDS").fetchall()
    return sum(int(row[-1]) for row in rows if row[0] == "public.copy_target")


with connect(coordinator, autocommit=True) as c:
    c.execute("DROP TABLE IF EXISTS copy_target")
    c.execute("DROP TABLE IF EXISTS copy_reference_load")
    c.execute("CREATE TABLE copy_target (id bigint PRIMARY KEY, note text, amount numeric NOT NULL)")
    c.execute("SELECT pg_shard.create_distributed_table('copy_target', 'id', shard_count => 8)")
    # The same table, not distributed: PostgreSQL's own COPY, for comparison.
    c.execute("CREATE TABLE copy_reference_load (id bigint PRIMARY KEY, note text, amount numeric NOT NULL)")
    c.execute("SELECT pg_sleep(1)")


def text_data(first, count, bad_at=None):
    lines = []
    for i in range(first, first + count):
        amount = "oops" if i == bad_at else str(i % 997)
        note = "tab\\there" if i % 5 == 0 else ("back\\\\slash" if i % 7 == 0 else f"row {i}")
        lines.append(f"{i}\t{note}\t{amount}\n")
    return "".join(lines)


def copy_text(port, table, data):
    with connect(port) as conn:
        with conn.cursor() as cur:
            with cur.copy(f"COPY {table} (id, note, amount) FROM STDIN") as copy:
                for start in range(0, len(data), 65536):
                    copy.write(data[start:start + 65536])
        conn.commit()


data = text_data(1, ROWS)
before = routed_statements()
copy_text(coordinator, "copy_target", data)
copy_text(metadata, "copy_reference_load", data)
with connect(metadata, autocommit=True) as c:
    count = c.execute("SELECT count(*) FROM copy_target").fetchone()[0]
    differing = c.execute(
        "SELECT count(*) FROM (SELECT * FROM copy_target EXCEPT SELECT * FROM copy_reference_load "
        "UNION ALL SELECT * FROM copy_reference_load EXCEPT SELECT * FROM copy_target) d").fetchone()[0]
    per_node = c.execute(
        "SELECT count(DISTINCT node_id) FROM pg_shard.shards WHERE table_name = 'copy_target'::regclass"
    ).fetchone()[0]
check(f"text COPY of {ROWS} rows through the coordinator: every row, as PostgreSQL loads them",
      count == ROWS and differing == 0, f"{count} rows, {differing} differ")
check(f"...split to the shards on {per_node} workers (the coordinator ran COPY on them)",
      per_node >= 2 and routed_statements() > before)

# A bad row deep in the data, after batches went to every worker.
bad = 45001
try:
    copy_text(coordinator, "copy_target", text_data(100001, ROWS, bad_at=100000 + bad))
    error = None
except psycopg.Error as e:
    error = e
with connect(metadata, autocommit=True) as c:
    after = c.execute("SELECT count(*) FROM copy_target").fetchone()[0]
    prepared = c.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0]
context = (error.diag.context or "") if error else ""
check("a bad row in the middle: the client gets PostgreSQL's error with its line number",
      error is not None and error.sqlstate == "22P02"
      and f"COPY copy_target, line {bad}, column amount" in context, f"{error!r} {context!r}")
check("...and nothing of the COPY is kept anywhere", after == ROWS and prepared == 0,
      f"{after} rows, {prepared} prepared")

# CSV with a header and quoted newlines; line numbers count them.
csv_data = 'id,note,amount\n200001,"two\nlines",1\n200002,"a ""quote""",2\n200003,x,bad\n'
try:
    with connect(coordinator) as conn:
        with conn.cursor().copy("COPY copy_target FROM STDIN WITH (FORMAT csv, HEADER)") as copy:
            copy.write(csv_data)
    error = None
except psycopg.Error as e:
    error = e
check("CSV: a bad row's line counts the header and quoted newlines (line 5, as PostgreSQL says)",
      error is not None and "line 5" in (error.diag.context or ""),
      repr(error and error.diag.context))
with connect(coordinator) as conn:
    with conn.cursor().copy("COPY copy_target FROM STDIN WITH (FORMAT csv, HEADER)") as copy:
        copy.write(csv_data.replace(",bad", ",3"))
with connect(metadata, autocommit=True) as c:
    notes = c.execute("SELECT note FROM copy_target WHERE id > 200000 ORDER BY id").fetchall()
check("CSV rows with quoted newlines and quotes arrive whole",
      [n[0] for n in notes] == ["two\nlines", 'a "quote"', "x"], repr(notes))

# Binary.
with connect(coordinator) as conn:
    with conn.cursor() as cur:
        with cur.copy("COPY copy_target (id, note, amount) FROM STDIN (FORMAT binary)") as copy:
            copy.set_types(["int8", "text", "numeric"])
            for i in range(300001, 301001):
                copy.write_row((i, f"binary {i}", i % 13))
with connect(metadata, autocommit=True) as c:
    binary_rows = c.execute(
        "SELECT count(*), sum(amount) FROM copy_target WHERE id > 300000").fetchone()
check("binary COPY: every row", binary_rows[0] == 1000
      and binary_rows[1] == sum(i % 13 for i in range(300001, 301001)), repr(binary_rows))

# In a transaction: rolled back, then committed (on several workers: two-phase commit).
with connect(coordinator) as conn:
    with conn.cursor().copy("COPY copy_target (id, note, amount) FROM STDIN") as copy:
        copy.write(text_data(400001, 500))
    conn.execute("UPDATE copy_target SET amount = -1 WHERE id = 400001")
    conn.rollback()
    with conn.cursor().copy("COPY copy_target (id, note, amount) FROM STDIN") as copy:
        copy.write(text_data(400001, 500))
    conn.execute("UPDATE copy_target SET amount = -1 WHERE id = 400001")
    conn.commit()
with connect(metadata, autocommit=True) as c:
    rows = c.execute("SELECT count(*), min(amount) FROM copy_target WHERE id > 400000").fetchone()
check("COPY in a transaction: gone with ROLLBACK, kept with COMMIT (with the transaction's UPDATE)",
      rows == (500, -1), repr(rows))


def copy_out(port, statement):
    with connect(port, autocommit=True) as conn:
        with conn.cursor().copy(statement) as copy:
            return b"".join(bytes(block) for block in copy)


for options in ["", "WITH (FORMAT csv, HEADER)"]:
    through = copy_out(coordinator, f"COPY copy_target TO STDOUT {options}")
    direct = copy_out(metadata, f"COPY (SELECT * FROM copy_target) TO STDOUT {options}")
    lines = through.splitlines()
    check(f"COPY TO STDOUT {options or '(text)'} streamed from the shards: the same rows as the "
          f"metadata node's ({len(lines)} lines)",
          sorted(lines) == sorted(direct.splitlines()) and len(lines) > ROWS
          and (not options or lines[0] == b"id,note,amount"))
binary = copy_out(coordinator, "COPY copy_target (id, amount) TO STDOUT (FORMAT binary)")
binary_direct = copy_out(metadata, "COPY (SELECT id, amount FROM copy_target) TO STDOUT (FORMAT binary)")
check("COPY TO STDOUT (FORMAT binary): one header, one trailer, every row",
      len(binary) == len(binary_direct) and binary.startswith(b"PGCOPY\n\xff\r\n\x00")
      and binary.endswith(b"\xff\xff"), f"{len(binary)} vs {len(binary_direct)} bytes")
with connect(coordinator, autocommit=True) as c:
    c.execute("DROP TABLE copy_target")
    c.execute("DROP TABLE copy_reference_load")
sys.exit(1 if check.failures else 0)
