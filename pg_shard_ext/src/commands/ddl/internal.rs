//! pg_shard's own DDL on its distributed and reference tables (a partition
//! detached by a move, the routing table renamed into place): run past the
//! ProcessUtility hook, which would otherwise carry it to the shards.

use crate::error::Result;
use std::cell::Cell;

thread_local! {
    // Set while pg_shard runs DDL of its own on a distributed table.
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Whether the statement running now is pg_shard's own (see [`run_internal`]).
pub(super) fn running_internal() -> bool {
    INTERNAL.get()
}

/// Runs pg_shard's own DDL on a distributed or reference table: the hook
/// leaves it alone.
pub(crate) fn run_internal(sql: &str) -> Result<()> {
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INTERNAL.set(self.0);
        }
    }
    let _reset = Reset(INTERNAL.replace(true));
    crate::spi::run(sql)?;
    Ok(())
}
