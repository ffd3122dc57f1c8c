#!/usr/bin/env bash
# What TLS costs on the coordinator's hot path, side by side in one run:
# pgbench -S (scale S, default 10; T seconds per run, default 10) at 4 and
# 16 clients, simple and prepared protocol, through three coordinators in
# front of the same cluster (nodes with ssl = on, a CA made here), all
# reaching the nodes over TCP:
#   plain        clients plain, nodes plain (server_tls_sslmode = disable)
#   nodes TLS    clients plain, nodes over TLS (verify-full)
#   both TLS     clients over TLS (tls = require, sslmode=require), nodes
#                over TLS (verify-full)
# and, for what TLS costs PostgreSQL itself, pgbench straight to a worker
# (a plain database of its own with the same data), sslmode=disable and
# sslmode=require.
# Targets alternate within each round, and the rounds repeat (default 2),
# so that a noisy neighbour hits all of them alike. Reports tps per round
# and the ratio of each target's mean to plain's.
#
# Own throwaway cluster: metadata 29520, workers 29521-29522, coordinators
# 29620 (scripts/cluster.sh's, unused here), 29630-29632. Run with:
# make bench-tls
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
scale=${1:-10}
seconds=${2:-10}
rounds=${PGSHARD_BENCH_ROUNDS:-2}
export PGSHARD_CLUSTER_DIR=$repo/.cluster-bench-tls
export PGSHARD_BASE_PORT=29520
export PGSHARD_WORKERS=2
export PGSHARD_DATABASE=bench
export PGUSER=postgres
bin=${CARGO_TARGET_DIR:-$repo/target}/release/pg_shard_coordinator
"$repo/scripts/cluster.sh" destroy >/dev/null
"$repo/scripts/cluster.sh" start >/dev/null
scratch=$(mktemp -d)
chmod 711 "$scratch"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$scratch"
    "$repo/scripts/cluster.sh" destroy >/dev/null
}
trap cleanup EXIT

# A CA and a certificate for 127.0.0.1, for the nodes and the coordinator.
(
    cd "$scratch" &&
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 2 -subj "/CN=bench CA" &&
        openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost" &&
        printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' >server.ext &&
        openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
            -extfile server.ext -out server.crt
) >"$scratch/openssl.log" 2>&1
chown postgres "$scratch/server.crt" "$scratch/server.key"
chmod 600 "$scratch/server.key"
for port in 29520 29521 29522; do
    psql -X -q -h 127.0.0.1 -p "$port" -d postgres -v ON_ERROR_STOP=1 \
        -c "ALTER SYSTEM SET ssl_cert_file = '$scratch/server.crt'" \
        -c "ALTER SYSTEM SET ssl_key_file = '$scratch/server.key'" \
        -c "ALTER SYSTEM SET ssl = on" -c "SELECT pg_reload_conf()" >/dev/null
done

psql -X -q -h 127.0.0.1 -p 29520 -d bench -v ON_ERROR_STOP=1 >/dev/null <<SQL
CREATE EXTENSION pg_shard;
SELECT pg_shard.add_node('127.0.0.1', 29521);
SELECT pg_shard.add_node('127.0.0.1', 29522);
SQL
pgbench -i -q -s "$scale" -h 127.0.0.1 -p 29520 bench >/dev/null 2>&1
psql -X -q -h 127.0.0.1 -p 29520 -d bench -v ON_ERROR_STOP=1 >/dev/null <<SQL
SELECT pg_shard.create_distributed_table('pgbench_accounts', 'aid');
SQL
for port in 29521 29522; do psql -X -q -h 127.0.0.1 -p "$port" -d bench -c "VACUUM ANALYZE"; done
psql -X -q -h 127.0.0.1 -p 29521 -d postgres -c "CREATE DATABASE single"
pgbench -i -q -s "$scale" -h 127.0.0.1 -p 29521 single >/dev/null 2>&1

start() { # port flags...
    local port=$1
    shift
    setsid "$bin" --listen "127.0.0.1:$port" --metadata 127.0.0.1:29520 --metrics-listen "" "$@" \
        >"$scratch/coordinator-$port.log" 2>&1 &
    pids+=($!)
}
verify=(--server-tls-sslmode verify-full --server-tls-ca-file "$scratch/ca.crt")
start 29630 --server-tls-sslmode disable
start 29631 "${verify[@]}"
start 29632 "${verify[@]}" --tls require --tls-cert-file "$scratch/server.crt" --tls-key-file "$scratch/server.key"
sleep 1
targets=("plain:29630:disable:bench" "nodes TLS:29631:disable:bench" "both TLS:29632:require:bench"
    "direct plain:29521:disable:single" "direct TLS:29521:require:single")

declare -A tps
echo "pgbench -S, scale $scale, ${seconds}s per run, $rounds rounds"
for round in $(seq 1 "$rounds"); do
    for clients in 4 16; do
        for protocol in simple prepared; do
            for target in "${targets[@]}"; do
                IFS=: read -r name port sslmode database <<<"$target"
                result=$(PGSSLMODE=$sslmode pgbench -n -S -M "$protocol" -c "$clients" -j 2 -T "$seconds" \
                    -h 127.0.0.1 -p "$port" "$database" 2>&1)
                value=$(sed -n 's/^tps = \([0-9.]*\) .*/\1/p' <<<"$result")
                if ! grep -q "number of failed transactions: 0 " <<<"$result"; then
                    echo "$name, $clients clients, $protocol: failed" >&2
                    echo "$result" >&2
                    exit 1
                fi
                tps["$name|$clients|$protocol"]+="$value "
            done
        done
    done
done
echo
echo "| target | clients | protocol | tps per round | mean | ratio to plain (direct: to direct plain) |"
echo "|---|---:|---|---|---:|---:|"
for clients in 4 16; do
    for protocol in simple prepared; do
        base=
        for target in "${targets[@]}"; do
            IFS=: read -r name _ _ _ <<<"$target"
            values=${tps["$name|$clients|$protocol"]}
            mean=$(awk '{ s = 0; for (i = 1; i <= NF; i++) s += $i; printf "%.0f", s / NF }' <<<"$values")
            if [ -z "$base" ] || [ "$name" = "direct plain" ]; then base=$mean; fi
            ratio=$(awk -v m="$mean" -v b="$base" 'BEGIN { printf "%.2f", m / b }')
            rounded=$(awk '{ for (i = 1; i <= NF; i++) printf "%s%.0f", (i > 1 ? ", " : ""), $i }' <<<"$values")
            echo "| $name | $clients | $protocol | $rounded | $mean | $ratio |"
        done
    done
done
