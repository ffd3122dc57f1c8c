//! The ProcessUtility hook: plans each statement that changes a distributed
//! or reference table (in the submodules of [`super`]), lets PostgreSQL run
//! the metadata node's part, then carries the rest to the shards.

use super::internal::running_internal;
use super::parse::StatementText;
use super::plan::{AfterLocal, Local, Planned};
use super::{columns, names, objects, privileges, reindex, truncate};
use crate::error::Result;
use pgrx::prelude::*;
use std::cell::RefCell;
use std::ffi::c_char;

static mut PREVIOUS_UTILITY: pg_sys::ProcessUtility_hook_type = None;

// Declared here rather than taken from pgrx::pg_sys, whose bindings turn a
// PostgreSQL error into a Rust panic: an error of the statement must travel
// to PostgreSQL's handler as it is (nested statements, such as those of an
// extension script, run through this hook too).
unsafe extern "C-unwind" {
    #[link_name = "standard_ProcessUtility"]
    fn postgres_standard_process_utility(
        pstmt: *mut pg_sys::PlannedStmt,
        query_string: *const c_char,
        read_only_tree: bool,
        context: pg_sys::ProcessUtilityContext::Type,
        params: pg_sys::ParamListInfo,
        query_env: *mut pg_sys::QueryEnvironment,
        dest: *mut pg_sys::DestReceiver,
        qc: *mut pg_sys::QueryCompletion,
    );
}

thread_local! {
    // The work left for the statements running (nested statements stack
    // up), kept here while PostgreSQL runs them: an error unwinds through
    // the hook's frame, which must own nothing then.
    static PENDING: RefCell<Vec<Option<AfterLocal>>> = const { RefCell::new(Vec::new()) };
}

/// Install the hook, chaining to whatever was installed before.
pub(crate) fn install() {
    // SAFETY: called once from _PG_init, single-threaded, before any
    // statement of this backend runs with the library loaded.
    unsafe {
        PREVIOUS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

/// # Safety
/// Called by PostgreSQL with the arguments of ProcessUtility.
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn process_utility(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: pstmt and qc are ProcessUtility's; the COPY runs under
    // pgrx's guard, which turns a refusal into an ERROR.
    if unsafe { is_copy(pstmt) } && !running_internal() && extension_installed() {
        let copied = unsafe {
            pg_sys::panic::pgrx_extern_c_guard(|| {
                crate::commands::copy_from::run_if_distributed(pstmt, query_string, qc)
            })
        };
        match copied {
            Ok(true) => return,
            Ok(false) => {}
            // Raised here, with its own SQLSTATE and CONTEXT: this frame
            // owns nothing a longjmp would skip.
            // SAFETY: as said.
            Err(e) => unsafe { e.raise() },
        }
    }
    // SAFETY: pstmt and query_string are valid for the call; planning runs
    // under pgrx's guard, which turns a refusal into an ERROR.
    let planned = unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| match plan(pstmt, query_string, context) {
            Ok(planned) => planned,
            Err(e) => e.report(),
        })
    };
    let (local, after) = match planned {
        Some(planned) => (planned.local, planned.after),
        None => (Local::Run, None),
    };
    let depth = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        pending.push(after);
        pending.len() - 1
    });
    let (statement, read_only_tree) = match local {
        Local::Run => (Some(pstmt), read_only_tree),
        Local::Skip => (None, read_only_tree),
        Local::Replace(copy) => (Some(copy), false),
    };
    if let Some(statement) = statement {
        // SAFETY: chaining with the arguments we were given (or a copy of
        // the statement); an error longjmps through this frame, which owns
        // nothing.
        unsafe {
            let next = PREVIOUS_UTILITY.unwrap_or(postgres_standard_process_utility);
            next(
                statement,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            )
        }
    }
    // (Entries above ours are of nested statements whose errors were caught.)
    let after = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        pending.truncate(depth + 1);
        pending.pop().flatten()
    });
    if let Some(after) = after {
        // SAFETY: as above; the metadata node's part is done.
        unsafe {
            pg_sys::panic::pgrx_extern_c_guard(|| {
                // The change was allowed (PostgreSQL checked the metadata
                // node's part, the planners the rest); its catalog writes
                // need the extension's owner.
                if let Err(e) = crate::metadata::catalog::as_extension_owner(after) {
                    e.report();
                }
            })
        };
    }
}

