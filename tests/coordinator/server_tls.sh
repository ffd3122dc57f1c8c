#!/usr/bin/env bash
# TLS between the coordinator and the nodes (server_tls_sslmode), with
# SCRAM-SHA-256-PLUS both ways. Run by tests/coordinator/run.sh against its
# cluster, with its test CA:
#
#   server_tls.sh BIN CLUSTER_DIR DATABASE TLS_DIR
#
# TLS_DIR holds ca.crt, server.crt/.key (localhost and 127.0.0.1, signed by
# ca.crt) and other.crt (a CA that signed nothing here). The nodes get
# ssl = on with that certificate and pg_hba rules that refuse some roles
# without TLS; both are undone at the end. Prints TAP-style lines.
set -uo pipefail
bin=$1 cluster_dir=$2 database=$3 tls_dir=$4
export PGUSER=postgres
nodes=(28320 28321 28322 28323)
data_dirs=("$cluster_dir/metadata" "$cluster_dir/worker1" "$cluster_dir/worker2" "$cluster_dir/worker3")
failures=0
ok() { echo "ok - server TLS: $1"; }
not_ok() {
    echo "not ok - server TLS: $1"
    failures=$((failures + 1))
}
check() { # check "description" command...
    local description=$1
    shift
    if "$@"; then ok "$description"; else not_ok "$description"; fi
}
on_node() { psql -X -At -h 127.0.0.1 -p "$1" -d "$database" -v ON_ERROR_STOP=1 -c "$2"; }
pids=()
start_coordinator() { # start_coordinator PORT FLAGS...
    local port=$1
    shift
    "$bin" --listen "127.0.0.1:$port" --metadata 127.0.0.1:28320 --metrics-listen "" "$@" \
        >"$cluster_dir/coordinator-$port.log" 2>&1 &
    pids+=($!)
}
cleanup() {
    [ "${#pids[@]}" -gt 0 ] && kill "${pids[@]}" 2>/dev/null
    for i in "${!nodes[@]}"; do
        [ -f "${data_dirs[$i]}/pg_hba.conf.before-tls" ] &&
            mv "${data_dirs[$i]}/pg_hba.conf.before-tls" "${data_dirs[$i]}/pg_hba.conf"
        psql -X -q -h 127.0.0.1 -p "${nodes[$i]}" -d postgres -c "ALTER SYSTEM RESET ssl" \
            -c "ALTER SYSTEM RESET ssl_cert_file" -c "ALTER SYSTEM RESET ssl_key_file" \
            -c "ALTER SYSTEM RESET ssl_ca_file" \
            -c "SELECT pg_reload_conf()" >/dev/null 2>&1
    done
}
trap cleanup EXIT

