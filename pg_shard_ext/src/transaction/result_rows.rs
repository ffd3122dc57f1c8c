//! What a node sends back: results freed however the scope is left, rows
//! read as text, and the counts of command tags.

use super::libpq::*;
use std::ffi::{c_int, CStr};

/// One row of a result, as text.
pub(crate) struct TextRow<'a> {
    pub(super) result: &'a ResultGuard,
    pub(super) row: c_int,
}

impl TextRow<'_> {
    pub(crate) fn len(&self) -> usize {
        // SAFETY: the result is alive for the row's lifetime.
        unsafe { PQnfields(self.result.0) as usize }
    }

    /// Column `column`'s bytes, or None for NULL.
    pub(crate) fn bytes(&self, column: usize) -> Option<&[u8]> {
        let column = column as c_int;
        // SAFETY: row and column are within the result (callers iterate
        // 0..len(); libpq returns NULL flags and lengths for them).
        unsafe {
            if PQgetisnull(self.result.0, self.row, column) != 0 {
                return None;
            }
            let value = PQgetvalue(self.result.0, self.row, column) as *const u8;
            let length = PQgetlength(self.result.0, self.row, column) as usize;
            Some(std::slice::from_raw_parts(value, length))
        }
    }

    /// Column `column` as a NUL-terminated C string (libpq terminates every
    /// value), or None for NULL.
    pub(crate) fn c_str(&self, column: usize) -> Option<&CStr> {
        let column = column as c_int;
        // SAFETY: as above; libpq values are NUL-terminated.
        unsafe {
            if PQgetisnull(self.result.0, self.row, column) != 0 {
                return None;
            }
            Some(CStr::from_ptr(PQgetvalue(self.result.0, self.row, column)))
        }
    }

    pub(crate) fn text(&self, column: usize) -> Option<String> {
        self.bytes(column)
            .map(|b| String::from_utf8_lossy(b).into_owned())
    }
}

/// Frees a result however the scope is left (an interrupt unwinds).
pub(super) struct ResultGuard(pub(super) *mut PGresult);

impl Drop for ResultGuard {
    fn drop(&mut self) {
        // SAFETY: a result from PQgetResult, freed once.
        unsafe { PQclear(self.0) }
    }
}

/// What a statement's results came to.
#[derive(Default)]
pub(crate) struct Outcome {
    /// The rows its commands affected or returned (their command tags'
    /// counts, added up when a string held several).
    pub(crate) rows: u64,
}

/// The count in a result's command tag (0 for commands without one).
pub(super) fn command_rows(result: &ResultGuard) -> u64 {
    // SAFETY: a live result; PQcmdTuples returns "" when there is no count.
    let text = unsafe { CStr::from_ptr(PQcmdTuples(result.0)) };
    text.to_str().ok().and_then(|t| t.parse().ok()).unwrap_or(0)
}
