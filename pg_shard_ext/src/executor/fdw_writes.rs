//! Checks and marks a plan that writes a distributed table over
//! postgres_fdw as it starts ([`crate::transaction::paths`]): one after
//! writes through pg_shard's own connections in the transaction is
//! refused (its connections would not see them), one writing a table with
//! lookups is refused (postgres_fdw's sessions on the workers cannot give
//! their changes to the lookups), and the transaction is marked, so that
//! its later statements take that path too. The planner checks and marks
//! the statements it plans so; this covers the plans it leaves unchecked:
//! generic plans (which the plan cache makes only to compare with its
//! custom plans, which take the other paths), should one run after all
//! (`plan_cache_mode = force_generic_plan`), and the statements of SQL
//! functions, planned without their parameters' values.

use crate::error::ShardError;
use pgrx::prelude::*;

/// The checks and the mark, for a plan starting.
///
/// # Safety
/// `query` is the QueryDesc being started.
pub(crate) unsafe fn check(query: *mut pg_sys::QueryDesc, eflags: i32) {
    // SAFETY: query is valid for the call; the check reads its plan under
    // pgrx's guard.
    unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| {
            if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
                return;
            }
            let written = written_distributed(query);
            if written.is_empty() {
                return;
            }
            if crate::transaction::paths::did_router_write() {
                ShardError::PathsMixed.report();
            }
            crate::planner::refuse_fdw_writes_of(&written);
            crate::transaction::paths::fdw_wrote();
        })
    }
}

/// The distributed tables the plan modifies itself (a ModifyTable over
/// their partitions, postgres_fdw's foreign tables). pg_shard's own scans
/// write through their connections and modify no local table.
///
/// # Safety
/// `query` is the QueryDesc being started.
unsafe fn written_distributed(query: *mut pg_sys::QueryDesc) -> Vec<pg_sys::Oid> {
    // SAFETY: the planned statement and its range table belong to the
    // query being started.
    unsafe {
        let planned = (*query).plannedstmt;
        if planned.is_null() || (*planned).resultRelations.is_null() {
            return Vec::new();
        }
        let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg((*planned).rtable);
        pgrx::PgList::<i32>::from_pg((*planned).resultRelations)
            .iter_int()
            .filter_map(|index| rtable.get_ptr(usize::try_from(index).ok()?.checked_sub(1)?))
            .filter(|&entry| {
                (*entry).rtekind == pg_sys::RTEKind::RTE_RELATION
                    && (*entry).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
                    && crate::planner::is_distributed_table((*entry).relid)
            })
            .map(|entry| (*entry).relid)
            .collect()
    }
}
