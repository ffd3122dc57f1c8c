#!/usr/bin/env python3
"""Values the metadata node computes, through real clients' prepared
statements (the extended protocol, which psql's own tests cannot drive).

1. A prepared INSERT whose key is a constant and whose other values are
   parameters, run past the plan cache's switch to a generic plan (and
   with plan_cache_mode = force_generic_plan), on the metadata node and
   through the coordinator: every row is written (the generic plan's
   parameters go with the worker's statement).
2. A table with a unique lookup, a `bigserial` id and `DEFAULT now()`:
   single- and multi-row INSERTs that leave those columns to their
   defaults, prepared, through both coordinators and the metadata node.
   Every row gets its own id from the table's sequence, the lookup stays
   exact, a taken email is refused, and a read by email still finds the
   row.

Usage: computed_values.py METADATA_PORT COORDINATOR_PORT SECOND_COORDINATOR_PORT DATABASE"""
import os
import sys

import psycopg

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "moves"))
from tap import Checks, connect  # noqa: E402

metadata_port, coordinator_port, second_port, database = sys.argv[1:5]
dsn = "host=127.0.0.1 port={} dbname=" + database + " user=postgres"
check = Checks("computed values")

meta = connect(dsn.format(metadata_port))
coordinator = connect(dsn.format(coordinator_port))
second = connect(dsn.format(second_port))

# 1. Generic plans with a constant key.
meta.execute("DROP TABLE IF EXISTS cv_generic")
meta.execute("CREATE TABLE cv_generic (k int, v int, PRIMARY KEY (k, v))")
meta.execute("SELECT pg_shard.create_distributed_table('cv_generic', 'k')")
for name, conn in (("metadata node", meta), ("coordinator", coordinator)):
    base = 1000 if name == "coordinator" else 0
    errors = []
    for mode in ("auto", "force_generic_plan"):
        conn.execute(f"SET plan_cache_mode = {mode}")
        for i in range(10):
            try:
                conn.execute("INSERT INTO cv_generic (k, v) VALUES (3, %s)",
                             (base + (100 if mode != "auto" else 0) + i,), prepare=True)
            except psycopg.Error as e:
                errors.append(f"{e.sqlstate} {e.diag.message_primary}")
        conn.execute("RESET plan_cache_mode")
    rows = meta.execute("SELECT count(*) FROM cv_generic WHERE v BETWEEN %s AND %s",
                        (base, base + 999)).fetchone()[0]
    check(f"{name}: 20 prepared INSERTs with a constant key, past the generic plan ({rows} rows, "
          f"{errors[:2]})", rows == 20 and not errors)

# 2. Defaults on a table with a lookup.
TABLE, LOOKUP = "cv_accounts", "cv_accounts_email_lookup"
meta.execute(f"DROP TABLE IF EXISTS {TABLE}")
meta.execute(f"CREATE TABLE {TABLE} (tenant int NOT NULL, id bigserial, email text, "
             "created timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (tenant, id))")
meta.execute(f"SELECT pg_shard.create_distributed_table('{TABLE}', 'tenant')")
meta.execute(f"SELECT pg_shard.create_lookup('{TABLE}', 'email', \"unique\" => true)")
written, errors = 0, []
for name, conn in (("metadata", meta), ("first", coordinator), ("second", second)):
    for n in range(8):
        tenant = 10 * n
        try:
            conn.execute(f"INSERT INTO {TABLE} (tenant, email) VALUES (%s, %s)",
                         (tenant, f"{name}{n}@example.com"), prepare=True)
            conn.execute(f"INSERT INTO {TABLE} (email, tenant) VALUES (%s, %s), (%s, %s)",
                         (f"{name}{n}a@example.com", tenant + 1, f"{name}{n}b@example.com",
                          tenant + 2), prepare=True)
            written += 3
        except psycopg.Error as e:
            errors.append(f"{name}: {e.sqlstate} {e.diag.message_primary}")
ids = meta.execute(f"SELECT count(*), count(DISTINCT id), max(id) = "
                   f"(SELECT last_value FROM {TABLE}_id_seq), "
                   f"count(*) FILTER (WHERE created > now() - interval '1 hour') FROM {TABLE}").fetchone()
check(f"{written} rows with defaults through the metadata node and two coordinators ({errors[:2]})",
      written == 72 and not errors)
check(f"each row its own id from the table's sequence and its own clock default ({ids})",
      ids[0] == 72 and ids[1] == 72 and ids[2] and ids[3] == 72)
differences = meta.execute(
    f"SELECT count(*) FROM ((SELECT email, pg_shard.keyspace_id(tenant) FROM {TABLE} "
    f"EXCEPT SELECT value, keyspace_id FROM {LOOKUP}) UNION ALL "
    f"(SELECT value, keyspace_id FROM {LOOKUP} EXCEPT "
    f"SELECT email, pg_shard.keyspace_id(tenant) FROM {TABLE})) d").fetchone()[0]
check(f"the lookup is exact ({differences} differences)", differences == 0)
try:
    second.execute(f"INSERT INTO {TABLE} (tenant, email) VALUES (%s, %s)", (99, "first3@example.com"),
                   prepare=True)
    duplicate = "committed"
except psycopg.Error as e:
    duplicate = f"{e.sqlstate} {e.diag.message_primary}"
check(f"a taken email with defaults is refused ({duplicate})",
      duplicate.startswith("23505") and LOOKUP in duplicate)
found = coordinator.execute(f"SELECT tenant FROM {TABLE} WHERE email = %s",
                            ("second5b@example.com",)).fetchall()
check(f"a read by email finds the row ({found})", found == [(52,)])

meta.execute(f"DROP TABLE {TABLE}")
meta.execute("DROP TABLE cv_generic")
sys.exit(1 if check.failures else 0)
