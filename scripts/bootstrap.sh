#!/usr/bin/env bash
# Install what building and testing pg_shard needs and a fresh Debian 12
# machine lacks: PostgreSQL 15 server headers, libclang (bindgen), cargo-pgrx
# at the version the workspace pins, psycopg 3 and pgbouncer (client tests
# and benchmarks of the coordinator), and node-postgres (from npm, outside
# the repository); libpq-dev, python3-venv and python3-dev build psycopg2 for
# tests/client_suites/run.sh; mmdebstrap makes the fresh Debian system the
# packages are installed into (tests/packaging/install.sh); docker.io and
# docker-compose build and run the Docker images (make docker, make
# docker-test; scripts/docker-engine.sh starts the engine). Idempotent: does
# nothing when all is there.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

sudo_if_needed() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing=()
for package in postgresql-server-dev-15 libclang-dev python3-psycopg pgbouncer curl libpq-dev python3-venv python3-dev mmdebstrap docker.io docker-compose openssl python3-yaml chromium fonts-dejavu-core; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
        missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}"
    sudo_if_needed apt-get update -qq
    sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    # The dev package can upgrade the server packages to a newer minor
    # release: servers started before must be restarted (scripts/cluster.sh).
    # pgbouncer's package starts a service: the benchmarks run their own.
    if command -v systemctl >/dev/null 2>&1; then
        sudo_if_needed systemctl disable --now pgbouncer >/dev/null 2>&1 || true
    fi
fi

# node-postgres for the client tests, kept outside the repository.
node_dir=${PGSHARD_NODE_MODULES:-/var/tmp/pg_shard-node}
if command -v npm >/dev/null 2>&1 && [ ! -d "$node_dir/node_modules/pg" ]; then
    echo "bootstrap: installing node-postgres into $node_dir"
    mkdir -p "$node_dir"
    npm install --silent --no-audit --no-fund --prefix "$node_dir" pg@8 >/dev/null
fi

pgrx_version=$(sed -n 's/^pgrx = "=\([0-9.]*\)"/\1/p' "$repo/pg_shard_ext/Cargo.toml")
installed=$(cargo pgrx --version 2>/dev/null | awk '{print $2}' || true)
if [ "$installed" != "$pgrx_version" ]; then
    echo "bootstrap: installing cargo-pgrx $pgrx_version (a few minutes)"
    cargo install cargo-pgrx --version "$pgrx_version" --locked --quiet
fi

pg_config_path=$(command -v pg_config)
if ! grep -q "pg15 = \"$pg_config_path\"" "${PGRX_HOME:-$HOME/.pgrx}/config.toml" 2>/dev/null; then
    cargo pgrx init --pg15 "$pg_config_path" >/dev/null
fi
