//! The node's WAL flushed on request: a job that reads its slot under a
//! cutover's lock must see every write made before the lock, and a slot's
//! reader only sees flushed WAL (writers may commit asynchronously).

use pgrx::prelude::*;

/// `pg_shard.flush_wal()`: the node's WAL flushed up to its insert
/// position now, which it returns (as `pg_lsn` prints it). Every
/// transaction committed before the call ends at or before it. Unlike a
/// synchronous commit of a logical message, it needs no transaction of its
/// own: it runs inside the cutover lock's, in the same round trip.
#[pg_extern(schema = "pg_shard", volatile, parallel_unsafe)]
fn flush_wal() -> String {
    // SAFETY: plain calls into PostgreSQL's WAL module from a backend, in a
    // transaction; XLogFlush raises an ERROR on a write failure, which the
    // pg_extern guard turns into the statement's error.
    let position = unsafe {
        let position = pg_sys::GetXLogInsertRecPtr();
        pg_sys::XLogFlush(position);
        position
    };
    format!("{:X}/{:X}", position >> 32, position & 0xFFFF_FFFF)
}
