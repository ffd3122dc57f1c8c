//! The node's WAL flushed on request: a job that reads its slot under a
//! cutover's lock must see every write made before the lock, and a slot's
//! reader only sees flushed WAL (writers may commit asynchronously).

use pgrx::prelude::*;

/// `pg_shard.flush_wal()`: the node's WAL flushed up to now; returns the
/// end of what it flushed (as `pg_lsn` prints it). Every transaction
/// committed before the call ends at or before it. Unlike a synchronous
/// commit of a logical message, it needs no transaction of its own: it runs
/// inside the cutover lock's, in the same round trip.
#[pg_extern(schema = "pg_shard", volatile, parallel_unsafe)]
pub(super) fn flush_wal() -> String {
    // A record of its own (a non-transactional logical message, which no
    // subscription takes and a split's stream passes over), whose end is an exact
    // end of WAL: the insert position may point past a page header that is
    // not written yet, which XLogFlush refuses.
    let end = crate::spi::query_value::<String>(
        "SELECT pg_catalog.pg_logical_emit_message(false, 'pg_shard', 'flush')::text",
    )
    .ok()
    .flatten()
    .and_then(|text| pg_shard_core::pgoutput::Lsn::parse(&text))
    .unwrap_or_else(|| error!("pg_shard: could not write the WAL record to flush to"));
    let position = end.0;
    // SAFETY: a plain call into PostgreSQL's WAL module from a backend, in
    // a transaction, for a position this backend inserted; XLogFlush raises
    // an ERROR on a write failure, which the pg_extern guard turns into the
    // statement's error.
    unsafe { pg_sys::XLogFlush(position) };
    end.to_string()
}