# The nodes: TLS on; `tls_only` may log in over TLS only (trust), `tls_scram`
# over TLS only with SCRAM, `any_scram` with SCRAM over either, `cert_user`
# over TLS with a client certificate of the test CA's (the coordinator's).
(
    cd "$tls_dir" &&
        openssl req -newkey rsa:2048 -nodes -keyout coordinator.key -out coordinator.csr \
            -subj "/CN=pg_shard coordinator" &&
        printf 'basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n' >coordinator.ext &&
        openssl x509 -req -in coordinator.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile coordinator.ext -out coordinator.crt
) >"$tls_dir/openssl-client.log" 2>&1 || not_ok "client certificate: $(cat "$tls_dir/openssl-client.log")"
# (the server runs as postgres: the folder must let it through)
chmod 711 "$tls_dir"
chown postgres "$tls_dir/server.crt" "$tls_dir/server.key"
chmod 600 "$tls_dir/server.key"
for i in "${!nodes[@]}"; do
    hba=${data_dirs[$i]}/pg_hba.conf
    cp -p "$hba" "$hba.before-tls"  # (-p: the server must still own it)
    {
        echo "hostssl all tls_only 127.0.0.1/32 trust"
        echo "hostnossl all tls_only 127.0.0.1/32 reject"
        echo "hostssl all tls_scram 127.0.0.1/32 scram-sha-256"
        echo "hostnossl all tls_scram 127.0.0.1/32 reject"
        echo "host all any_scram 127.0.0.1/32 scram-sha-256"
        echo "hostssl all cert_user 127.0.0.1/32 trust clientcert=verify-ca"
        echo "host all cert_user 127.0.0.1/32 reject"
        cat "$hba.before-tls"
    } >"$hba"
    psql -X -q -h 127.0.0.1 -p "${nodes[$i]}" -d postgres -v ON_ERROR_STOP=1 \
        -c "ALTER SYSTEM SET ssl_cert_file = '$tls_dir/server.crt'" \
        -c "ALTER SYSTEM SET ssl_key_file = '$tls_dir/server.key'" \
        -c "ALTER SYSTEM SET ssl_ca_file = '$tls_dir/ca.crt'" \
        -c "ALTER SYSTEM SET ssl = on" -c "SELECT pg_reload_conf()" >/dev/null ||
        not_ok "ssl = on on node ${nodes[$i]}"
    psql -X -q -h 127.0.0.1 -p "${nodes[$i]}" -d postgres -v ON_ERROR_STOP=1 -c "
        DO \$\$ BEGIN
            CREATE ROLE tls_only LOGIN SUPERUSER;
            CREATE ROLE tls_scram LOGIN SUPERUSER PASSWORD 'scram pass';
            CREATE ROLE any_scram LOGIN SUPERUSER PASSWORD 'any pass';
            CREATE ROLE cert_user LOGIN SUPERUSER;
        EXCEPTION WHEN duplicate_object THEN NULL;
        END \$\$" >/dev/null || not_ok "roles on node ${nodes[$i]}"
done
sleep 0.5
printf '"tls_scram" "scram pass"\n' >"$tls_dir/users.txt"
client_tls=(--tls allow --tls-cert-file "$tls_dir/server.crt" --tls-key-file "$tls_dir/server.key")

# verify-full over TCP (no socket folder), relaying logins (passthrough).
start_coordinator 28440 --server-tls-sslmode verify-full --server-tls-ca-file "$tls_dir/ca.crt" "${client_tls[@]}"
# No TLS with the nodes.
start_coordinator 28441 --server-tls-sslmode disable
# SCRAM with the coordinator (-PLUS over TLS) and with the nodes
# (-PLUS), the shard map read over TLS as tls_scram.
start_coordinator 28442 --auth scram --users-file "$tls_dir/users.txt" \
    --server-password "scram pass" --catalog-user tls_scram \
    --server-tls-sslmode verify-full --server-tls-ca-file "$tls_dir/ca.crt" "${client_tls[@]}"
# A CA that signed nothing of the nodes'.
start_coordinator 28443 --server-tls-sslmode verify-ca --server-tls-ca-file "$tls_dir/other.crt"
# The default (prefer), TLS with clients too.
start_coordinator 28444 "${client_tls[@]}"
# The coordinator's client certificate: shown to the nodes by the pools
# (auth = trust: they log in as the client's user), never by a login
# relayed for a client (passthrough), which the node must authenticate.
coordinator_pair=(--server-tls-cert-file "$tls_dir/coordinator.crt" --server-tls-key-file "$tls_dir/coordinator.key")
start_coordinator 28445 --server-tls-sslmode verify-full --server-tls-ca-file "$tls_dir/ca.crt" \
    --auth trust "${coordinator_pair[@]}"
start_coordinator 28446 --server-tls-sslmode verify-full --server-tls-ca-file "$tls_dir/ca.crt" \
    "${coordinator_pair[@]}"
sleep 1

via() { # via PORT USER SQL
    psql -X -At "host=127.0.0.1 port=$1 dbname=$database user=$2 sslmode=disable" -v ON_ERROR_STOP=1 -c "$3" 2>&1
}
got=$(via 28440 tls_only "SELECT owner FROM accounts WHERE id = 42")
check "verify-full: a read by key on its worker (got: $got)" test "$got" = "owner 42"
got=$(via 28440 tls_only "SELECT count(*) > 0 FROM accounts")
check "verify-full: a read of every shard (got: $got)" test "$got" = "t"
got=$(psql -X -At "host=127.0.0.1 port=28440 dbname=$database user=tls_only" -v ON_ERROR_STOP=1 \
    -c "BEGIN" -c "UPDATE accounts SET owner = owner WHERE id IN (1, 2, 3, 4, 5, 6, 7, 8)" -c "COMMIT" 2>&1 | tr '\n' ' ')
