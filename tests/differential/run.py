#!/usr/bin/env python3
"""Differential test: the same SQL corpus on a plain PostgreSQL database and
through the cluster's metadata node must give the same results.

Usage: run.py METADATA_PORT WORKER_PORT [WORKER_PORT ...]
Creates the databases pg_shard_diff (on every node; distributed) and
pg_shard_diff_plain (metadata node's server only), loads schema.sql, runs
distribute.sql on the cluster database, then corpus.sql in one session per
database, and compares block by block. Then a round of schema changes
(schema_round.sql) runs on both, and the corpus runs and compares again.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MARK = "@@@ block "


def psql(port, database, sql=None, script=None):
    args = ["stdbuf", "-oL", "-eL", "psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(port),
            "-U", "postgres", "-d", database, "-At", "-F", "|", "-P", "null=(null)"]
    if script is not None:
        return subprocess.run(args, input=script, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT).stdout
    subprocess.run(args + ["-v", "ON_ERROR_STOP=1", "-c", sql], check=True,
                   stdout=subprocess.DEVNULL)
    return ""


def blocks():
    with open(os.path.join(HERE, "corpus.sql")) as f:
        text = f.read()
    parts = [p.strip() for p in text.split("\n\n") if p.strip()]
    return [p for p in parts if not all(l.startswith("--") for l in p.splitlines())]


def run_corpus(port, database, corpus):
    script = ["\\set VERBOSITY sqlstate", "\\set SHOW_CONTEXT never"]
    for number, block in enumerate(corpus):
        script.append("\\echo '%s%d'" % (MARK, number))
        script.append(block)
    output = psql(port, database, script="\n".join(script) + "\n")
    results, current = {}, None
    for line in output.splitlines():
        if line.startswith(MARK):
            current = int(line[len(MARK):])
            results[current] = []
        elif current is not None:
            results[current].append(line.replace("psql:<stdin>:", "").split(": ", 1)[-1]
                                    if line.startswith("psql:") else line)
    return results


def setup(metadata, workers):
    """Fresh databases: the schema and rows, distributed on the cluster."""
    for port in [metadata] + workers:
        psql(port, "postgres", "DROP DATABASE IF EXISTS pg_shard_diff WITH (FORCE)")
        psql(port, "postgres", "CREATE DATABASE pg_shard_diff")
    psql(metadata, "postgres", "DROP DATABASE IF EXISTS pg_shard_diff_plain WITH (FORCE)")
    psql(metadata, "postgres", "CREATE DATABASE pg_shard_diff_plain")
    with open(os.path.join(HERE, "schema.sql")) as f:
        schema = f.read()
    psql(metadata, "pg_shard_diff_plain", schema)
    psql(metadata, "pg_shard_diff", "CREATE EXTENSION pg_shard")
    for port in workers:
        psql(metadata, "pg_shard_diff", "SELECT pg_shard.add_node('127.0.0.1', %d)" % port)
    psql(metadata, "pg_shard_diff", schema)
    with open(os.path.join(HERE, "distribute.sql")) as f:
        psql(metadata, "pg_shard_diff", f.read())


def main():
    metadata, workers = int(sys.argv[1]), [int(p) for p in sys.argv[2:]]
    corpus = blocks()
    setup(metadata, workers)
    passed, failed = compare(metadata, corpus, "")
    # The corpus writes; the second run starts from fresh databases too.
    setup(metadata, workers)
    with open(os.path.join(HERE, "schema_round.sql")) as f:
        changes = [l for l in f.read().splitlines() if l.strip() and not l.startswith("--")]
    for statement in changes:
        for database in ("pg_shard_diff_plain", "pg_shard_diff"):
            psql(metadata, database, statement)
    after_passed, after_failed = compare(metadata, corpus, " (after schema changes)")
    passed, failed = passed + after_passed, failed + after_failed
    print("differential: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


def compare(metadata, corpus, label):
    """Run the corpus on both databases; (blocks that agree, blocks that do not)."""
    plain = run_corpus(metadata, "pg_shard_diff_plain", corpus)
    cluster = run_corpus(metadata, "pg_shard_diff", corpus)
    passed = failed = 0
    for number, block in enumerate(corpus):
        compare = "-- no-compare" not in block
        expected, actual = plain.get(number, []), cluster.get(number, [])
        if "-- both-fail" in block:
            both_failed = all(any("ERROR" in line for line in out) for out in (expected, actual))
            expected, actual = (["failed"], ["failed"]) if both_failed else (expected, actual)
        if compare and "ORDER BY" not in block.upper().split("OVER (")[0] and "COPY" not in block:
            expected, actual = sorted(expected), sorted(actual)
        # A statement that fails on plain PostgreSQL proves nothing unless
        # the failure is the point: such blocks say so.
        plain_failed = any("ERROR" in line for line in plain.get(number, []))
        if plain_failed and "-- both-fail" not in block and "-- error" not in block:
            failed += 1
            print("not ok - block %d%s fails on plain PostgreSQL:\n%s" % (number, label, block))
            print("  plain:   %s" % plain.get(number, [])[:12])
            continue
        if not compare or expected == actual:
            passed += 1
            continue
        failed += 1
        print("not ok - block %d%s:\n%s" % (number, label, block))
        print("  plain:   %s" % expected[:12])
        print("  cluster: %s" % actual[:12])
    return passed, failed


if __name__ == "__main__":
    sys.exit(main())
