//! The errors a node connection reports: libpq's connection failures
//! (naming the node) and the node's own errors with their SQLSTATE,
//! detail, hint and context.

use super::libpq::*;
use super::result_rows::ResultGuard;
use crate::error::{RemoteNotes, ShardError};
use crate::metadata::Node;
use std::ffi::{c_int, CStr};

/// libpq's last message for a connection ("connection lost" when it has
/// none).
///
/// # Safety
/// `conn` is a live libpq connection.
pub(super) unsafe fn connection_message(conn: *mut PGconn) -> String {
    // SAFETY: libpq's message for this live connection, copied out.
    let text = unsafe { CStr::from_ptr(PQerrorMessage(conn)) };
    let text = text.to_string_lossy();
    let text = text.trim();
    if text.is_empty() {
        "connection lost".into()
    } else {
        text.to_string()
    }
}

/// A failure to reach or talk to `node`.
pub(super) fn node_failure(node: &Node, cause: String) -> ShardError {
    ShardError::Remote {
        host: node.host.clone(),
        port: node.port,
        cause,
    }
}

/// The error a failed result from `node` reports, with the node's
/// SQLSTATE; `connection_message` when the result has no message.
pub(super) fn result_error(
    node: &Node,
    result: &ResultGuard,
    connection_message: impl FnOnce() -> String,
) -> ShardError {
    let field = |code: c_int| {
        // SAFETY: a live result; fields are NUL-terminated or NULL.
        let value = unsafe { PQresultErrorField(result.0, code) };
        (!value.is_null()).then(|| {
            // SAFETY: non-NULL, NUL-terminated.
            unsafe { CStr::from_ptr(value) }
                .to_string_lossy()
                .into_owned()
        })
    };
    let message = field(PG_DIAG_MESSAGE_PRIMARY).unwrap_or_else(|| {
        // SAFETY: as above.
        let whole = unsafe { CStr::from_ptr(PQresultErrorMessage(result.0)) };
        let whole = whole.to_string_lossy().trim().to_string();
        if whole.is_empty() {
            connection_message()
        } else {
            whole
        }
    });
    ShardError::RemoteStatement {
        node: node.label(),
        sqlstate: field(PG_DIAG_SQLSTATE).unwrap_or_else(|| "08000".into()),
        message,
        detail: field(PG_DIAG_MESSAGE_DETAIL),
        notes: Box::new(RemoteNotes {
            hint: field(PG_DIAG_MESSAGE_HINT),
            context: field(PG_DIAG_CONTEXT),
        }),
    }
}

/// libpq's reason a connection failed, without the address the error
/// message names already: `connection to server at "h", port p failed:
/// Connection refused` and its hint line become `Connection refused`.
pub(super) fn connection_failure(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let reason = match first.find(" failed: ") {
        Some(at) if first.starts_with("connection to server") => &first[at + " failed: ".len()..],
        _ => first,
    };
    reason.trim().to_string()
}

/// Whether `sqlstate` (a failed node statement's) is `code`.
pub(crate) fn is_sqlstate(error: &ShardError, code: &str) -> bool {
    matches!(error, ShardError::RemoteStatement { sqlstate, .. } if sqlstate == code)
}

#[cfg(test)]
mod tests {
    #[test]
    fn connection_failures_keep_the_reason() {
        assert_eq!(
            super::connection_failure(
                "connection to server at \"127.0.0.1\", port 1 failed: Connection refused\n\tIs the server running on that host and accepting TCP/IP connections?"
            ),
            "Connection refused"
        );
        assert_eq!(
            super::connection_failure("timeout expired"),
            "timeout expired"
        );
    }
}
