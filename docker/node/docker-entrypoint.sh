#!/usr/bin/env bash
# Entry point of the pg_shard node image. Like the PostgreSQL image's: on
# the first start it makes the cluster in $PGDATA from the usual variables,
#   POSTGRES_PASSWORD          the superuser's password (required unless
#                              POSTGRES_HOST_AUTH_METHOD=trust)
#   POSTGRES_USER              the superuser (default postgres)
#   POSTGRES_DB                a database to create (default $POSTGRES_USER)
#   POSTGRES_INITDB_ARGS       more initdb arguments
#   POSTGRES_HOST_AUTH_METHOD  how clients log in (default scram-sha-256)
# and runs /docker-entrypoint-initdb.d/*.sql and *.sh; then it runs the
# server as the postgres user with any arguments given (`postgres -c
# name=value`). The port is PGPORT's (default 5432).
#
# pg_shard's own connections between nodes (moves, splits, two-phase
# commit) log in as POSTGRES_USER with POSTGRES_PASSWORD: every node of a
# cluster is started with the same two.
set -Eeuo pipefail

export PGDATA=${PGDATA:-/var/lib/postgresql/data}
export PGPORT=${PGPORT:-5432}
if [ "${1:0:1}" = '-' ]; then
    set -- postgres "$@"
fi
if [ "$1" != postgres ]; then
    exec "$@"
fi

# As root: own the data and socket folders (a mounted volume may not),
# then go on as the postgres user.
if [ "$(id -u)" = 0 ]; then
    install -d -o postgres -g postgres -m 0700 "$PGDATA"
    chown postgres:postgres "$PGDATA"
    chmod 0700 "$PGDATA"
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
    export HOME=/var/lib/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "${BASH_SOURCE[0]}" "$@"
fi
shift

POSTGRES_USER=${POSTGRES_USER:-postgres}
POSTGRES_DB=${POSTGRES_DB:-$POSTGRES_USER}
auth=${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}

log() { echo "pg_shard node: $*" >&2; }

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ] && [ "$auth" != trust ]; then
        log "POSTGRES_PASSWORD is not set: set it (the same on every node), or set POSTGRES_HOST_AUTH_METHOD=trust to let anyone in without one"
        exit 1
    fi
    log "making the cluster in $PGDATA"
    pwfile=$(mktemp)
    trap 'rm -f "$pwfile"' EXIT
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    pwarg=()
    if [ -n "${POSTGRES_PASSWORD:-}" ]; then
        pwarg=(--pwfile="$pwfile")
    fi
    # shellcheck disable=SC2086  # POSTGRES_INITDB_ARGS holds several arguments
    initdb --username="$POSTGRES_USER" "${pwarg[@]}" --encoding=UTF8 --locale=C.UTF-8 \
        --auth-local="$auth" --auth-host="$auth" ${POSTGRES_INITDB_ARGS:-} >/dev/null
    rm -f "$pwfile"
    cat /usr/share/pg_shard/node.conf >>"$PGDATA/postgresql.conf"
    # initdb's lines cover the loopback addresses; the rest of the network too.
    printf 'host all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"

    # A first server on a private socket only: nothing else can reach the
    # cluster before it is ready, and no port is taken.
    setup_socket=$(mktemp -d)
    pg_ctl --wait --silent --options "-c listen_addresses='' -c unix_socket_directories='$setup_socket'" \
        --log="$setup_socket/server.log" start || { cat "$setup_socket/server.log" >&2; exit 1; }
    setup_psql() {
        PGPASSWORD=${POSTGRES_PASSWORD:-} psql -X -q -v ON_ERROR_STOP=1 -h "$setup_socket" \
            -U "$POSTGRES_USER" "$@"
    }
    if [ "$POSTGRES_DB" != postgres ]; then
        setup_psql -d postgres -v db="$POSTGRES_DB" <<<'CREATE DATABASE :"db";'
    fi
    for file in /docker-entrypoint-initdb.d/*; do
        case "$file" in
        *.sql) log "running $file"; setup_psql -d "$POSTGRES_DB" -f "$file" ;;
        *.sh) log "running $file"; PGHOST=$setup_socket . "$file" ;;
        *) [ -e "$file" ] && log "ignoring $file" ;;
        esac
    done
    pg_ctl --wait --silent --mode=fast stop
    rm -rf "$setup_socket"
    log "cluster ready"
fi

# pg_shard's connections to the other nodes find the password here (a
# password file of the DBA's own, named by PGPASSFILE, is left alone).
if [ -n "${POSTGRES_PASSWORD:-}" ] && [ -z "${PGPASSFILE:-}" ]; then
    escaped=$(printf '%s' "$POSTGRES_PASSWORD" | sed -e 's/[\\:]/\\&/g')
    umask 077
    printf '*:*:*:%s:%s\n' "$(printf '%s' "$POSTGRES_USER" | sed -e 's/[\\:]/\\&/g')" "$escaped" \
        >"$HOME/.pgpass"
    umask 022
fi
export PGUSER=$POSTGRES_USER
unset POSTGRES_PASSWORD
exec postgres "$@"
