#!/usr/bin/env bash
# Client libraries' own test suites, run once straight against the metadata
# node and once through the coordinator: a test that passes directly but
# fails, errors, is skipped or hangs through the coordinator is a failure,
# unless expected_differences.txt lists it with its reason.
#
# Suites (pinned below; fetched from PyPI at test time into a cache outside
# the repository, $PGSHARD_SUITES_CACHE, default /var/tmp/pg_shard-suites):
#   psycopg2  its sdist's tests/ (libpq, simple query protocol), database suites_test
#   pg8000    its sdist's test/  (pure Python, extended query protocol);
#             its tests always use the database "postgres"
# Cluster: metadata node 29320, workers 29321-29322, coordinator 29420
# (metrics 29421), data in .cluster-suites (deleted at exit).
# Results: tests/client_suites/results/ (per-test JSON lines, run logs,
# SUITE.failures.txt with the traceback of every difference, coordinator.log).
# Prints "ok - ..." / "not ok - ..." per test and "client suites: N passed, M failed".
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here=$repo/tests/client_suites
results=$here/results
export PGSHARD_CLUSTER_DIR=$repo/.cluster-suites
export PGSHARD_BASE_PORT=29320
export PGSHARD_WORKERS=2
export PGSHARD_DATABASE=suites_test
metadata=29320
coordinator=29420
# Debian's interpreter (python3-venv, python3-dev: scripts/bootstrap.sh), not
# whatever python3 comes first on PATH.
python=/usr/bin/python3
psycopg2_version=2.9.10
pg8000_version=1.31.6
cache=${PGSHARD_SUITES_CACHE:-/var/tmp/pg_shard-suites}
# seconds for one run of one suite; tests not reported by then count as not
# passed
suite_timeout=${PGSHARD_SUITES_TIMEOUT:-300}
# seconds for one test: a test still running then has hung (every test takes
# at most 5 s directly, but for the slow ones in the suites' settings below)
test_timeout=${PGSHARD_SUITES_TEST_TIMEOUT:-10}

give_up() {
    echo "not ok - $1"
    echo "client suites: 0 passed, 1 failed"
    exit 1
}

# 1. A venv with the pinned libraries and pytest, and the libraries' sdists
# (for their tests), made once per set of versions.
key=$({ cat "$here/requirements.txt"; echo "psycopg2 $psycopg2_version pg8000 $pg8000_version"; "$python" --version; } |
    sha256sum | cut -c1-12)
env_dir=$cache/$key
venv=$env_dir/venv
mkdir -p "$cache"
# One run at a time: runs share the cluster's ports, the results folder and
# the cache (the lock is held until this script exits).
exec 9>"$cache/lock"
if ! flock -n 9; then
    echo "# waiting for another tests/client_suites/run.sh to finish"
    flock -w 1800 9 || give_up "another tests/client_suites/run.sh still runs after 30 minutes"
fi
if [ ! -f "$env_dir/ready" ]; then
    echo "# installing psycopg2 $psycopg2_version, pg8000 $pg8000_version and pytest into $env_dir"
    rm -rf "$env_dir"
    mkdir -p "$env_dir/src"
    {
        "$python" -m venv "$venv" &&
            "$venv/bin/python" -m pip install -q --no-cache-dir --use-pep517 -r "$here/requirements.txt" \
                "psycopg2==$psycopg2_version" "pg8000==$pg8000_version" &&
            "$venv/bin/python" -m pip download -q --no-cache-dir --no-deps --no-binary psycopg2,pg8000 -d "$env_dir/src" \
                "psycopg2==$psycopg2_version" "pg8000==$pg8000_version" &&
            tar -xzf "$env_dir/src/psycopg2-$psycopg2_version.tar.gz" -C "$env_dir/src" &&
            tar -xzf "$env_dir/src/pg8000-$pg8000_version.tar.gz" -C "$env_dir/src"
    } >"$cache/install.log" 2>&1 || { cat "$cache/install.log"; give_up "installing the client suites (see $cache/install.log)"; }
    touch "$env_dir/ready"
fi

