#!/usr/bin/env bash
# TPC-H through pg_shard against one PostgreSQL with the same data and
# settings (tests/tpch/run.sh: a plain database on the metadata node's
# server, and one whose orders and lineitem are distributed by order key,
# co-located, over 2 workers; the other six tables reference tables). Every
# answer is checked (secondary indexes on the join columns on both sides,
# made after distributing: tpch.py INDEXES); each query then runs $PGSHARD_TPCH_REPEAT times on each
# side, alternating, and the medians are compared.
#   PGSHARD_TPCH_SCALE   scale factor (default 1)
#   PGSHARD_TPCH_REPEAT  runs per query and side (default 3)
# Writes benches/results/tpch-sf<scale>.json.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scale=${PGSHARD_TPCH_SCALE:-1}
repeat=${PGSHARD_TPCH_REPEAT:-3}
mkdir -p "$repo/benches/results"
PGSHARD_TPCH_SCALE=$scale exec "$repo/tests/tpch/run.sh" --repeat "$repeat" --timeout 600 --indexes \
    --report "$repo/benches/results/tpch-sf$scale.json"
