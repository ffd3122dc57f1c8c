//! A worker's ownership records (`pg_shard.local_shard`), written for the
//! role that owns the shard table.
//!
//! Only pg_shard writes the records, so PUBLIC may not. A table's owner who
//! was granted `create_distributed_table` makes its shards over a
//! connection that logs in as itself, though: `pg_shard.record_local_shard`
//! writes the record of a shard table the caller owns. That gives it no
//! power it lacks: it could drop the guard triggers of its own table anyway.
//! It cannot touch the record of another role's shard.

use crate::error::{OrReport, Result, ShardError};
use crate::quote;
use pgrx::prelude::*;

/// The statement, run on the worker, that records `shard_rel` (qualified) as
/// shard `shard_id` with `range` and `state` at `epoch` (replacing its record
/// if it has one).
pub(crate) fn record_sql(
    shard_rel: &str,
    shard_id: i64,
    dist_column: Option<&str>,
    range: (i64, i64),
    state: &str,
    epoch: i64,
) -> String {
    format!(
        "SELECT pg_shard.record_local_shard({}::pg_catalog.regclass, {shard_id}, {}, {}, {}, {}, {epoch})",
        quote::literal(shard_rel),
        dist_column.map_or_else(|| "NULL".to_string(), quote::literal),
        range.0,
        range.1,
        quote::literal(state),
    )
}

/// `pg_shard.record_local_shard(…)`: see the module comment.
#[pg_extern(schema = "pg_shard")]
fn record_local_shard(
    shard_rel: pg_sys::Oid,
    shard_id: i64,
    dist_column: Option<&str>,
    range_start: i64,
    range_end: i64,
    state: &str,
    epoch: i64,
) {
    record(
        shard_rel,
        shard_id,
        dist_column,
        (range_start, range_end),
        state,
        epoch,
    )
    .or_report()
}

fn record(
    shard_rel: pg_sys::Oid,
    shard_id: i64,
    dist_column: Option<&str>,
    range: (i64, i64),
    state: &str,
    epoch: i64,
) -> Result<()> {
    let display = crate::spi::caller_relation_name(shard_rel);
    crate::access::require_table_owner(shard_rel, &display)?;
    let recorded_for = crate::spi::query_one::<pg_sys::Oid>(
        "SELECT shard_rel::pg_catalog.oid FROM pg_shard.local_shard WHERE shard_id = $1",
        &[shard_id.into()],
    )?;
    if let Some(other) = recorded_for.filter(|other| *other != shard_rel) {
        if !crate::access::is_superuser() {
            return Err(ShardError::PermissionDenied(format!(
                "shard {shard_id} is recorded for table {}, not {display}",
                crate::spi::caller_relation_name(other)
            )));
        }
    }
    crate::metadata::catalog::write(
        "DELETE FROM pg_shard.local_shard WHERE shard_id = $1 OR shard_rel = $2::pg_catalog.regclass",
        &[shard_id.into(), shard_rel.into()],
    )?;
    crate::metadata::catalog::write(
        "INSERT INTO pg_shard.local_shard \
         (shard_rel, shard_id, dist_column, range_start, range_end, state, epoch) \
         VALUES ($1::pg_catalog.regclass, $2, $3, $4, $5, $6, $7)",
        &[
            shard_rel.into(),
            shard_id.into(),
            dist_column.into(),
            range.0.into(),
            range.1.into(),
            state.into(),
            epoch.into(),
        ],
    )
}