check "verify-full: a transaction over several nodes commits (got: $got)" grep -qE "^BEGIN UPDATE [1-9] COMMIT" <<<"$got"
# Many clients' reads by key share pipelined connections (multiplexing):
# the pipe's writer and reader share one TLS session.
printf '\\set id random(1, 100)\nSELECT owner FROM accounts WHERE id = :id;\n' >"$tls_dir/read.sql"
bench=$(pgbench -n -h 127.0.0.1 -p 28440 -U tls_only -c 8 -j 2 -t 500 -f "$tls_dir/read.sql" "$database" 2>&1)
check "verify-full: pgbench, 8 clients x 500 reads by key, none failed" \
    grep -q "number of transactions actually processed: 4000/4000" <<<"$bench"
bench=$(pgbench -n -h 127.0.0.1 -p 28440 -U tls_only -c 8 -j 2 -t 300 -M prepared -f "$tls_dir/read.sql" "$database" 2>&1)
check "verify-full: pgbench -M prepared, none failed" \
    grep -q "number of transactions actually processed: 2400/2400" <<<"$bench"
# psql sends a cancel request on SIGINT; the coordinator passes it on
# to the worker over a TLS connection of its own.
started=$(date +%s)
got=$(timeout -s INT 1 psql -X -At "host=127.0.0.1 port=28440 dbname=$database user=tls_only" \
    -c "SELECT pg_sleep(20) FROM accounts WHERE id = 42" 2>&1 | tr "\n" " ")
check "verify-full: a cancel request reaches the worker (got: $got)" \
    grep -q "canceling statement due to user request" <<<"$got"
