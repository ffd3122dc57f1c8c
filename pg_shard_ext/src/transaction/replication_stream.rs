//! A logical replication stream from a node's walsender (libpq, a
//! `replication=database` connection, `START_REPLICATION … LOGICAL`): the
//! output plugin's messages as the walsender decodes them. Waits are on the
//! backend's latch and the socket, as every node connection's are.

use super::connection::NodeConnection;
use super::libpq::*;
use crate::error::Result;
use crate::metadata::Node;
use crate::quote;
use pg_shard_core::pgoutput::Lsn;
use pg_shard_core::replication_stream::{decode_frame, status_update, Frame};
use pgrx::pg_sys;
use std::ffi::c_char;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The bytes before a WAL data frame's message ('w', start, end, time).
const WAL_DATA_HEADER: usize = 25;

/// Seconds from the Unix epoch to PostgreSQL's (2000-01-01).
const POSTGRES_EPOCH_SECONDS: u64 = 946_684_800;

pub(crate) struct ReplicationStream {
    connection: NodeConnection,
}

impl ReplicationStream {
    /// Streams `slot` (pgoutput, protocol 1, publication `publication`,
    /// with `pg_logical_emit_message` messages) on `node` from where the
    /// slot stands. Fails while another process reads the slot.
    pub(crate) fn start(node: &Node, slot: &str, publication: &str) -> Result<ReplicationStream> {
        let mut connection = NodeConnection::open_as(node, &[("replication", "database")])?;
        connection.cancel_on_drop = false;
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL 0/0 (\"proto_version\" '1', \
             \"publication_names\" {}, \"messages\" 'true')",
            quote::ident(slot),
            quote::literal(&quote::ident(publication)),
        );
        connection.send_statements(&command)?;
        let Some(result) = connection.next_result()? else {
            return Err(connection.failure("START_REPLICATION returned nothing".into()));
        };
        // SAFETY: a live result.
        if unsafe { PQresultStatus(result.0) } != PGRES_COPY_BOTH {
            return Err(connection.result_error(&result));
        }
        Ok(ReplicationStream { connection })
    }

    /// The next output plugin message, waiting until `deadline` (None when
    /// it passed). Keepalives that ask for an answer get one, confirming
    /// nothing: the reader records what it applied itself, and the slot is
    /// advanced apart.
    pub(crate) fn next(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>> {
        loop {
            let Some(frame_bytes) = self.frame(deadline)? else {
                return Ok(None);
            };
            let frame = decode_frame(&frame_bytes).map_err(|e| {
                self.connection
                    .failure(format!("reading the replication stream: {e}"))
            })?;
            match frame {
                Frame::WalData { .. } => {
                    // (The message, without the frame's 25-byte header.)
                    let mut message = frame_bytes;
                    message.drain(..WAL_DATA_HEADER);
                    return Ok(Some(message));
                }
                Frame::Keepalive { reply: true, .. } => self.answer()?,
                Frame::Keepalive { .. } => {}
            }
        }
    }

    /// A status update that confirms no position (the walsender takes it as
    /// a sign of life).
    fn answer(&mut self) -> Result<()> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or_default()
            - (POSTGRES_EPOCH_SECONDS * 1_000_000) as i64;
        let update = status_update(Lsn(0), now);
        // SAFETY: a connection in COPY BOTH mode; the buffer outlives the
        // call and its length is given.
        let sent = unsafe {
            PQputCopyData(
                self.connection.conn,
                update.as_ptr() as *const c_char,
                update.len() as std::ffi::c_int,
            )
        };
        self.connection.sent(sent)
    }

    /// One CopyData message's bytes, waiting until `deadline`.
    fn frame(&mut self, deadline: Instant) -> Result<Option<Vec<u8>>> {
        let conn = self.connection.conn;
        loop {
            let mut buffer: *mut c_char = std::ptr::null_mut();
            // SAFETY: a connection in COPY BOTH mode and a valid out-pointer,
            // which libpq sets to a buffer of its own (freed below with
            // PQfreemem) only when it returns a length; asynchronous, so it
            // returns 0 rather than block when no whole message is there.
            let length = unsafe { PQgetCopyData(conn, &mut buffer, 1) };
            if length > 0 {
                // SAFETY: libpq allocated `length` bytes at `buffer`; they are
                // copied, then freed once.
                let bytes = unsafe {
                    let bytes =
                        std::slice::from_raw_parts(buffer as *const u8, length as usize).to_vec();
                    PQfreemem(buffer.cast());
                    bytes
                };
                return Ok(Some(bytes));
            }
            if length < 0 {
                // The stream ended: with the walsender's error, or (it
                // stopped) without one.
                let ended = match self.connection.next_result()? {
                    // SAFETY: a live result.
                    Some(result) if unsafe { PQresultStatus(result.0) } == PGRES_FATAL_ERROR => {
                        self.connection.result_error(&result)
                    }
                    _ => self
                        .connection
                        .failure("the node ended the replication stream".into()),
                };
                return Err(ended);
            }
            if !self
                .connection
                .wait(pg_sys::WL_SOCKET_READABLE, Some(deadline))
            {
                return Ok(None);
            }
            // SAFETY: a valid connection, readable.
            if unsafe { PQconsumeInput(conn) } == 0 {
                return Err(self.connection.failure(self.connection.error_message()));
            }
        }
    }
}
