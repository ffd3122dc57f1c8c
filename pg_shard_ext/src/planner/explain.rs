//! EXPLAIN of a statement on distributed tables that none of pg_shard's
//! own plans took: the plan is PostgreSQL's over postgres_fdw's foreign
//! partitions, which says nothing of pg_shard, so a last line names its
//! class (router, pushdown and multi-shard plans name theirs in their
//! custom scan).
//!
//! PostgreSQL 15 has no hook inside a plan's EXPLAIN output, only one that
//! replaces `ExplainOneQuery`: this one does what that does (plan, time
//! the planning, explain the plan) and adds the line after it, in the text
//! format only (in the others it would fall outside the plan's object; the
//! foreign scans there show the path).

use pgrx::pg_sys;
use std::cell::Cell;
use std::time::{Duration, Instant};

static mut PREVIOUS_EXPLAIN: pg_sys::ExplainOneQuery_hook_type = None;

thread_local! {
    // Set by the planner hook when it leaves a statement on distributed
    // tables to postgres_fdw; read and cleared around EXPLAIN's planning.
    static FALLBACK_PLANNED: Cell<bool> = const { Cell::new(false) };
}

/// Note that the statement being planned takes the postgres_fdw path.
pub(super) fn note_fallback() {
    FALLBACK_PLANNED.set(true);
}

// Declared here rather than taken from pgrx::pg_sys, whose bindings turn a
// PostgreSQL error into a Rust panic: an error while planning or running
// the explained statement travels to PostgreSQL's handler as itself.
unsafe extern "C-unwind" {
    #[link_name = "pg_plan_query"]
    fn postgres_plan_query(
        query: *mut pg_sys::Query,
        query_string: *const std::ffi::c_char,
        cursor_options: std::ffi::c_int,
        bound_params: pg_sys::ParamListInfo,
    ) -> *mut pg_sys::PlannedStmt;
    #[link_name = "ExplainOnePlan"]
    fn postgres_explain_one_plan(
        planned: *mut pg_sys::PlannedStmt,
        into: *mut pg_sys::IntoClause,
        es: *mut pg_sys::ExplainState,
        query_string: *const std::ffi::c_char,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        plan_duration: *const pg_sys::instr_time,
        buffer_usage: *const pg_sys::BufferUsage,
    );
    #[link_name = "ExplainPropertyText"]
    fn postgres_explain_property_text(
        label: *const std::ffi::c_char,
        value: *const std::ffi::c_char,
        es: *mut pg_sys::ExplainState,
    );
}

pub(super) fn install() {
    // SAFETY: called once from _PG_init, before any EXPLAIN with the
    // library loaded.
    unsafe {
        PREVIOUS_EXPLAIN = pg_sys::ExplainOneQuery_hook;
        pg_sys::ExplainOneQuery_hook = Some(explain_one_query);
    }
}

/// # Safety
/// Called by `ExplainOneQuery` with its own valid arguments (a query to
/// plan, not a utility command).
unsafe extern "C-unwind" fn explain_one_query(
    query: *mut pg_sys::Query,
    cursor_options: std::ffi::c_int,
    into: *mut pg_sys::IntoClause,
    es: *mut pg_sys::ExplainState,
    query_string: *const std::ffi::c_char,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
) {
    // SAFETY: chaining with, or doing what ExplainOneQuery does with, the
    // arguments it gave; errors longjmp through this frame, which holds
    // nothing that needs dropping (plain numbers and C structs).
    unsafe {
        if let Some(previous) = PREVIOUS_EXPLAIN {
            previous(
                query,
                cursor_options,
                into,
                es,
                query_string,
                params,
                query_env,
            );
            return;
        }
        FALLBACK_PLANNED.set(false);
        let buffers = (*es).buffers;
        let buffers_before = pg_sys::pgBufferUsage;
        let started = Instant::now();
        let planned = postgres_plan_query(query, query_string, cursor_options, params);
        let duration = instr_time(started.elapsed());
        let fallback = FALLBACK_PLANNED.replace(false);
        let mut buffer_usage = pg_sys::BufferUsage::default();
        if buffers {
            pg_sys::BufferUsageAccumDiff(
                &mut buffer_usage,
                &raw const pg_sys::pgBufferUsage,
                &buffers_before,
            );
        }
        postgres_explain_one_plan(
            planned,
            into,
            es,
            query_string,
            params,
            query_env,
            &duration,
            if buffers {
                &buffer_usage
            } else {
                std::ptr::null()
            },
        );
        if fallback && (*es).format == pg_sys::ExplainFormat::EXPLAIN_FORMAT_TEXT {
            postgres_explain_property_text(
                c"pg_shard Class".as_ptr(),
                c"fallback (postgres_fdw over the shards' foreign tables)".as_ptr(),
                es,
            );
        }
    }
}

/// A duration as PostgreSQL's instr_time (a timespec here).
fn instr_time(duration: Duration) -> pg_sys::instr_time {
    pg_sys::timespec {
        tv_sec: duration.as_secs() as _,
        tv_nsec: duration.subsec_nanos() as _,
    }
}
