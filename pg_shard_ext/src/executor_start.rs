//! pg_shard's one ExecutorStart hook: the checks a plan passes as it
//! starts, on every node — the read fence of retired shards on workers
//! ([`crate::worker::read_fence`]) and the checks of writes over
//! postgres_fdw on the metadata node ([`crate::executor::fdw_writes`]).

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
    // SAFETY: query is valid for the call; the checks read its plan (and
    // raise their errors) under pgrx's guard.
    unsafe {
        crate::worker::read_fence::check(query, eflags);
        crate::executor::fdw_writes::check(query, eflags);
    }
    // SAFETY: chaining to the previous hook or the standard implementation
    // with the arguments we were given.
    unsafe {
        match PREVIOUS_EXECUTOR_START {
            Some(previous) => previous(query, eflags),
            None => postgres_standard_executor_start(query, eflags),
        }
    }
}
