//! Waiting for a node: on the backend's latch and the connection's socket
//! together, so that a cancel, `statement_timeout` or the postmaster's
//! death ends the wait at once; and the cancel request sent to the node
//! when the backend stops waiting for good.

use super::connection::NodeConnection;
use super::libpq::*;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int};
use std::time::Instant;

impl NodeConnection {
    /// Wait for `events` on the socket, or the latch, until `deadline`;
    /// false when the deadline passed. Interrupts are served here.
    pub(super) fn wait(&self, events: u32, deadline: Option<Instant>) -> bool {
        // SAFETY: a valid connection.
        if unsafe { PQsocket(self.conn) } < 0 {
            // Closed: the caller's next libpq call reports why (PostgreSQL
            // refuses to wait on no socket).
            return true;
        }
        loop {
            let timeout = match deadline {
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    left.as_millis().max(1) as std::ffi::c_long
                }
                None => -1,
            };
            let mut flags = events | pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH;
            if deadline.is_some() {
                flags |= pg_sys::WL_TIMEOUT;
            }
            // SAFETY: MyLatch is the backend's latch; the socket belongs to
            // this open connection.
            let fired = unsafe {
                pg_sys::WaitLatchOrSocket(
                    pg_sys::MyLatch,
                    flags as c_int,
                    PQsocket(self.conn),
                    timeout,
                    pg_sys::PG_WAIT_EXTENSION,
                )
            } as u32;
            if fired & pg_sys::WL_LATCH_SET != 0 {
                // SAFETY: resetting our own latch before serving interrupts.
                unsafe { pg_sys::ResetLatch(pg_sys::MyLatch) };
                pgrx::check_for_interrupts!();
            }
            if fired & events != 0 {
                return true;
            }
            if fired & pg_sys::WL_TIMEOUT != 0 {
                return false;
            }
        }
    }

    /// Ask the node to cancel what this connection runs (best effort).
    pub(super) fn cancel(&self) {
        // SAFETY: a cancel object for this connection, freed here; PQcancel
        // writes at most errbuf's size.
        unsafe {
            let cancel = PQgetCancel(self.conn);
            if cancel.is_null() {
                return;
            }
            let mut errbuf = [0 as c_char; 256];
            PQcancel(cancel, errbuf.as_mut_ptr(), errbuf.len() as c_int);
            PQfreeCancel(cancel);
        }
    }
}
