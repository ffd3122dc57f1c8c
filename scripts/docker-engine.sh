#!/usr/bin/env bash
# A Docker engine for the project's images and their tests, on a machine
# where none runs (as on CI): containers use the host's network only
# (--bridge=none --iptables=false; compose files say network_mode: host).
#
#   scripts/docker-engine.sh start   starts dockerd unless one answers, and
#                                    prints its pid (nothing when one ran)
#   scripts/docker-engine.sh stop PID  stops the engine started as PID
set -euo pipefail
log=${PGSHARD_DOCKERD_LOG:-/var/tmp/pg_shard-dockerd.log}

case "${1:-}" in
start)
    if docker info >/dev/null 2>&1; then
        exit 0
    fi
    if ! command -v dockerd >/dev/null; then
        echo "docker-engine.sh: no dockerd (scripts/bootstrap.sh installs docker.io)" >&2
        exit 1
    fi
    setsid dockerd --bridge=none --iptables=false --ip6tables=false >"$log" 2>&1 </dev/null &
    pid=$!
    for _ in $(seq 1 120); do
        if docker info >/dev/null 2>&1; then
            echo "$pid"
            exit 0
        fi
        sleep 0.5
    done
    echo "docker-engine.sh: dockerd did not answer within a minute; its log:" >&2
    tail -20 "$log" >&2
    kill "$pid" 2>/dev/null || true
    exit 1
    ;;
stop)
    pid=${2:?usage: docker-engine.sh stop PID}
    kill "$pid" 2>/dev/null || exit 0
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || exit 0
        sleep 0.2
    done
    echo "docker-engine.sh: dockerd ($pid) still running after 20 s" >&2
    exit 1
    ;;
*)
    echo "usage: docker-engine.sh start | stop PID" >&2
    exit 2
    ;;
esac
