#!/usr/bin/env bash
# Debian packages of pg_shard, for Debian 12 with PostgreSQL 15 (`make
# package`):
#   postgresql-15-pg-shard   the extension, as `cargo pgrx package` lays it
#                            out (the library and the extension's SQL)
#   pg-shard-coordinator     the coordinator: /usr/bin/pg_shard_coordinator,
#                            a systemd unit (not enabled) and its settings
#                            in /etc/pg_shard/coordinator.toml (a conffile)
# Written to target/debian/ (or OUT), built from the working tree in release
# mode. Install with `apt install ./target/debian/<package>.deb`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=${OUT:-$repo/target/debian}
pg_config=${PG_CONFIG:-$(command -v pg_config)}
pg_major=$("$pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml" | head -1)
# Each commit builds a higher version than the one before (apt upgrades
# from one build to the next): the crate's version, then the commit count
# and hash. Outside a git checkout, the crate's version alone.
if commits=$(git -C "$repo" rev-list --count HEAD 2>/dev/null); then
    version="$version+git$commits.$(git -C "$repo" rev-parse --short=7 HEAD)"
fi
revision=${PACKAGE_REVISION:-1}
arch=$(dpkg --print-architecture)
maintainer="pg_shard developers <pg_shard@localhost>"
mkdir -p "$out"
# One build of each package in $out: tests and images install "the" one.
rm -f "$out"/postgresql-*-pg-shard_*.deb "$out"/pg-shard-coordinator_*.deb
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A .deb of the tree in $1 named $2 (its DEBIAN/control written by the
# caller), owned by root whoever builds it.
build_deb() {
    local tree=$1 name=$2
    find "$tree" -type d -exec chmod 0755 {} +
    (cd "$tree" && find . -path ./DEBIAN -prune -o -type f -print0 | sort -z |
        xargs -0 md5sum | sed 's| \./| |') >"$tree/DEBIAN/md5sums"
    dpkg-deb --root-owner-group -Zxz --build "$tree" "$out/$name" >/dev/null
    echo "package: $out/$name"
}

# The extension.
if ! (cd "$repo/pg_shard_ext" && cargo pgrx package --pg-config "$pg_config" >"$work/pgrx.log" 2>&1); then
    cat "$work/pgrx.log" >&2
    exit 1
fi
staged=$repo/target/release/pg_shard-pg$pg_major
extension=$work/extension
mkdir -p "$extension/DEBIAN" "$extension/usr/share/doc/postgresql-$pg_major-pg-shard"
cp -a "$staged/usr" "$extension/"
cp "$repo/README.md" "$repo/docs/sql-api.md" "$repo/docs/ARCHITECTURE.md" \
    "$extension/usr/share/doc/postgresql-$pg_major-pg-shard/"
cat >"$extension/DEBIAN/control" <<EOF
Package: postgresql-$pg_major-pg-shard
Version: $version-$revision
Architecture: $arch
Maintainer: $maintainer
Depends: postgresql-$pg_major, libpq5, libgcc-s1, libc6
Section: database
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$extension" | cut -f1)
Description: horizontal sharding for PostgreSQL $pg_major (extension)
 pg_shard spreads tables over several PostgreSQL servers by a key, keeps a
 versioned shard map on a metadata node, moves and splits shards online
 over logical replication and runs statements on the nodes that hold their
 rows. Install it on the metadata node and on every worker, add pg_shard
 to shared_preload_libraries, restart, and run CREATE EXTENSION pg_shard.
EOF
build_deb "$extension" "postgresql-$pg_major-pg-shard_$version-${revision}_$arch.deb"

# The coordinator.
cargo build --release -q -p pg_shard_coordinator --manifest-path "$repo/Cargo.toml"
coordinator=$work/coordinator
mkdir -p "$coordinator/DEBIAN" "$coordinator/usr/bin" "$coordinator/lib/systemd/system" \
    "$coordinator/etc/pg_shard" "$coordinator/usr/share/doc/pg-shard-coordinator"
install -m 0755 -s "$repo/target/release/pg_shard_coordinator" "$coordinator/usr/bin/"
install -m 0644 "$repo/packaging/pg-shard-coordinator.service" "$coordinator/lib/systemd/system/"
install -m 0644 "$repo/packaging/coordinator.toml" "$coordinator/etc/pg_shard/"
install -m 0644 "$repo/docs/coordinator.md" "$coordinator/usr/share/doc/pg-shard-coordinator/"
echo /etc/pg_shard/coordinator.toml >"$coordinator/DEBIAN/conffiles"
# systemd learns of a new or changed unit, a running coordinator is
# restarted on upgrade and stopped on removal.
install -m 0755 "$repo/packaging/coordinator.postinst" "$coordinator/DEBIAN/postinst"
install -m 0755 "$repo/packaging/coordinator.prerm" "$coordinator/DEBIAN/prerm"
install -m 0755 "$repo/packaging/coordinator.postrm" "$coordinator/DEBIAN/postrm"
cat >"$coordinator/DEBIAN/control" <<EOF
Package: pg-shard-coordinator
Version: $version-$revision
Architecture: $arch
Maintainer: $maintainer
Depends: libgcc-s1, libc6
Recommends: postgresql-client-$pg_major
Section: database
Priority: optional
Installed-Size: $(du -sk --exclude=DEBIAN "$coordinator" | cut -f1)
Description: front door of a pg_shard cluster (PostgreSQL protocol)
 The coordinator speaks the PostgreSQL protocol to applications and sends
 each statement that touches one shard straight to the worker that holds
 it, and the others to the metadata node. Its settings are in
 /etc/pg_shard/coordinator.toml; the systemd unit pg-shard-coordinator is
 installed but not enabled.
EOF
build_deb "$coordinator" "pg-shard-coordinator_$version-${revision}_$arch.deb"
