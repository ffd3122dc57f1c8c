//! The job runner's own transactions: a background worker has none unless it
//! starts one, and an error raised inside must end it, not the worker.

use crate::error::{Result, ShardError};
use pgrx::prelude::*;

/// Runs `body` in a transaction of its own: committed when it returns Ok,
/// rolled back when it returns an error or raises one.
pub(crate) fn transaction<T>(body: impl FnOnce() -> Result<T>) -> Result<T> {
    // SAFETY: called from the job runner's main loop, outside any
    // transaction; every path below ends the transaction it starts.
    unsafe {
        pg_sys::SetCurrentStatementStartTimestamp();
        pg_sys::StartTransactionCommand();
        pg_sys::PushActiveSnapshot(pg_sys::GetTransactionSnapshot());
    }
    let result = PgTryBuilder::new(std::panic::AssertUnwindSafe(body))
        .catch_others(|caught| Err(ShardError::JobPanicked(caught_message(&caught))))
        .execute();
    // SAFETY: ends the transaction started above; after a caught error the
    // transaction is in an aborted state and only AbortCurrentTransaction
    // may follow.
    unsafe {
        if result.is_ok() {
            pg_sys::PopActiveSnapshot();
            pg_sys::CommitTransactionCommand();
        } else {
            pg_sys::AbortCurrentTransaction();
        }
    }
    result
}

fn caught_message(caught: &pg_sys::panic::CaughtError) -> String {
    use pg_sys::panic::CaughtError;
    match caught {
        CaughtError::PostgresError(report)
        | CaughtError::ErrorReport(report)
        | CaughtError::RustPanic {
            ereport: report, ..
        } => report.message().to_string(),
    }
}
