#!/usr/bin/env bash
# The Docker images (`make docker`):
#   pg-shard-node          PostgreSQL 15 with pg_shard installed and preloaded
#   pg-shard-coordinator   the coordinator
# both installing the project's own Debian packages (scripts/package.sh),
# built on BASE (a Debian 12 image). BASE defaults to debian:bookworm-slim
# when Docker has it or can pull it; otherwise an image made here from
# Debian's mirror (mmdebstrap --variant=minbase bookworm | docker import),
# pg-shard-base:bookworm, made once and kept.
#
# Needs a running Docker engine (tests/docker/run.sh starts one).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=${PGSHARD_IMAGE_TAG:-latest}

if ! docker info >/dev/null 2>&1; then
    echo "docker.sh: no Docker engine answers (start one: dockerd --bridge=none --iptables=false)" >&2
    exit 1
fi

base=${BASE:-}
if [ -z "$base" ]; then
    if docker image inspect debian:bookworm-slim >/dev/null 2>&1 ||
        timeout 60 docker pull -q debian:bookworm-slim >/dev/null 2>&1; then
        base=debian:bookworm-slim
    else
        base=pg-shard-base:bookworm
        if ! docker image inspect "$base" >/dev/null 2>&1; then
            echo "docker.sh: no debian:bookworm-slim; making $base from Debian's mirror"
            mmdebstrap --variant=minbase --quiet bookworm - | docker import - "$base" >/dev/null
        fi
    fi
fi
echo "docker.sh: base image $base"

"$repo/scripts/package.sh"
packages=$repo/target/debian
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT

build() {
    local image=$1 folder=$2 package=$3
    rm -rf "${context:?}"/*
    cp -a "$repo/docker/$folder/." "$context/"
    cp "$packages/$package" "$context/"
    # Host networking: the bridge is off on this kind of machine, and apt
    # reaches the mirror from the host's network.
    docker build --quiet --network host --build-arg BASE="$base" \
        --tag "$image:$tag" "$context" >/dev/null
    echo "image: $image:$tag"
}
# (package.sh leaves one build of each in target/debian)
build pg-shard-node node "$(cd "$packages" && ls postgresql-15-pg-shard_*.deb)"
build pg-shard-coordinator coordinator "$(cd "$packages" && ls pg-shard-coordinator_*.deb)"
