#!/usr/bin/env python3
"""TPC-H on pg_shard against one PostgreSQL: the same data and the 22 queries
in a plain database and in a distributed one; every answer must match.

Usage:
  tpch.py --data DIR --queries FILE --metadata PORT --workers PORT[,PORT...]
          [--repeat N] [--timeout SECONDS] [--report FILE] [--only 1,3,...]

DIR holds the tables as CSV with a header (tpchgen-cli csv); FILE is a TPC-H
query file whose queries each follow a "-- TPC-H <n>" header and end at the
first ';' (sqlglot's test fixture, fetched by run.sh). Both databases live on
the metadata node's server, with its settings: tpch_plain (ordinary tables)
and tpch_cluster (orders and lineitem distributed by order key and
co-located, the other six reference tables).

Prints "ok - q<n> ..." / "not ok - q<n> ..." per query, then
"tpch: N passed, M failed". With --repeat, each query runs N times on each
side (alternating) and the median times are reported, with their ratio and
the geometric mean (--report writes them as JSON too).
"""
import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time

TABLES = {
    "region": "r_regionkey int PRIMARY KEY, r_name char(25) NOT NULL, r_comment varchar(152)",
    "nation": "n_nationkey int PRIMARY KEY, n_name char(25) NOT NULL, n_regionkey int NOT NULL, "
              "n_comment varchar(152)",
    "part": "p_partkey int PRIMARY KEY, p_name varchar(55) NOT NULL, p_mfgr char(25) NOT NULL, "
            "p_brand char(10) NOT NULL, p_type varchar(25) NOT NULL, p_size int NOT NULL, "
            "p_container char(10) NOT NULL, p_retailprice numeric(15,2) NOT NULL, "
            "p_comment varchar(23) NOT NULL",
    "supplier": "s_suppkey int PRIMARY KEY, s_name char(25) NOT NULL, s_address varchar(40) NOT NULL, "
                "s_nationkey int NOT NULL, s_phone char(15) NOT NULL, s_acctbal numeric(15,2) NOT NULL, "
                "s_comment varchar(101) NOT NULL",
    "partsupp": "ps_partkey int NOT NULL, ps_suppkey int NOT NULL, ps_availqty int NOT NULL, "
                "ps_supplycost numeric(15,2) NOT NULL, ps_comment varchar(199) NOT NULL, "
                "PRIMARY KEY (ps_partkey, ps_suppkey)",
    "customer": "c_custkey int PRIMARY KEY, c_name varchar(25) NOT NULL, c_address varchar(40) NOT NULL, "
                "c_nationkey int NOT NULL, c_phone char(15) NOT NULL, c_acctbal numeric(15,2) NOT NULL, "
                "c_mktsegment char(10) NOT NULL, c_comment varchar(117) NOT NULL",
    "orders": "o_orderkey bigint PRIMARY KEY, o_custkey int NOT NULL, o_orderstatus char(1) NOT NULL, "
              "o_totalprice numeric(15,2) NOT NULL, o_orderdate date NOT NULL, "
              "o_orderpriority char(15) NOT NULL, o_clerk char(15) NOT NULL, "
              "o_shippriority int NOT NULL, o_comment varchar(79) NOT NULL",
    "lineitem": "l_orderkey bigint NOT NULL, l_partkey int NOT NULL, l_suppkey int NOT NULL, "
                "l_linenumber int NOT NULL, l_quantity numeric(15,2) NOT NULL, "
                "l_extendedprice numeric(15,2) NOT NULL, l_discount numeric(15,2) NOT NULL, "
                "l_tax numeric(15,2) NOT NULL, l_returnflag char(1) NOT NULL, "
                "l_linestatus char(1) NOT NULL, l_shipdate date NOT NULL, l_commitdate date NOT NULL, "
                "l_receiptdate date NOT NULL, l_shipinstruct char(25) NOT NULL, "
                "l_shipmode char(10) NOT NULL, l_comment varchar(44) NOT NULL, "
                "PRIMARY KEY (l_orderkey, l_linenumber)",
}
DISTRIBUTED = [("orders", "o_orderkey", None), ("lineitem", "l_orderkey", "orders")]
REFERENCE = ["region", "nation", "part", "supplier", "partsupp", "customer"]


