#!/usr/bin/env python3
"""psycopg 3 against the coordinator: parameters (extended protocol),
prepared statements, binary results, pipelines (executemany), transactions,
COPY, errors with their SQLSTATE, and cancel.

Usage: psycopg_test.py DSN   (prints "ok - ..." lines; exit status 1 on failure)
"""
import sys
import threading
import time

import psycopg
from psycopg import errors
from tap import Checks

dsn = sys.argv[1]
check = Checks("psycopg")


with psycopg.connect(dsn, autocommit=True) as conn:
    cur = conn.cursor()
    cur.execute("SELECT owner FROM accounts WHERE id = %s", (42,))
    check("parameter bound in text", cur.fetchone() == ("owner 42",))
    cur.execute("SELECT owner, balance FROM accounts WHERE id = %s", (7,), binary=True)
    row = cur.fetchone()
    check("binary results", row[0] == "owner 7")
    # prepare=True: a named server-side statement, reused with other values
    owners = []
    for key in (1, 2, 3, 42, 99):
        cur.execute("SELECT owner FROM accounts WHERE id = %s", (key,), prepare=True)
        owners.append(cur.fetchone()[0])
    check("prepared statement reused for keys on every shard",
          owners == ["owner 1", "owner 2", "owner 3", "owner 42", "owner 99"])
    # executemany: a pipeline of binds with keys on several shards
    cur.executemany("INSERT INTO accounts (id, owner, balance) VALUES (%s, %s, %s)",
                    [(3000 + i, "pipelined", i) for i in range(10)])
    cur.execute("SELECT count(*), sum(balance) FROM accounts WHERE owner = 'pipelined'")
    check("executemany through a pipeline", cur.fetchone() == (10, 45))
    # transactions
    with conn.transaction():
        cur.execute("UPDATE accounts SET balance = balance + 1 WHERE id = %s", (3001,))
        cur.execute("SELECT balance FROM accounts WHERE id = %s", (3001,))
        inside = cur.fetchone()[0]
    cur.execute("SELECT balance FROM accounts WHERE id = %s", (3001,))
    check("transaction committed", inside == 2 and cur.fetchone()[0] == 2)
    try:
        with conn.transaction():
            cur.execute("UPDATE accounts SET balance = 1000 WHERE id = %s", (3002,))
            raise RuntimeError("roll back")
    except RuntimeError:
        pass
    cur.execute("SELECT balance FROM accounts WHERE id = %s", (3002,))
    check("transaction rolled back", cur.fetchone()[0] == 2)
    # errors keep their SQLSTATE
    try:
        cur.execute("INSERT INTO accounts VALUES (%s, 'dup', 0)", (42,))
        check("duplicate key refused", False)
    except errors.UniqueViolation as e:
        check("duplicate key: SQLSTATE " + e.diag.sqlstate, e.diag.sqlstate == "23505")
    try:
        cur.execute("SELECT * FROM accounts WHERE id = %s", ("x",))
        check("bad parameter refused", False)
    except psycopg.Error as e:
        check("bad parameter: SQLSTATE " + str(e.diag.sqlstate), e.diag.sqlstate == "22P02")
    cur.execute("SELECT 1")
    check("connection usable after errors", cur.fetchone() == (1,))
    # COPY in and out
    with cur.copy("COPY accounts (id, owner, balance) FROM STDIN") as copy:
        for i in range(5):
            copy.write_row((4000 + i, "copied", 1))
    cur.execute("SELECT count(*) FROM accounts WHERE owner = 'copied'")
    check("COPY FROM STDIN", cur.fetchone() == (5,))
    out = []
    with cur.copy("COPY (SELECT id FROM accounts WHERE owner = 'copied' ORDER BY id) TO STDOUT") as copy:
        for row in copy.rows():
            out.append(int(row[0]))
    check("COPY TO STDOUT", out == [4000, 4001, 4002, 4003, 4004])
    # cancel a running statement
    result = {}

    def sleeper():
        try:
            conn.execute("SELECT pg_sleep(10)")
            result["outcome"] = "finished"
        except errors.QueryCanceled:
            result["outcome"] = "canceled"

    thread = threading.Thread(target=sleeper)
    started = time.time()
    thread.start()
    time.sleep(0.5)
    conn.cancel()
    thread.join()
    check("cancel request stops a running statement (%.1f s)" % (time.time() - started),
          result.get("outcome") == "canceled" and time.time() - started < 5)
    cur.execute("SELECT owner FROM accounts WHERE id = %s", (42,))
    check("connection usable after cancel", cur.fetchone() == ("owner 42",))

sys.exit(1 if check.failures else 0)
