//! Reads are fenced too: a worker refuses to run a query that touches a
//! shard table it has retired (WrongShard, SQLSTATE PS001). Retired shards
//! may hold rows that moved away; a router with an old map must not read
//! them. Frozen shards still serve reads (a freeze only stops writes).
//!
//! The check runs as a plan starts (`crate::executor_start`), so it covers SELECT, the reads of
//! INSERT … SELECT, UPDATE and DELETE, and `COPY (query) TO`; EXPLAIN
//! without ANALYZE runs nothing and is allowed, and so does a session in
//! `session_replication_role = replica` (replication's apply). The hook is active in
//! backends that loaded the library, which `shared_preload_libraries =
//! 'pg_shard'` on every worker guarantees (`add_node` warns when a worker
//! lacks it).

use crate::worker::fencing::{cached_shard_record, raise_wrong_shard, relation_name, Rejection};
use pgrx::prelude::*;
use std::ffi::CStr;

/// Refuses (PS001) a plan that reads a retired shard table.
///
/// # Safety
/// `query` is the QueryDesc being started.
pub(crate) unsafe fn check(query: *mut pg_sys::QueryDesc, eflags: i32) {
    // SAFETY: query is valid for the call; the check runs under pgrx's guard.
    let verdict = unsafe { pg_sys::panic::pgrx_extern_c_guard(|| check_query(query, eflags)) };
    if let Err(rejection) = verdict {
        // SAFETY: no Rust value owning memory is live in this frame.
        unsafe { raise_wrong_shard(rejection) }
    }
}

fn check_query(query: *mut pg_sys::QueryDesc, eflags: i32) -> Result<(), Rejection> {
    if eflags & pg_sys::EXEC_FLAG_EXPLAIN_ONLY as i32 != 0 {
        return Ok(());
    }
    // SAFETY: a plain read of a backend-local global.
    if unsafe { pg_sys::ParallelWorkerNumber } >= 0 {
        // A parallel worker runs part of a query its leader checked (and
        // may not take the fresh snapshot the check reads with).
        return Ok(());
    }
    // SAFETY: a plain read of a backend-local global.
    if unsafe { pg_sys::SessionReplicationRole } == pg_sys::SESSION_REPLICATION_ROLE_REPLICA as i32
    {
        // Replication's apply (a split's own, in the job's transactions),
        // which the guard triggers let through as well: it writes a
        // retired split source back while reverse replication runs.
        // (A superuser's setting, or a role's granted SET on it: such a
        // session bypasses the guard triggers already.)
        return Ok(());
    }
    // SAFETY: the planned statement and its range table belong to the query
    // being started; relations in it are locked by the caller.
    unsafe {
        let planned = (*query).plannedstmt;
        if planned.is_null() {
            return Ok(());
        }
        let rtable = pgrx::PgList::<pg_sys::RangeTblEntry>::from_pg((*planned).rtable);
        for entry in rtable.iter_ptr() {
            if entry.is_null()
                || (*entry).rtekind != pg_sys::RTEKind::RTE_RELATION
                || (*entry).relkind != pg_sys::RELKIND_RELATION as std::ffi::c_char
            {
                continue;
            }
            let relation = pg_sys::RelationIdGetRelation((*entry).relid);
            if relation.is_null() {
                continue;
            }
            let retired_shard = is_shard_table(relation)
                && matches!(cached_shard_record((*entry).relid), Some((state, _)) if state == "retired");
            let name = retired_shard.then(|| relation_name(relation));
            pg_sys::RelationClose(relation);
            if let Some(name) = name {
                return Err(Rejection::new(
                    name,
                    "the shard is retired on this worker and no longer serves reads".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Whether the relation carries pg_shard's statement guard: shard tables do,
/// nothing else does. A relcache read, so non-shard tables cost no lookup.
///
/// # Safety
/// `relation` must be an open relation.
unsafe fn is_shard_table(relation: pg_sys::Relation) -> bool {
    // SAFETY: trigdesc, when present, holds numtriggers valid triggers.
    unsafe {
        let triggers = (*relation).trigdesc;
        if triggers.is_null() {
            return false;
        }
        let count = (*triggers).numtriggers as usize;
        std::slice::from_raw_parts((*triggers).triggers, count)
            .iter()
            .any(|t| CStr::from_ptr(t.tgname).to_bytes() == b"pg_shard_guard_statement")
    }
}
