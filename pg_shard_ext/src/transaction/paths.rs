//! Which path a local transaction's statements on distributed tables took:
//! pg_shard's own connections (router statements) or postgres_fdw's. Each
//! has its own connections to the workers, and neither sees what the other
//! wrote in the same transaction, so a transaction that wrote along one
//! path does not take the other (see `planner::router`). Marked with the
//! backend's local transaction id, so nothing needs resetting.

use pgrx::pg_sys;
use std::cell::Cell;

thread_local! {
    static ROUTER_WROTE: Cell<u32> = const { Cell::new(0) };
    static FDW_WROTE: Cell<u32> = const { Cell::new(0) };
}

fn local_transaction() -> u32 {
    // SAFETY: MyProc is this backend's PGPROC, valid in a backend.
    unsafe {
        if pg_sys::MyProc.is_null() {
            0
        } else {
            (*pg_sys::MyProc).lxid
        }
    }
}

/// A router statement wrote on a worker in this transaction.
pub(crate) fn router_wrote() {
    ROUTER_WROTE.set(local_transaction());
}

/// A statement over postgres_fdw was planned to write in this transaction.
pub(crate) fn fdw_wrote() {
    FDW_WROTE.set(local_transaction());
}

pub(crate) fn did_router_write() -> bool {
    let now = local_transaction();
    now != 0 && ROUTER_WROTE.get() == now
}

pub(crate) fn did_fdw_write() -> bool {
    let now = local_transaction();
    now != 0 && FDW_WROTE.get() == now
}