# 2. The cluster, and in both databases the suites use the pg_shard
# extension with both workers (and hstore, which both suites test).
cleanup() {
    cp "$PGSHARD_CLUSTER_DIR/coordinator.log" "$results/" 2>/dev/null
    if [ "${PGSHARD_KEEP_CLUSTER:-0}" = 1 ]; then
        "$repo/scripts/cluster.sh" stop >/dev/null
    else
        "$repo/scripts/cluster.sh" destroy >/dev/null
    fi
}
rm -rf "$results"
mkdir -p "$results"
"$repo/scripts/cluster.sh" destroy >/dev/null
trap cleanup EXIT
"$repo/scripts/cluster.sh" start >/dev/null 9>&- || give_up "starting the cluster"
psql -X -q -h 127.0.0.1 -p "$coordinator" -U postgres -d "$PGSHARD_DATABASE" -c "SELECT 1" >/dev/null ||
    give_up "the coordinator does not answer on 127.0.0.1:$coordinator"
for db in "$PGSHARD_DATABASE" postgres; do
    if ! psql -X -q -h 127.0.0.1 -p "$metadata" -U postgres -d "$db" -v ON_ERROR_STOP=1 >/dev/null <<SQL; then
CREATE EXTENSION pg_shard;
SELECT pg_shard.add_node('127.0.0.1', $((metadata + 1)));
SELECT pg_shard.add_node('127.0.0.1', $((metadata + 2)));
CREATE EXTENSION hstore;
SQL
        give_up "setting up database $db"
    fi
done

# 3. Each suite, directly (port $metadata), then through the coordinator.
bin=${CARGO_TARGET_DIR:-$repo/target}/release/pg_shard_coordinator
echo "# coordinator $bin: sha256 $(sha256sum "$bin" | cut -c1-12), built $(date -r "$bin" -u '+%F %T UTC')"
run_suite() { # run_suite SUITE MODE PORT: pytest in the suite's source folder
    local suite=$1 mode=$2 port=$3
    local -a env tests
    case "$suite" in
        psycopg2)
            cd "$env_dir/src/psycopg2-$psycopg2_version" || return
            env=(PSYCOPG2_TESTDB="$PGSHARD_DATABASE" PSYCOPG2_TESTDB_HOST=127.0.0.1
                PSYCOPG2_TESTDB_PORT="$port" PSYCOPG2_TESTDB_USER=postgres
                # the replication tests, on the same server (empty: the same DSN)
                PSYCOPG2_TEST_REPL_DSN=)
            # unittest classes only, not the modules' test_suite() functions;
            # not the 10 s stress test of a module reload in threads (no server)
            tests=(-o python_functions=no_functions
                --deselect tests/test_errcodes.py::ErrocodeTests::test_lookup_threadsafe tests)
            ;;
        pg8000)
            cd "$env_dir/src/pg8000-$pg8000_version" || return
            env=(PGHOST=127.0.0.1 PGPORT="$port" PGUSER=postgres
                # 60000 parameters: about 25 s directly
                CLIENT_SUITES_TIMEOUTS="test/native/test_query.py::test_max_parameters=120")
            # not the benchmarks, nor the README's examples (written for a
            # server on port 5432 with a password)
            tests=(--ignore-glob='*test_benchmarks.py' --ignore=test/test_readme.py test)
            ;;
    esac
    # A hung test stops pytest (pytest-timeout's thread method ends the
    # process); the run then resumes after it, until the suite's time is up.
    local results_file=$results/$suite.$mode.jsonl log=$results/$suite.$mode.log
    local start resume=0 lines left code=124
    start=$(date +%s)
    : >"$results_file"
    : >"$log"
    while left=$((start + suite_timeout - $(date +%s))) && [ "$left" -gt 0 ]; do
        lines=$(wc -l <"$results_file")
        env "${env[@]}" CLIENT_SUITES_RESULTS="$results_file" CLIENT_SUITES_RESUME=$resume PYTHONPATH="$here" \
            timeout --kill-after=10 "$left" "$venv/bin/python" -m pytest -p results_plugin -p no:cacheprovider \
            -q --timeout "$test_timeout" --timeout-method=thread "${tests[@]}" >>"$log" 2>&1
        code=$?
        if tail -n 1 "$results_file" | grep -q '"event": "finished"' || [ "$code" = 124 ] ||
            [ "$(wc -l <"$results_file")" = "$lines" ]; then
            break
        fi
        echo "##### stopped (exit $code) while a test ran: resuming after it" >>"$log"
        resume=1
    done
    echo "$code $(($(date +%s) - start))" >"$results/$suite.$mode.exit"
    cd "$repo" || return
}
suites=(psycopg2 pg8000)
for suite in "${suites[@]}"; do
    run_suite "$suite" direct "$metadata"
    run_suite "$suite" via "$coordinator"
done

# 4. The comparison.
"$venv/bin/python" "$here/compare.py" "$results" "$here/expected_differences.txt" "${suites[@]}"
