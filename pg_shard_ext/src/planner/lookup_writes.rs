//! Writes and lookup tables ([`crate::lookups`]): a lookup table is
//! written by pg_shard alone, and a table with lookups only through the
//! paths that carry its changes to the lookups (the router and the
//! multi-shard modify scan, and COPY), not over postgres_fdw, whose
//! sessions on the workers pg_shard cannot take the changes from.

use crate::error::{OrReport, ShardError};
use pgrx::prelude::*;
use pgrx::PgList;

/// The tables a statement writes: its result relation and those of its
/// data-modifying CTEs.
///
/// # Safety
/// `query` is a valid Query.
unsafe fn written_tables(query: *mut pg_sys::Query) -> Vec<pg_sys::Oid> {
    let mut tables = Vec::new();
    // SAFETY: a valid Query: its range table, and its CTEs' queries.
    unsafe {
        if (*query).commandType != pg_sys::CmdType::CMD_SELECT {
            if let Some(rte) =
                super::partition_key::range_table_entry(query, (*query).resultRelation)
            {
                tables.push((*rte).relid);
            }
        }
        if (*query).hasModifyingCTE {
            for cte in PgList::<pg_sys::CommonTableExpr>::from_pg((*query).cteList).iter_ptr() {
                let inner = (*cte).ctequery as *mut pg_sys::Query;
                if !inner.is_null() && (*inner).type_ == pg_sys::NodeTag::T_Query {
                    tables.extend(written_tables(inner));
                }
            }
        }
    }
    tables
}

/// Refuses a statement that writes a lookup table.
///
/// # Safety
/// `query` is a valid Query of a database with pg_shard.
pub(super) unsafe fn refuse_lookup_table_writes(query: *mut pg_sys::Query) {
    // SAFETY: as the function's.
    let written = unsafe { written_tables(query) };
    for relid in written {
        if crate::lookups::catalog::is_lookup_table(relid).or_report() {
            ShardError::InvalidArgument(format!(
                "{} is a lookup table: pg_shard writes it with the rows of its table",
                crate::spi::caller_relation_name(relid)
            ))
            .report();
        }
    }
}

/// Refuses a write over postgres_fdw of a table with lookups.
///
/// # Safety
/// `query` is a valid Query of a database with pg_shard.
pub(super) unsafe fn refuse_fdw_write(query: *mut pg_sys::Query) {
    // SAFETY: as the function's.
    refuse_fdw_writes_of(&unsafe { written_tables(query) });
}

/// Refuses writes over postgres_fdw of `written` when one has lookups.
pub(crate) fn refuse_fdw_writes_of(written: &[pg_sys::Oid]) {
    for &relid in written {
        if crate::lookups::catalog::any_has_lookups(&[relid]).or_report() {
            ShardError::UnsupportedStatement {
                statement: format!(
                    "this write of {} would run over postgres_fdw, which cannot keep its lookups",
                    crate::spi::caller_relation_name(relid)
                ),
                hint:
                    "write the rows of one key per statement, many in one INSERT … VALUES, or load \
                       them with COPY"
                        .into(),
            }
            .report();
        }
    }
}
