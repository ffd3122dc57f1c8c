//! `EXISTS` / `NOT EXISTS` tests on a distributed table compared with the
//! statement by other columns than its key: the test reads the distinct
//! values of the compared columns, of the rows its own conditions keep.

use super::restriction::{conditions, outer_values};
use super::{
    conjunction, deparse, single_table, split_conditions, table_columns, Candidate, Change,
};
use crate::error::Result;
use pgrx::prelude::*;
use pgrx::PgList;
use std::ffi::CString;

/// A test's query, to read the intermediate result.
pub(super) struct Test {
    subquery: *mut pg_sys::Query,
    /// Its comparisons with the statement (its other conditions are the
    /// intermediate statement's).
    comparisons: Vec<*mut pg_sys::Node>,
}

impl Test {
    /// Point the test at `rtable`, the intermediate result's entry (its
    /// columns stand at the table's column numbers).
    pub(super) unsafe fn read(&self, rtable: *mut pg_sys::List) {
        // SAFETY: the test's query, changed in place.
        unsafe {
            (*self.subquery).rtable = rtable;
            // Only whether a row exists counts.
            (*self.subquery).targetList = std::ptr::null_mut();
            // The result's other columns are NULL: the conditions on them
            // were applied when it was computed.
            (*(*self.subquery).jointree).quals = conjunction(self.comparisons.clone());
        }
    }
}

/// The test as an intermediate result, if its query reads one distributed
/// table and each condition either reads only that table (it goes into the
/// intermediate statement) or compares one of its columns with the
/// statement's by the column type's own equality.
/// The values of the outer side found in `level`'s rows (before its
/// conjunct number `conjunct`, the test's) restrict the statement, when
/// `level` reads reference tables alone.
pub(super) unsafe fn candidate(
    sublink: *mut pg_sys::SubLink,
    level: *mut pg_sys::Query,
    conjunct: usize,
) -> Result<Option<Candidate>> {
    // SAFETY: a valid EXISTS sublink.
    unsafe {
        let subquery = (*sublink).subselect as *mut pg_sys::Query;
        let Some(relid) = single_table(subquery, false) else {
            return Ok(None);
        };
        let Some(columns) = table_columns(relid) else {
            return Ok(None);
        };
        let Some((mut local, correlations)) = split_conditions(subquery) else {
            return Ok(None);
        };
        let mut restrictions = Vec::new();
        for correlation in &correlations {
            if let Some(values) = outer_values(level, conjunct, correlation)? {
                restrictions.push(values);
            }
        }
        let (restricting, parameters) = conditions(restrictions);
        local.extend(restricting);
        let compared: Vec<i16> = correlations.iter().map(|c| c.attno).collect();
        let comparisons = correlations
            .iter()
            .map(|c| c.operator as *mut pg_sys::Node)
            .collect();
        // The compared columns' distinct values (NULL in the others) of the
        // rows the test's own conditions keep.
        let statement =
            pg_sys::copyObjectImpl(subquery as *const std::ffi::c_void) as *mut pg_sys::Query;
        let mut targets = PgList::<pg_sys::TargetEntry>::new();
        for (i, (name, (ty, typmod, collation))) in columns.iter().enumerate() {
            let attno = (i + 1) as i16;
            let expr = if compared.contains(&attno) {
                pg_sys::makeVar(1, attno, *ty, *typmod, *collation, 0) as *mut pg_sys::Expr
            } else {
                super::null_of(*ty, *typmod, *collation) as *mut pg_sys::Expr
            };
            let name = CString::new(name.as_str()).unwrap_or_default();
            targets.push(pg_sys::makeTargetEntry(
                expr,
                attno,
                pg_sys::pstrdup(name.as_ptr()),
                false,
            ));
        }
        (*statement).targetList = targets.into_pg();
        (*statement).hasSubLinks = !parameters.is_empty();
        (*(*statement).jointree).quals = conjunction(local);
        let text = deparse(statement);
        let Some(rest) = text.strip_prefix("SELECT ") else {
            return Ok(None);
        };
        Ok(Some(Candidate {
            query: format!("SELECT DISTINCT {rest}"),
            relid,
            sublink_query: Some(subquery),
            parameters,
            columns: columns.into_iter().map(|(_, c)| c).collect(),
            change: Change::Exists(Test {
                subquery,
                comparisons,
            }),
        }))
    }
}
