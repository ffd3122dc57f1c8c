//! Marks the transaction when a plan that writes a distributed table over
//! postgres_fdw starts ([`crate::transaction::paths`]): pg_shard's own
//! connections would not see its writes, so the transaction's later
//! statements take that path too. The planner marks the statements it
//! plans so; this covers the generic plans it leaves unmarked (a plan the
//! plan cache makes only to compare with its custom plans, which take the
//! other paths), should one run after all (`plan_cache_mode =
//! force_generic_plan`).

use pgrx::prelude::*;

static mut PREVIOUS_EXECUTOR_START: pg_sys::ExecutorStart_hook_type = None;

// Declared here rather than taken from pgrx::pg_sys, whose bindings turn a
// PostgreSQL error into a Rust panic: errors of the executor must reach
// PostgreSQL's handler as errors, with their own SQLSTATE.
unsafe extern "C-unwind" {
    #[link_name = "standard_ExecutorStart"]
    fn postgres_standard_executor_start(query: *mut pg_sys::QueryDesc, eflags: i32);
}

/// Install the hook, chaining to whatever was installed before.
pub(crate) fn install() {
    // SAFETY: called once from _PG_init, single-threaded, before any query
    // of this backend runs with the library loaded.
    unsafe {
        PREVIOUS_EXECUTOR_START = pg_sys::ExecutorStart_hook;
        pg_sys::ExecutorStart_hook = Some(executor_start);
    }
}

/// # Safety
/// Called by the executor with a valid QueryDesc.
unsafe extern "C-unwind" fn executor_start(query: *mut pg_sys::QueryDesc, eflags: i32) {
    // SAFETY: query is valid for the call; the check reads its plan under
    // pgrx's guard.
    unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| {
            if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 == 0 && writes_distributed(query) {
                crate::transaction::paths::fdw_wrote();
            }
        })
    };
    // SAFETY: chaining to the previous hook or the standard implementation
    // with the arguments we were given.
    unsafe {
        match PREVIOUS_EXECUTOR_START {
            Some(previous) => previous(query, eflags),
            None => postgres_standard_executor_start(query, eflags),
        }
    }
}

/// Whether the plan modifies a distributed table itself (a ModifyTable
/// over its partitions, postgres_fdw's foreign tables). pg_shard's own
/// scans write through their connections and modify no local table.
///
/// # Safety
/// `query` is the QueryDesc being started.
unsafe fn writes_distributed(query: *mut pg_sys::QueryDesc) -> bool {
    // SAFETY: the planned statement and its range table belong to the
    // query being started.
    unsafe {
        let planned = (*query).plannedstmt;
        if planned.is_null() || (*planned).resultRelations.is_null() {
            return false;
        }
        let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg((*planned).rtable);
        pgrx::PgList::<i32>::from_pg((*planned).resultRelations)
            .iter_int()
            .any(|index| {
                let Some(entry) = rtable.get_ptr(index as usize - 1) else {
                    return false;
                };
                (*entry).rtekind == pg_sys::RTEKind::RTE_RELATION
                    && (*entry).relkind == pg_sys::RELKIND_PARTITIONED_TABLE as std::ffi::c_char
                    && crate::planner::is_distributed_table((*entry).relid)
            })
    }
}
