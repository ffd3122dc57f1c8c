//! Waiting for a node: on the backend's latch and the connection's socket
//! together, so that a cancel, `statement_timeout` or the postmaster's
//! death ends the wait at once; and the cancel request sent to the node
//! when the backend stops waiting for good.
//!
//! Each connection keeps its wait set (an epoll set of the latch, the
//! postmaster's death and the socket) for its life: `WaitLatchOrSocket`
//! builds and closes one on every call, five system calls around each
//! wait, which a single-row statement by key pays once per round trip.

use super::connection::NodeConnection;
use super::libpq::*;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int};
use std::time::Instant;

/// A connection's wait set, made on its first wait.
#[derive(Clone, Copy)]
pub(super) struct WaitSet {
    set: *mut pg_sys::WaitEventSet,
    /// The socket it watches (libpq may change sockets while connecting).
    socket: c_int,
    /// Its position in the set and the events it waits for there.
    position: c_int,
    events: u32,
}

impl WaitSet {
    /// Free the set (its epoll descriptor included).
    pub(super) fn free(self) {
        // SAFETY: a set made by `NodeConnection::wait_set` and freed once:
        // its owner forgets it here.
        unsafe { pg_sys::FreeWaitEventSet(self.set) };
    }
}

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
            let fired = self.wait_once(events, timeout);
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

    /// One wait, for whichever comes first: the latch, `events` on the
    /// socket, or `timeout` (ms, -1 for none). What fired, as WL_* flags.
    fn wait_once(&self, events: u32, timeout: std::ffi::c_long) -> u32 {
        // SAFETY: a valid connection.
        let connected = unsafe { PQstatus(self.conn) } == CONNECTION_OK;
        if !connected {
            // While connecting libpq may close its socket and open another
            // under the same number, which a kept set would no longer
            // watch: a set made for this wait only.
            let mut flags = events | pg_sys::WL_LATCH_SET | pg_sys::WL_EXIT_ON_PM_DEATH;
            if timeout >= 0 {
                flags |= pg_sys::WL_TIMEOUT;
            }
            // SAFETY: MyLatch is the backend's latch; the socket belongs to
            // this connection.
            return unsafe {
                pg_sys::WaitLatchOrSocket(
                    pg_sys::MyLatch,
                    flags as c_int,
                    PQsocket(self.conn),
                    timeout,
                    pg_sys::PG_WAIT_EXTENSION,
                )
            } as u32;
        }
        let set = self.wait_set(events);
        let mut event = pg_sys::WaitEvent::default();
        // SAFETY: a set of this connection's, valid until freed with it;
        // one event slot for one event.
        let count = unsafe {
            pg_sys::WaitEventSetWait(set, timeout, &mut event, 1, pg_sys::PG_WAIT_EXTENSION)
        };
        if count == 0 {
            pg_sys::WL_TIMEOUT
        } else {
            event.events
        }
    }

    /// The connection's wait set, watching its socket for `events`: made
    /// on the first wait (and again if libpq changed sockets), changed in
    /// place when the events differ from the last wait's.
    fn wait_set(&self, events: u32) -> *mut pg_sys::WaitEventSet {
        // SAFETY: a valid connection.
        let socket = unsafe { PQsocket(self.conn) };
        match self.wait_set.get() {
            // (A position of -1: adding the events failed; made again.)
            Some(cached) if cached.socket == socket && cached.position >= 0 => {
                if cached.events != events {
                    // SAFETY: the socket's position in this set.
                    unsafe {
                        pg_sys::ModifyWaitEvent(
                            cached.set,
                            cached.position,
                            events,
                            std::ptr::null_mut(),
                        )
                    };
                    self.wait_set.set(Some(WaitSet { events, ..cached }));
                }
                return cached.set;
            }
            Some(stale) => {
                self.wait_set.set(None);
                stale.free();
            }
            None => {}
        }
        // SAFETY: a set in TopMemoryContext (it outlives transactions, as
        // the connection does), freed with the connection.
        let set = unsafe { pg_sys::CreateWaitEventSet(pg_sys::TopMemoryContext, 3) };
        // Kept before anything else can raise an error, so that an error
        // adding its events still frees it with the connection.
        self.wait_set.set(Some(WaitSet {
            set,
            socket,
            position: -1,
            events,
        }));
        // SAFETY: MyLatch is the backend's latch and the socket belongs to
        // this open connection. Postmaster death can only be watched under
        // a postmaster (not in single-user mode), as WaitLatchOrSocket does.
        let position = unsafe {
            let (no_socket, no_latch, no_data) = (
                pg_sys::PGINVALID_SOCKET,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            );
            pg_sys::AddWaitEventToSet(
                set,
                pg_sys::WL_LATCH_SET,
                no_socket,
                pg_sys::MyLatch,
                no_data,
            );
            if pg_sys::IsUnderPostmaster {
                pg_sys::AddWaitEventToSet(
                    set,
                    pg_sys::WL_EXIT_ON_PM_DEATH,
                    no_socket,
                    no_latch,
                    no_data,
                );
            }
            pg_sys::AddWaitEventToSet(set, events, socket, no_latch, no_data)
        };
        self.wait_set.set(Some(WaitSet {
            set,
            socket,
            position,
            events,
        }));
        set
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
