//! Reading the statement being planned: its parse tree's names and lists,
//! its text (to splice a shard table's name into), the logical table a
//! RangeVar names, and copies of the statement to change.

use crate::error::Result;
use crate::metadata::LogicalTable;
use crate::quote;
use pgrx::prelude::*;
use std::ffi::{c_char, CStr};

/// A deep copy of the planned statement (in the current memory context),
/// to change and run instead of it, and its utility statement.
///
/// # Safety
/// `pstmt` is ProcessUtility's planned statement; `T` its utility
/// statement's node type.
pub(super) unsafe fn copy_statement<T>(
    pstmt: *mut pg_sys::PlannedStmt,
) -> (*mut pg_sys::PlannedStmt, *mut T) {
    // SAFETY: copyObjectImpl copies any node tree.
    unsafe {
        let copy = pg_sys::copyObjectImpl(pstmt.cast()) as *mut pg_sys::PlannedStmt;
        (copy, (*copy).utilityStmt.cast())
    }
}

/// The text of the statement being run (one of possibly several in the
/// query string), with positions relative to it.
pub(super) struct StatementText {
    pub(super) text: String,
    /// Where the statement starts in the query string.
    offset: usize,
}

impl StatementText {
    /// # Safety
    /// As for the hook's `plan`: `pstmt` and `query_string` come from
    /// ProcessUtility.
    pub(super) unsafe fn of(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const c_char,
    ) -> StatementText {
        // SAFETY: query_string is the NUL-terminated text the statement was
        // parsed from; locations are byte offsets into it.
        let (all, location, length) = unsafe {
            (
                CStr::from_ptr(query_string).to_string_lossy(),
                (*pstmt).stmt_location,
                (*pstmt).stmt_len,
            )
        };
        let start = usize::try_from(location).unwrap_or(0).min(all.len());
        let end = match usize::try_from(length) {
            Ok(0) | Err(_) => all.len(),
            Ok(length) => (start + length).min(all.len()),
        };
        StatementText {
            text: all.get(start..end).unwrap_or_default().to_string(),
            offset: start,
        }
    }

    /// The statement with `name` in place of the text at `span` (a shard
    /// table's name in place of its table's).
    pub(super) fn spliced(&self, (start, end): (usize, usize), name: &str) -> String {
        format!("{}{name}{}", &self.text[..start], &self.text[end..])
    }

    /// Where the name of `table`, `relation` of the statement, is (as
    /// written, maybe qualified and quoted).
    ///
    /// # Safety
    /// `relation` is a RangeVar of this statement.
    pub(super) unsafe fn name_span(
        &self,
        relation: *mut pg_sys::RangeVar,
        table: &LogicalTable,
    ) -> Result<(usize, usize)> {
        // SAFETY: the caller's RangeVar.
        let at = usize::try_from(unsafe { (*relation).location }).ok();
        let start = at.and_then(|at| at.checked_sub(self.offset));
        let length = start
            .and_then(|start| self.text.get(start..))
            .map(quote::qualified_name_length);
        match (start, length) {
            (Some(start), Some(length)) if length > 0 => Ok((start, start + length)),
            _ => Err(table.refuse("its name could not be found in the statement")),
        }
    }
}

/// The table `relation` names, if it is distributed or a reference table.
///
/// # Safety
/// `relation` is a RangeVar of the statement, or null.
pub(super) unsafe fn logical_table_named(
    relation: *mut pg_sys::RangeVar,
) -> Result<Option<LogicalTable>> {
    if relation.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller's RangeVar.
    LogicalTable::of(unsafe { relation_oid(relation) })
}

/// The relation a statement's RangeVar names, or InvalidOid.
///
/// # Safety
/// `relation` is a RangeVar of the statement.
pub(super) unsafe fn relation_oid(relation: *mut pg_sys::RangeVar) -> pg_sys::Oid {
    // SAFETY: a name lookup without a lock (the statement itself locks).
    unsafe {
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    }
}

/// The texts of a List of String nodes (a qualified name, a column list).
///
/// # Safety
/// `list` is a List of String nodes, or NIL.
pub(super) unsafe fn string_list(list: *mut pg_sys::List) -> Vec<String> {
    // SAFETY: as the caller promises.
    unsafe { pgrx::PgList::<pg_sys::String>::from_pg(list) }
        .iter_ptr()
        .map(|s| {
            // SAFETY: a String node's NUL-terminated text.
            unsafe { text_of((*s).sval) }
        })
        .collect()
}

/// The text of a C string of the parse tree ("" for null).
///
/// # Safety
/// `text` is a NUL-terminated string of the parse tree, or null.
pub(super) unsafe fn text_of(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// The name a RangeVar spells, as `[schema, ]name`.
///
/// # Safety
/// `relation` is a RangeVar of the statement.
pub(super) unsafe fn range_var_parts(relation: *mut pg_sys::RangeVar) -> Vec<String> {
    // SAFETY: as the caller promises; its names are C strings or null.
    unsafe {
        let relation = &*relation;
        [relation.schemaname, relation.relname]
            .into_iter()
            .filter(|name| !name.is_null())
            .map(|name| text_of(name))
            .collect()
    }
}
