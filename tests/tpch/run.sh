#!/usr/bin/env bash
# TPC-H through pg_shard against one PostgreSQL: all 22 answers must match.
#
# Fetched at test time from PyPI into a cache outside the repository
# ($PGSHARD_TPCH_CACHE, default /var/tmp/pg_shard-tpch):
#   tpchgen-cli  the data generator (a binary wheel), run at scale factor
#                $PGSHARD_TPCH_SCALE (default 0.01)
#   sqlglot      its sdist's TPC-H query file (tests/fixtures/optimizer/tpc-h)
# Cluster: metadata node 27320, workers 27321-27322, data in .cluster-tpch
# (deleted at exit). Extra arguments go to tpch.py (benches/tpch.sh passes
# --repeat and --report).
# Prints "ok - q<n> ..." / "not ok - q<n> ..." and "tpch: N passed, M failed".
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$repo/tests/tpch
export PGSHARD_CLUSTER_DIR=${PGSHARD_CLUSTER_DIR:-$repo/.cluster-tpch}
export PGSHARD_BASE_PORT=${PGSHARD_BASE_PORT:-27320}
export PGSHARD_WORKERS=2
export PGSHARD_DATABASE=postgres
export PGSHARD_COORDINATOR_BIN=/nonexistent
scale=${PGSHARD_TPCH_SCALE:-0.01}
metadata=$PGSHARD_BASE_PORT
python=/usr/bin/python3
tpchgen_version=4.0.0
sqlglot_version=30.31.0
cache=${PGSHARD_TPCH_CACHE:-/var/tmp/pg_shard-tpch}

give_up() {
    echo "not ok - $1"
    echo "tpch: 0 passed, 1 failed"
    exit 1
}

key=$({ echo "tpchgen-cli $tpchgen_version sqlglot $sqlglot_version"; "$python" --version; } | sha256sum | cut -c1-12)
env_dir=$cache/$key
mkdir -p "$cache"
exec 9>"$cache/lock"
flock -w 1800 9 || give_up "another tests/tpch/run.sh still runs after 30 minutes"
if [ ! -f "$env_dir/ready" ]; then
    echo "# installing tpchgen-cli $tpchgen_version and sqlglot $sqlglot_version's query file into $env_dir"
    rm -rf "$env_dir"
    mkdir -p "$env_dir/src"
    {
        "$python" -m venv "$env_dir/venv" &&
            "$env_dir/venv/bin/python" -m pip install -q --no-cache-dir "tpchgen-cli==$tpchgen_version" &&
            "$env_dir/venv/bin/python" -m pip download -q --no-cache-dir --no-deps --no-binary sqlglot \
                -d "$env_dir/src" "sqlglot==$sqlglot_version" &&
            tar -xzf "$env_dir/src/sqlglot-$sqlglot_version.tar.gz" -C "$env_dir/src" \
                "sqlglot-$sqlglot_version/tests/fixtures/optimizer/tpc-h/tpc-h.sql"
    } >"$cache/install.log" 2>&1 || { cat "$cache/install.log"; give_up "installing tpchgen-cli and sqlglot (see $cache/install.log)"; }
    touch "$env_dir/ready"
fi
queries=$env_dir/src/sqlglot-$sqlglot_version/tests/fixtures/optimizer/tpc-h/tpc-h.sql
data=$cache/data-sf$scale
if [ ! -f "$data/ready" ]; then
    rm -rf "$data"
    "$env_dir/venv/bin/tpchgen-cli" csv -s "$scale" --output-dir="$data" >/dev/null ||
        give_up "generating TPC-H data at scale factor $scale"
    chmod -R a+rX "$data"
    touch "$data/ready"
fi

cleanup() {
    if [ "${PGSHARD_KEEP_CLUSTER:-0}" = 1 ]; then
        "$repo/scripts/cluster.sh" stop >/dev/null
    else
        "$repo/scripts/cluster.sh" destroy >/dev/null
    fi
}
"$repo/scripts/cluster.sh" destroy >/dev/null
trap cleanup EXIT
"$repo/scripts/cluster.sh" start >/dev/null 9>&- 2>&1 || give_up "starting the cluster"
echo "# TPC-H at scale factor $scale: $(wc -l <"$data/lineitem.csv") lineitem rows"
"$python" "$here/tpch.py" --data "$data" --queries "$queries" --metadata "$metadata" \
    --workers "$((metadata + 1)),$((metadata + 2))" "$@"
