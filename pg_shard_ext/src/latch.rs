//! Sleeping in a backend: on its latch, so that a signal (a notification,
//! a cancel, the postmaster's death) ends the sleep at once.

use pgrx::pg_sys;
use std::time::Duration;

/// Sleeps on the backend's latch for at most `pause` (at least 1 ms),
/// serving interrupts after.
pub(crate) fn sleep(pause: Duration) {
    let flags = pg_sys::WL_LATCH_SET | pg_sys::WL_TIMEOUT | pg_sys::WL_EXIT_ON_PM_DEATH;
    // SAFETY: MyLatch is the backend's own latch; WaitLatch and ResetLatch
    // are called from the backend's own thread.
    unsafe {
        pg_sys::WaitLatch(
            pg_sys::MyLatch,
            flags as std::ffi::c_int,
            pause.as_millis().max(1) as std::ffi::c_long,
            pg_sys::PG_WAIT_EXTENSION,
        );
        pg_sys::ResetLatch(pg_sys::MyLatch);
    }
    pgrx::check_for_interrupts!();
}
