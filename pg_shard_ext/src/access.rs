//! Who may run the DBA functions, and on which tables.
//!
//! The SQL functions DBAs call (`pg_shard.create_distributed_table`, …) are
//! revoked from PUBLIC; a superuser grants them. Each is a thin SQL wrapper
//! (it converts the table name in the caller's search_path) around a C
//! function that everyone may call: the C function asks whether its caller
//! may execute the wrapper, so a GRANT on the wrapper is all it takes. A
//! granted role still acts only on tables it owns, as ALTER TABLE would; the
//! catalog writes that follow run as the extension's owner
//! ([`crate::metadata::catalog::as_extension_owner`]).

use crate::error::{Result, ShardError};

/// The caller may execute `function` (a signature such as
/// `pg_shard.create_distributed_table(regclass, text, integer, text)`).
pub(crate) fn require_granted(function: &str) -> Result<()> {
    let granted = crate::spi::query_one::<bool>(
        "SELECT pg_catalog.has_function_privilege($1, 'EXECUTE')",
        &[function.into()],
    )?
    .unwrap_or(false);
    if granted {
        return Ok(());
    }
    let name = function.split('(').next().unwrap_or(function);
    Err(ShardError::PermissionDenied(format!(
        "permission denied for function {}",
        name.trim_start_matches("pg_shard.")
    )))
}

/// The current role owns `relid` (or is a member of its owner, or a
/// superuser): PostgreSQL's rule for changing a table.
pub(crate) fn require_table_owner(relid: pgrx::pg_sys::Oid, display: &str) -> Result<()> {
    if is_table_owner(relid) {
        return Ok(());
    }
    Err(ShardError::PermissionDenied(format!(
        "must be owner of table {display}"
    )))
}

pub(crate) fn is_table_owner(relid: pgrx::pg_sys::Oid) -> bool {
    // SAFETY: an ownership lookup in the syscache for the current user; a
    // relation that does not exist raises an error through pgrx's guard.
    unsafe { pgrx::pg_sys::pg_class_ownercheck(relid, pgrx::pg_sys::GetUserId()) }
}

pub(crate) fn is_superuser() -> bool {
    // SAFETY: reads the current user's superuser flag (cached per backend).
    unsafe { pgrx::pg_sys::superuser() }
}