/// The plan for a statement that changes a distributed or reference table,
/// or None for any other statement; refuses what cannot be carried to the
/// shards.
///
/// # Safety
/// `pstmt` and `query_string` come from ProcessUtility.
unsafe fn plan(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
    context: pg_sys::ProcessUtilityContext::Type,
) -> Result<Option<Planned>> {
    if running_internal() || query_string.is_null() {
        return Ok(None);
    }
    // SAFETY: the planned statement of a utility command.
    let stmt = unsafe { (*pstmt).utilityStmt };
    if stmt.is_null() {
        return Ok(None);
    }
    // SAFETY: a parse node; its tag tells its type.
    let tag = unsafe { (*stmt).type_ };
    use pg_sys::NodeTag as N;
    if !matches!(
        tag,
        N::T_AlterTableStmt
            | N::T_RenameStmt
            | N::T_AlterObjectSchemaStmt
            | N::T_IndexStmt
            | N::T_DropStmt
            | N::T_GrantStmt
            | N::T_CommentStmt
            | N::T_TruncateStmt
            | N::T_ReindexStmt
    ) || !extension_installed()
    {
        return Ok(None);
    }
    // SAFETY: as above.
    let text = unsafe { StatementText::of(pstmt, query_string) };
    let top_level = context == pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL;
    // SAFETY: each planner reads the node its tag says it is.
    unsafe {
        match tag {
            N::T_AlterTableStmt => columns::plan_alter(stmt.cast(), text),
            N::T_RenameStmt => match (*stmt.cast::<pg_sys::RenameStmt>()).renameType {
                pg_sys::ObjectType::OBJECT_INDEX => names::plan_index_rename(stmt.cast()),
                pg_sys::ObjectType::OBJECT_TABLE => match names::plan_index_rename(stmt.cast())? {
                    Some(planned) => Ok(Some(planned)),
                    None => columns::plan_rename(stmt.cast(), text),
                },
                _ => columns::plan_rename(stmt.cast(), text),
            },
            N::T_AlterObjectSchemaStmt => names::plan_set_schema(stmt.cast()),
            N::T_IndexStmt => objects::plan_create_index(pstmt, stmt.cast(), text, top_level),
            N::T_DropStmt => objects::plan_drop_index(pstmt, stmt.cast(), top_level),
            N::T_GrantStmt => privileges::plan_grant(stmt.cast()),
            N::T_CommentStmt => privileges::plan_comment(stmt.cast()),
            N::T_TruncateStmt => truncate::plan(pstmt, stmt.cast()),
            N::T_ReindexStmt => reindex::plan(stmt.cast(), top_level),
            _ => Ok(None),
        }
    }
}

/// Whether the statement is a COPY (which `copy_from` may run itself).
///
/// # Safety
/// `pstmt` is ProcessUtility's planned statement.
unsafe fn is_copy(pstmt: *mut pg_sys::PlannedStmt) -> bool {
    // SAFETY: a utility statement's parse node, or NULL.
    unsafe {
        let stmt = (*pstmt).utilityStmt;
        !stmt.is_null() && (*stmt).type_ == pg_sys::NodeTag::T_CopyStmt
    }
}

/// Whether pg_shard's catalog is there to ask (not while an extension
/// script runs: its own statements are not schema changes of tables).
fn extension_installed() -> bool {
    // SAFETY: a read of a backend-global flag, and a catalog lookup by name
    // (missing_ok).
    unsafe {
        !pg_sys::creating_extension
            && pg_sys::get_extension_oid(c"pg_shard".as_ptr(), true) != pg_sys::InvalidOid
    }
}
