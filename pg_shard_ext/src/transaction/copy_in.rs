//! COPY … FROM STDIN to a node over a [`NodeConnection`], sent without
//! waiting for the node to store it.

use super::connection::{NodeConnection, Outcome};
use super::libpq::*;
use crate::error::Result;
use pgrx::pg_sys;
use std::ffi::{c_char, c_int};

impl NodeConnection {
    /// Send `COPY … FROM STDIN` and all of `data` (its pieces in order) without waiting for the
    /// node to finish storing it, so the caller can prepare the next batch
    /// (or keep another node busy) meanwhile. [`NodeConnection::finish_copy_in`]
    /// must read the outcome before the connection is used again.
    pub(crate) fn start_copy_in(&mut self, sql: &str, data: &[&[u8]]) -> Result<()> {
        let statement = self.c_string(sql)?;
        // SAFETY: as in execute.
        let sent = unsafe { PQsendQuery(self.conn, statement.as_ptr()) };
        self.sent(sent)?;
        let result = self.next_result()?;
        let Some(result) = result else {
            return Err(self.failure("COPY returned no result".into()));
        };
        // SAFETY: a live result.
        if unsafe { PQresultStatus(result.0) } != PGRES_COPY_IN {
            let error = self.result_error(&result);
            drop(result);
            let _ = self.results(|_| Ok(()));
            return Err(error);
        }
        drop(result);
        for chunk in data.iter().flat_map(|piece| piece.chunks(1 << 20)) {
            loop {
                // SAFETY: a connection in COPY IN; chunk is valid for the call.
                let put = unsafe {
                    PQputCopyData(
                        self.conn,
                        chunk.as_ptr() as *const c_char,
                        chunk.len() as c_int,
                    )
                };
                match put {
                    1 => break,
                    0 => {
                        self.wait(pg_sys::WL_SOCKET_WRITEABLE, None);
                    }
                    _ => return Err(self.failure(self.error_message())),
                }
            }
        }
        loop {
            // SAFETY: as above.
            match unsafe { PQputCopyEnd(self.conn, std::ptr::null()) } {
                1 => break,
                0 => {
                    self.wait(pg_sys::WL_SOCKET_WRITEABLE, None);
                }
                _ => return Err(self.failure(self.error_message())),
            }
        }
        self.send_some()
    }

    /// Pass what libpq holds of a started COPY on to the node as far as
    /// the socket takes it now, without waiting.
    fn send_some(&mut self) -> Result<()> {
        // SAFETY: a valid non-blocking connection; PQflush sends what the
        // socket takes and keeps the rest, and reading what the node sent
        // meanwhile keeps it from blocking on us.
        unsafe {
            if PQflush(self.conn) < 0 || PQconsumeInput(self.conn) == 0 {
                return Err(self.failure(self.error_message()));
            }
        }
        Ok(())
    }

    /// Whether the COPY [`NodeConnection::start_copy_in`] sent has ended
    /// (all of it sent, its outcome arrived), without waiting; what libpq
    /// holds is passed on meanwhile.
    pub(crate) fn copy_in_done(&mut self) -> Result<bool> {
        // SAFETY: a valid non-blocking connection (as in send_some).
        unsafe {
            let flushed = PQflush(self.conn);
            if flushed < 0 || PQconsumeInput(self.conn) == 0 {
                return Err(self.failure(self.error_message()));
            }
            Ok(flushed == 0 && PQisBusy(self.conn) == 0)
        }
    }

    /// The outcome of the COPY [`NodeConnection::start_copy_in`] sent, once
    /// all of its data has reached the node.
    pub(crate) fn finish_copy_in(&mut self) -> Result<Outcome> {
        self.flush()?;
        self.results(|_| Ok(()))
    }
}
