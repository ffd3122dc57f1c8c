//! A job's wait for its marker row, on the node that receives it: the
//! cutover waits inside its write pause for the replication apply of the
//! marker (which activates the node's new shards), and every hop between
//! that apply's commit and the runner seeing it lengthens the pause.
//! Waiting here, in the backend the runner already talks to, takes the
//! hops of a notification relayed to the runner and of the runner's next
//! query out of the pause: the apply's NOTIFY (`pg_shard.marker_activation()`)
//! sets this backend's latch when the session LISTENs on `pg_shard_marker`,
//! and the function answers as soon as it sees the row.

use crate::error::{Result, ShardError};
use pgrx::prelude::*;
use std::time::{Duration, Instant};

/// How long the wait sleeps between looks when no notification wakes it
/// (a session that does not LISTEN, or a NOTIFY lost to a full queue).
const LOOK_EVERY: Duration = Duration::from_millis(2);

/// `pg_shard.await_marker(marker_table, marker, shard_ids, version, timeout_ms)`:
/// waits at most `timeout_ms` for row `marker` of `marker_table` to be
/// committed; then flushes the node's WAL (the apply commits
/// asynchronously: what it did must be durable before the map names this
/// node) and returns one row: the flushed position, whether the shards
/// `shard_ids` are all active at map version `version` (true when
/// `shard_ids` is NULL), and the row's `applied_at` in µs since the epoch.
/// No row when the time ran out.
#[pg_extern(schema = "pg_shard", volatile, parallel_unsafe)]
fn await_marker(
    marker_table: pg_sys::Oid,
    marker: i64,
    shard_ids: Option<Vec<i64>>,
    version: Option<i64>,
    timeout_ms: i32,
) -> TableIterator<
    'static,
    (
        name!(flushed_to, String),
        name!(activated, bool),
        name!(applied_at, Option<i64>),
    ),
> {
    let limit = Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0));
    let found = match wait(marker_table, marker, (shard_ids, version), limit) {
        Ok(found) => found,
        Err(error) => error.report(),
    };
    TableIterator::new(
        found.map(|(activated, applied_at)| (super::wal::flush_wal(), activated, applied_at)),
    )
}

/// Looks for the marker until it is there or `limit` has passed.
fn wait(
    marker_table: pg_sys::Oid,
    marker: i64,
    (shard_ids, version): (Option<Vec<i64>>, Option<i64>),
    limit: Duration,
) -> Result<Option<(bool, Option<i64>)>> {
    let table = crate::spi::query_one::<String>(
        "SELECT oid::pg_catalog.regclass::pg_catalog.text FROM pg_catalog.pg_class WHERE oid = $1",
        &[marker_table.into()],
    )?
    .ok_or_else(|| {
        ShardError::InvalidArgument(format!(
            "there is no relation with OID {}",
            marker_table.to_u32()
        ))
    })?;
    let look = format!(
        "SELECT $2::pg_catalog.int8[] IS NULL OR NOT EXISTS (SELECT 1 FROM pg_shard.local_shard \
             WHERE shard_id = ANY ($2) AND (state <> 'active' OR epoch IS DISTINCT FROM $3)), \
         (EXTRACT(epoch FROM applied_at) * 1e6)::int8 \
         FROM {table} WHERE job = $1"
    );
    let started = Instant::now();
    loop {
        // The latest snapshot (a commit since the last look is seen, at any
        // isolation level); read-only: the wait takes no transaction id, so
        // its commit writes and flushes no record of its own.
        let seen = crate::spi::with_latest_snapshot(|| {
            crate::spi::connect(|client| -> Result<Option<(bool, Option<i64>)>> {
                let mut rows = client.select(
                    &look,
                    Some(1),
                    &[marker.into(), shard_ids.clone().into(), version.into()],
                )?;
                match rows.next() {
                    None => Ok(None),
                    Some(row) => Ok(Some((
                        row.get::<bool>(1)?.unwrap_or(false),
                        row.get::<i64>(2)?,
                    ))),
                }
            })
        })?;
        if seen.is_some() {
            return Ok(seen);
        }
        let left = limit.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Ok(None);
        }
        // (A notification to this session sets the latch.)
        crate::latch::sleep(left.min(LOOK_EVERY));
    }
}
