//! What an index or constraint of a distributed table is called on its
//! shards, and whether an index name is free in a schema.

use crate::error::Result;
use crate::quote;
use crate::spi::query_one;
use pgrx::prelude::*;

/// The name an index or constraint has on the shard table `shard_id`:
/// index-backed ones (kinds p, u, x, i) carry the shard id.
pub(super) fn shard_object_name(kind: char, name: &str, shard_id: i64) -> String {
    if matches!(kind, 'p' | 'u' | 'x' | 'i') {
        quote::name_with_suffix(name, &format!("_{shard_id}"))
    } else {
        name.to_string()
    }
}

/// Whether an index called `name` in the schema `namespace` would collide
/// with a relation there, or with an index-backed object recorded for a
/// distributed table there (other than `except_table`'s).
pub(super) fn index_name_taken(
    namespace: pg_sys::Oid,
    name: &str,
    except_table: Option<pg_sys::Oid>,
) -> Result<bool> {
    Ok(query_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_class WHERE relname = $2 AND relnamespace = $1) \
             OR EXISTS (SELECT 1 FROM pg_shard.table_constraint t \
                        JOIN pg_class c ON c.oid = t.table_rel \
                        WHERE t.name = $2 AND t.kind IN ('p', 'u', 'x', 'i') \
                          AND c.relnamespace = $1 \
                          AND t.table_rel::oid IS DISTINCT FROM $3)",
        &[namespace.into(), name.into(), except_table.into()],
    )?
    .unwrap_or(false))
}

pub(super) fn namespace_of(relid: pg_sys::Oid) -> Result<pg_sys::Oid> {
    Ok(query_one::<pg_sys::Oid>(
        "SELECT relnamespace FROM pg_class WHERE oid = $1",
        &[relid.into()],
    )?
    .unwrap_or(pg_sys::InvalidOid))
}