def psql(port, database, sql, timeout=None, check=True):
    """Run sql; return (seconds, output lines or None on error, error text)."""
    args = ["psql", "-X", "-q", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-d", database,
            "-At", "-F", "|", "-P", "null=(null)", "-v", "ON_ERROR_STOP=1"]
    started = time.monotonic()
    try:
        done = subprocess.run(args, input=sql, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        return timeout, None, "timed out after %s s" % timeout
    seconds = time.monotonic() - started
    if done.returncode != 0:
        if check:
            sys.exit("psql on port %s, database %s failed: %s" % (port, database, done.stderr.strip()))
        return seconds, None, done.stderr.strip()
    return seconds, done.stdout.splitlines(), ""


def queries(path):
    with open(path) as f:
        text = f.read()
    found = {}
    for match in re.finditer(r"^-- TPC-H (\d+)\s*\n-+\s*\n(.*?;)", text, re.S | re.M):
        # The file is written for sqlglot's dialects: its one non-PostgreSQL
        # spelling is q3's CAST(… AS STRING).
        found[int(match.group(1))] = re.sub(r"\bAS STRING\)", "AS text)", match.group(2))
    if sorted(found) != list(range(1, 23)):
        sys.exit("%s: expected the 22 TPC-H queries, found %s" % (path, sorted(found)))
    return found


def load(port, database, data, schema_only=False):
    sql = ["SET client_min_messages = warning;"]
    for table, columns in TABLES.items():
        sql.append("CREATE TABLE %s (%s);" % (table, columns))
    if not schema_only:
        for table in TABLES:
            sql.append("\\copy %s FROM '%s' WITH (FORMAT csv, HEADER true)"
                       % (table, os.path.join(data, table + ".csv")))
    psql(port, database, "\n".join(sql) + "\n")


# Secondary indexes on the join columns of the correlated subqueries (q17,
# q20) and the big joins, as a DBA would make them: without them q17 reads
# lineitem once per part (hours at scale factor 1, on either side).
INDEXES = [
    "CREATE INDEX ON lineitem (l_partkey, l_suppkey);",
    "CREATE INDEX ON orders (o_custkey);",
    "CREATE INDEX ON partsupp (ps_suppkey);",
]


def setup(metadata, workers, data, indexes=False):
    for port in [metadata] + workers:
        psql(port, "postgres", "DROP DATABASE IF EXISTS tpch_cluster WITH (FORCE);\n"
                               "CREATE DATABASE tpch_cluster;\n")
    psql(metadata, "postgres", "DROP DATABASE IF EXISTS tpch_plain WITH (FORCE);\n"
                               "CREATE DATABASE tpch_plain;\n")
    load(metadata, "tpch_plain", data)
    if indexes:
        psql(metadata, "tpch_plain", "\n".join(INDEXES) + "\n")
    psql(metadata, "tpch_plain", "VACUUM ANALYZE;\n")
    psql(metadata, "tpch_cluster", "CREATE EXTENSION pg_shard;\n" + "".join(
        "SELECT pg_shard.add_node('127.0.0.1', %d);\n" % port for port in workers))
    load(metadata, "tpch_cluster", data)
    statements = []
    for table, column, colocate in DISTRIBUTED:
        statements.append("SELECT pg_shard.create_distributed_table('%s', '%s'%s);"
                          % (table, column, ", colocate_with => '%s'" % colocate if colocate else ""))
    for table in REFERENCE:
        statements.append("SELECT pg_shard.create_reference_table('%s');" % table)
    seconds, _, _ = psql(metadata, "tpch_cluster", "\n".join(statements) + "\n")
    if indexes:
        # After distributing (not counted in its time): propagated to the shards.
        psql(metadata, "tpch_cluster", "\n".join(INDEXES) + "\n")
    for port in workers:
        psql(port, "tpch_cluster", "VACUUM ANALYZE;\n")
    psql(metadata, "tpch_cluster", "VACUUM ANALYZE;\n")
    return seconds


def canonical(lines, ordered):
    return lines if ordered else sorted(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--queries", required=True)
    parser.add_argument("--metadata", type=int, required=True)
    parser.add_argument("--workers", required=True)
    parser.add_argument("--repeat", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument("--report")
    parser.add_argument("--indexes", action="store_true",
                        help="secondary indexes on join columns, on both sides")
    parser.add_argument("--only", help="comma-separated query numbers (default: all 22)")
    args = parser.parse_args()
    workers = [int(p) for p in args.workers.split(",")]
    texts = queries(args.queries)
    if args.only:
        wanted = {int(n) for n in args.only.split(",")}
        texts = {n: t for n, t in texts.items() if n in wanted}
    distribute_seconds = setup(args.metadata, workers, args.data, args.indexes)
    print("# distributing the eight tables took %.2f s" % distribute_seconds)
    passed = failed = 0
    report = {"distribute_seconds": distribute_seconds, "queries": {}}
    ratios = []
    for number, text in sorted(texts.items()):
        ordered = re.search(r"\border\s+by\b[^()]*$", text, re.I | re.S) is not None
        plain_s, plain, plain_error = psql(args.metadata, "tpch_plain", text, args.timeout, check=False)
        cluster_s, cluster, cluster_error = psql(args.metadata, "tpch_cluster", text, args.timeout,
                                                 check=False)
        if plain is None:
            print("not ok - q%d fails on one PostgreSQL: %s" % (number, plain_error))
            failed += 1
            continue
        if cluster is None:
            print("not ok - q%d fails on pg_shard: %s" % (number, cluster_error))
            failed += 1
            continue
        if canonical(plain, ordered) != canonical(cluster, ordered):
            print("not ok - q%d: different answers (%d rows on one PostgreSQL, %d on pg_shard)"
                  % (number, len(plain), len(cluster)))
            for line in (set(plain) ^ set(cluster)):
                print("#   %s %s" % ("plain  " if line in plain else "cluster", line))
            failed += 1
            continue
        timing = ""
        if args.repeat:
            plain_times, cluster_times = [], []
            for _ in range(args.repeat):
                plain_times.append(psql(args.metadata, "tpch_plain", text, args.timeout)[0])
                cluster_times.append(psql(args.metadata, "tpch_cluster", text, args.timeout)[0])
            plain_s, cluster_s = statistics.median(plain_times), statistics.median(cluster_times)
            ratios.append(cluster_s / plain_s)
            timing = " (%.3f s on one PostgreSQL, %.3f s on pg_shard: %.2fx)" % (
                plain_s, cluster_s, cluster_s / plain_s)
            report["queries"]["q%d" % number] = {"plain": plain_s, "cluster": cluster_s}
        print("ok - q%d: %d rows, same answer%s" % (number, len(plain), timing))
        passed += 1
    if ratios:
        geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        report["geometric_mean"] = geomean
        print("# geometric mean of pg_shard / one PostgreSQL: %.2f; highest %.2fx" % (geomean, max(ratios)))
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
    print("tpch: %d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
