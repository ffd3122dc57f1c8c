#!/usr/bin/env bash
# The Debian packages (`make package`) installed with apt on a fresh Debian
# 12 with PostgreSQL 15 from Debian's mirror: a minimal system made by
# mmdebstrap, entered with chroot in a mount namespace of its own (/proc,
# /dev and /tmp mounted there and gone when it ends). In it: apt installs
# both packages; a metadata node and a worker preloading pg_shard run
# CREATE EXTENSION and a distributed table's round trip; the packaged coordinator, started from its
# packaged settings file, answers through its port; the unit file and the
# conffile are where the packages say. TAP-style lines (`ok - …`).
#
# Ports: 25920 (metadata node), 25922 (worker) and 25921 (coordinator),
# loopback only.
# Usage: tests/packaging/install.sh [DEB_DIR] (default target/debian)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
debs=${1:-$repo/target/debian}
root=$(mktemp -d /var/tmp/pg_shard-package-root.XXXXXX)
trap 'rm -rf "$root"' EXIT

mmdebstrap --variant=minbase --include=postgresql-15,postgresql-client-15 --quiet bookworm "$root"
mkdir -p "$root/packages"
cp "$debs"/postgresql-15-pg-shard_*.deb "$debs"/pg-shard-coordinator_*.deb "$root/packages/"

# Everything below runs inside the fresh system.
cat >"$root/packages/check.sh" <<'EOF'
set -uo pipefail
failed=0
check() { # check DESCRIPTION COMMAND...
    local description=$1; shift
    if "$@" >/tmp/check.out 2>&1; then
        echo "ok - packages: $description"
    else
        echo "not ok - packages: $description"; sed 's/^/#   /' /tmp/check.out; failed=1
    fi
}
check "apt installs both packages on Debian 12 with PostgreSQL 15" \
    env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
    /packages/postgresql-15-pg-shard_*.deb /packages/pg-shard-coordinator_*.deb
check "dpkg lists them installed" \
    sh -c 'dpkg-query -W -f="\${Status}\n" postgresql-15-pg-shard pg-shard-coordinator | grep -c "install ok installed" | grep -qx 2'
check "the extension's files are where PostgreSQL 15 looks" \
    test -f /usr/lib/postgresql/15/lib/pg_shard.so -a -f /usr/share/postgresql/15/extension/pg_shard.control
check "the coordinator's unit and settings are installed, the settings as a conffile" \
    sh -c 'test -f /lib/systemd/system/pg-shard-coordinator.service && dpkg-query -W -f="\${Conffiles}" pg-shard-coordinator | grep -q /etc/pg_shard/coordinator.toml'
bin=/usr/lib/postgresql/15/bin
# A metadata node (25920) and a worker (25922), as the docs configure them.
start_node() { # start_node DIR PORT
    runuser -u postgres -- "$bin/initdb" -D "$1" -A trust >/dev/null &&
    runuser -u postgres -- "$bin/pg_ctl" -D "$1" -w -l "$1.log" start -o "-c port=$2 \
        -c listen_addresses=127.0.0.1 -c unix_socket_directories=/tmp \
        -c shared_preload_libraries=pg_shard -c wal_level=logical -c max_prepared_transactions=16"
}
check "a metadata node and a worker preloading pg_shard start" \
    sh -c "$(declare -f start_node); bin=$bin; start_node /tmp/metadata 25920 && start_node /tmp/worker 25922"
# (the upstream part: the extension's version, before +git… and the revision)
version=$(dpkg-query -W -f='${Version}' postgresql-15-pg-shard 2>/dev/null | cut -d- -f1 | cut -d+ -f1)
check "CREATE EXTENSION pg_shard, at the package's version ($version)" \
    sh -c "test -n '$version' && /usr/bin/psql -X -At -h 127.0.0.1 -p 25920 -U postgres -v ON_ERROR_STOP=1 \
        -c 'CREATE EXTENSION pg_shard' \
        -c \"SELECT extversion FROM pg_extension WHERE extname = 'pg_shard'\" | grep -qx '$version'"
check "a distributed table on the worker: rows in, rows out" \
    sh -c "/usr/bin/psql -X -At -h 127.0.0.1 -p 25920 -U postgres -v ON_ERROR_STOP=1 \
        -c \"SELECT pg_shard.add_node('127.0.0.1', 25922)\" \
        -c 'CREATE TABLE t (k bigint PRIMARY KEY, v text)' \
        -c \"SELECT pg_shard.create_distributed_table('t', 'k', shard_count => 4)\" \
        -c \"INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, 100) g\" \
        -c 'SELECT count(*) FROM t' | tail -1 | grep -qx 100"
# The coordinator as its unit starts it, from the packaged settings file
# (its addresses moved to this test's ports by the environment, which
# overrides the file).
PGSHARD_COORDINATOR_LISTEN=127.0.0.1:25921 PGSHARD_COORDINATOR_METADATA=127.0.0.1:25920 \
    PGSHARD_COORDINATOR_METRICS_LISTEN= \
    runuser -u nobody -- /usr/bin/pg_shard_coordinator --config /etc/pg_shard/coordinator.toml \
    >/tmp/coordinator.log 2>&1 &
coordinator=$!
for _ in $(seq 1 50); do
    /usr/bin/psql -X -At -h 127.0.0.1 -p 25921 -U postgres -c 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.2
done
check "the packaged coordinator, from its packaged settings, serves the table" \
    sh -c "/usr/bin/psql -X -At -h 127.0.0.1 -p 25921 -U postgres -c 'SELECT v FROM t WHERE k = 42' | grep -qx v42"
kill "$coordinator" 2>/dev/null; wait "$coordinator" 2>/dev/null
for node in /tmp/metadata /tmp/worker; do
    runuser -u postgres -- "$bin/pg_ctl" -D "$node" -w -m fast stop >/dev/null
done
check "apt removes both packages" \
    env DEBIAN_FRONTEND=noninteractive apt-get remove -y -q postgresql-15-pg-shard pg-shard-coordinator
exit $failed
EOF

# A mount namespace of its own: the mounts end with it.
unshare --mount --fork -- sh -c "
    mount -t proc proc '$root/proc' &&
    mount --rbind /dev '$root/dev' &&
    mount -t tmpfs tmpfs '$root/tmp' &&
    chmod 1777 '$root/tmp' &&
    chroot '$root' /bin/bash /packages/check.sh"