check "verify-full: ... within seconds" test $(($(date +%s) - started)) -lt 10
for port in "${nodes[@]}"; do
    counts=$(on_node "$port" "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
        FROM pg_catalog.pg_stat_ssl s JOIN pg_catalog.pg_stat_activity a USING (pid)
        WHERE a.usename = 'tls_only'")
    if [ "$port" = 28323 ]; then
        check "node $port: no tls_only session without TLS (got: $counts)" grep -qE '\|0$' <<<"$counts"
    else
        check "node $port: the coordinator's sessions use TLS (TLS|plain: $counts)" grep -qE '^[1-9][0-9]*\|0$' <<<"$counts"
    fi
done

got=$(psql -X -At "host=127.0.0.1 port=28440 dbname=$database user=any_scram password='any pass' sslmode=require" \
    -c "SELECT session_user" 2>&1)
check "verify-full: a TLS client's relayed SCRAM login that could bind is refused by the node, with a hint" \
    grep -q "channel_binding=disable" <<<"$got"
got=$(psql -X -At "host=127.0.0.1 port=28440 dbname=$database user=any_scram password='any pass' sslmode=require channel_binding=disable" \
    -c "SELECT session_user" 2>&1)
check "verify-full: ... and logs in with channel_binding=disable (got: $got)" test "$got" = "any_scram"

got=$(via 28441 tls_only "SELECT owner FROM accounts WHERE id = 42")
check "disable: a node that wants TLS refuses the plain login, and the client is told" \
    grep -q 'no encryption' <<<"$got"
got=$(via 28441 postgres "SELECT owner FROM accounts WHERE id = 42")
check "disable: plain logins still served (got: $got)" test "$got" = "owner 42"

scram_dsn="host=localhost hostaddr=127.0.0.1 port=28442 dbname=$database user=tls_scram password='scram pass' sslrootcert=$tls_dir/ca.crt"
got=$(psql -X -At "$scram_dsn sslmode=verify-full channel_binding=require" -v ON_ERROR_STOP=1 \
    -c "SELECT owner FROM accounts WHERE id = 42" -c "SELECT session_user" 2>&1 | tr '\n' ' ')
# (the metadata node's session: its own connections to the workers would
# need a password of their own, .pgpass)
check "SCRAM-SHA-256-PLUS: client to coordinator (channel_binding=require) and coordinator to worker and metadata node (got: $got)" \
    test "$got" = "owner 42 tls_scram "
got=$(psql -X -At "$scram_dsn sslmode=disable" -c "SELECT owner FROM accounts WHERE id = 42" 2>&1)
check "SCRAM without TLS still logs in (got: $got)" test "$got" = "owner 42"
got=$(psql -X -At "host=127.0.0.1 port=28442 dbname=$database user=tls_scram password=wrong sslmode=require" -c "SELECT 1" 2>&1)
check "SCRAM-SHA-256-PLUS: a wrong password is refused" grep -q 'password authentication failed' <<<"$got"

got=$(via 28443 postgres "SELECT owner FROM accounts WHERE id = 42")
check "verify-ca: a certificate of another CA is refused, saying why" \
    grep -qiE 'TLS with server 127.0.0.1:2832[0-3] failed: .*(UnknownIssuer|certificate)' <<<"$got"

# prefer, with a client on TLS and a node that asks for SCRAM: the client
# says "y" (no -PLUS offered), which the node refuses over TLS as a
# downgrade; the exchange goes on over a plain connection.
# (a statement of the metadata node's own: the pools' logins to the
# workers would need server_password, the node's own to them .pgpass)
refusals() { grep -c "channel binding negotiation" "$cluster_dir/metadata/server.log"; }
before=$(refusals)
got=$(psql -X -At "host=127.0.0.1 port=28444 dbname=$database user=any_scram password='any pass' sslmode=require" \
    -c "SELECT session_user" 2>&1)
check "prefer: a TLS client's SCRAM login relayed to the node (got: $got)" test "$got" = "any_scram"
check "prefer: ... without a refusal in the node's log (the \"y\" never went over TLS)" test "$(refusals)" = "$before"
got=$(psql -X -At "host=127.0.0.1 port=28444 dbname=$database user=tls_scram password='scram pass' sslmode=require" \
    -c "SELECT session_user" 2>&1)
check "prefer: a role the node wants on TLS cannot be relayed from a client that could bind, and is told what to do" \
    grep -q "channel_binding=disable" <<<"$got"
got=$(psql -X -At "host=127.0.0.1 port=28444 dbname=$database user=tls_scram password='scram pass' sslmode=require channel_binding=disable" \
    -c "SELECT session_user" 2>&1)
check "prefer: ... and with channel_binding=disable it logs in over TLS (got: $got)" test "$got" = "tls_scram"
got=$(psql -X -At "host=127.0.0.1 port=28444 dbname=$database user=tls_only sslmode=require" \
    -c "SELECT owner FROM accounts WHERE id = 42" 2>&1)
check "prefer: a node that wants TLS for the login gets it (got: $got)" test "$got" = "owner 42"
got=$(psql -X -At "host=127.0.0.1 port=28444 dbname=$database user=tls_only sslmode=disable" \
    -c "SELECT count(*) > 0 FROM accounts" 2>&1)
check "prefer: TLS with the nodes for a plain client (got: $got)" test "$got" = "t"

got=$(via 28445 cert_user "SELECT owner FROM accounts WHERE id = 42")
check "client certificate: shown by the pools to worker (auth = trust) (got: $got)" test "$got" = "owner 42"
got=$(via 28445 cert_user "SELECT session_user")
check "client certificate: shown by the pools to the metadata node (got: $got)" test "$got" = "cert_user"
got=$(via 28446 cert_user "SELECT session_user")
check "client certificate: never shown for a relayed login (passthrough) (got: $got)" \
    grep -q "certificate" <<<"$got"

for port in 28440 28441 28442 28443 28444 28445 28446; do
    if grep -qE 'panicked|ERROR' "$cluster_dir/coordinator-$port.log"; then
        not_ok "coordinator $port logged an error: $(grep -E 'panicked|ERROR' "$cluster_dir/coordinator-$port.log" | head -2)"
    fi
done
exit $((failures > 0))
