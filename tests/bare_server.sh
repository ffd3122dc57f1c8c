#!/usr/bin/env bash
# A PostgreSQL 15 server on which the pg_shard extension is NOT installed, to
# test that add_node refuses it with a clear error.
#
# The extension is installed system-wide on this machine, so the server runs
# from a private copy of the installation whose share folder lacks pg_shard's
# files (PostgreSQL finds its share folder relative to its own binary).
#
#   tests/bare_server.sh start DIR PORT DATABASE | stop DIR
set -euo pipefail

command=$1 dir=$2
bindir=$(pg_config --bindir)
sharedir=$(pg_config --sharedir)
pkglibdir=$(pg_config --pkglibdir)

as_server_user() {
    if [ "$(id -u)" -eq 0 ]; then (cd / && runuser -u postgres -- "$@"); else "$@"; fi
}

case "$command" in
start)
    port=$3 database=$4
    mkdir -p "$dir"
    # same relative layout as the real installation
    install -D "$bindir/postgres" "$dir/root$bindir/postgres"
    mkdir -p "$dir/root$sharedir"
    cp -r "$sharedir/." "$dir/root$sharedir/"
    rm -f "$dir/root$sharedir/extension/pg_shard"*
    mkdir -p "$(dirname "$dir/root$pkglibdir")"
    ln -sfn "$pkglibdir" "$dir/root$pkglibdir"
    [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$dir"
    as_server_user "$bindir/initdb" --pgdata="$dir/data" --auth=trust --username=postgres \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    as_server_user env -u RUST_BACKTRACE "$bindir/pg_ctl" --pgdata="$dir/data" --log="$dir/server.log" \
        -p "$dir/root$bindir/postgres" \
        -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir" \
        --wait --silent start
    psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "CREATE DATABASE \"$database\""
    ;;
stop)
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_server_user "$bindir/pg_ctl" --pgdata="$dir/data" --mode=fast --wait --silent stop || true
    fi
    rm -rf "$dir"
    ;;
esac
