//! Schema changes of distributed and reference tables (metadata node).
//!
//! A ProcessUtility hook looks at ALTER TABLE and RENAME statements on a
//! table in `pg_shard.logical_table`. What it supports runs on the metadata
//! node's table first (for a distributed table PostgreSQL carries column
//! changes on to the foreign partitions itself), then the same statement,
//! with the shard table's name in place of the table's, runs on every shard
//! table in the remote transactions of the local one — two-phase commit, so
//! every shard changes or none does. What it does not support yet is refused
//! before anything changes, rather than changing the metadata node's table
//! alone: a table whose shards differ from it is silently broken.
//!
//! Supported: ADD COLUMN (with NOT NULL or DEFAULT), DROP COLUMN, ALTER
//! COLUMN TYPE, SET / DROP NOT NULL, RENAME COLUMN; SET / DROP DEFAULT and
//! RENAME of the table change the metadata node only (shards carry no
//! defaults; they keep their names). The distribution column cannot be
//! dropped, renamed or change its type.

use crate::catalog::query_one;
use crate::error::{Result, ShardError};
use crate::quote;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::ffi::{c_char, CStr};

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
    // Set while pg_shard runs DDL of its own on a distributed table (a
    // partition detached by a move, the routing table renamed into place).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
    // The changes of the statements running (nested statements stack up),
    // kept here while PostgreSQL runs them: an error unwinds through the
    // hook's frame, which must own nothing then.
    static PENDING: RefCell<Vec<Option<SchemaChange>>> = const { RefCell::new(Vec::new()) };
}

/// Install the hook, chaining to whatever was installed before.
pub fn install() {
    // SAFETY: called once from _PG_init, single-threaded, before any
    // statement of this backend runs with the library loaded.
    unsafe {
        PREVIOUS_UTILITY = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(process_utility);
    }
}

/// Runs pg_shard's own DDL on a distributed or reference table: the hook
/// leaves it alone.
pub fn run_internal(sql: &str) -> Result<()> {
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            INTERNAL.set(false);
        }
    }
    INTERNAL.set(true);
    let _reset = Reset;
    Spi::run(sql)?;
    Ok(())
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
    // SAFETY: pstmt and query_string are valid for the call; the check runs
    // under pgrx's guard, which turns a refusal into an ERROR.
    let change = unsafe {
        pg_sys::panic::pgrx_extern_c_guard(|| match schema_change(pstmt, query_string) {
            Ok(change) => change,
            Err(e) => e.report(),
        })
    };
    let depth = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        pending.push(change);
        pending.len() - 1
    });
    // SAFETY: chaining with the arguments we were given; an error longjmps
    // through this frame, which owns nothing.
    unsafe {
        match PREVIOUS_UTILITY {
            Some(previous) => previous(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
            None => postgres_standard_process_utility(
                pstmt,
                query_string,
                read_only_tree,
                context,
                params,
                query_env,
                dest,
                qc,
            ),
        }
    }
    // (Entries above ours are of nested statements whose errors were caught.)
    let change = PENDING.with(|pending| {
        let mut pending = pending.borrow_mut();
        pending.truncate(depth + 1);
        pending.pop().flatten()
    });
    if let Some(change) = change {
        // SAFETY: as above; the metadata node's part is done.
        unsafe {
            pg_sys::panic::pgrx_extern_c_guard(|| {
                if let Err(e) = change.apply_to_shards() {
                    e.report();
                }
            })
        };
    }
}

/// A schema change of a distributed or reference table, to be applied to
/// its shards once the metadata node's table has it.
struct SchemaChange {
    relid: pg_sys::Oid,
    /// The statement's text, and where in it the table's name is.
    statement: String,
    name_span: (usize, usize),
    /// Whether shards run it (else the metadata node alone changes).
    on_shards: bool,
    /// Whether routers must reload the map (the table's name changed).
    new_map: bool,
}

/// The statement's change of a distributed or reference table, or None for
/// any other statement; refuses what cannot be carried to the shards.
///
/// # Safety
/// `pstmt` and `query_string` come from ProcessUtility.
unsafe fn schema_change(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const c_char,
) -> Result<Option<SchemaChange>> {
    if INTERNAL.get() || query_string.is_null() {
        return Ok(None);
    }
    // SAFETY: the planned statement of a utility command.
    let (stmt, location, length) = unsafe {
        (
            (*pstmt).utilityStmt,
            (*pstmt).stmt_location,
            (*pstmt).stmt_len,
        )
    };
    if stmt.is_null() {
        return Ok(None);
    }
    // SAFETY: stmt is a parse node; its tag tells its type.
    let (relation, verdict) = unsafe {
        match (*stmt).type_ {
            pg_sys::NodeTag::T_AlterTableStmt => {
                let alter = stmt as *mut pg_sys::AlterTableStmt;
                if (*alter).objtype != pg_sys::ObjectType::OBJECT_TABLE {
                    return Ok(None);
                }
                ((*alter).relation, Verdict::Alter((*alter).cmds))
            }
            pg_sys::NodeTag::T_RenameStmt => {
                let rename = stmt as *mut pg_sys::RenameStmt;
                ((*rename).relation, Verdict::Rename(rename))
            }
            _ => return Ok(None),
        }
    };
    if relation.is_null() || !extension_installed() {
        return Ok(None);
    }
    // SAFETY: a name lookup without a lock (the statement itself locks).
    let relid = unsafe {
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
    };
    if relid == pg_sys::InvalidOid {
        return Ok(None);
    }
    let Some(dist_column) = logical_table(relid)? else {
        return Ok(None);
    };
    let table =
        query_one::<String>("SELECT $1::regclass::text", &[relid.into()])?.unwrap_or_default();
    let refuse = |reason: String| ShardError::UnsupportedSchemaChange {
        table: table.clone(),
        reason,
    };
    let dist = dist_column.as_deref();
    // SAFETY: the statement's parse nodes, read as their tags say.
    let (on_shards, new_map) = unsafe { verdict.judge(dist, &refuse)? };
    let job_running = query_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_shard.job j JOIN pg_shard.shard s USING (shard_group_id) \
         WHERE s.table_rel = $1 AND j.state IN ('queued', 'running'))",
        &[relid.into()],
    )?
    .unwrap_or(false);
    if job_running && (on_shards || new_map) {
        return Err(ShardError::SchemaChangeDuringJob(table));
    }
    // SAFETY: query_string is the NUL-terminated text the statement was
    // parsed from; locations are byte offsets into it.
    let text = unsafe { CStr::from_ptr(query_string) }.to_string_lossy();
    let start = usize::try_from(location).unwrap_or(0).min(text.len());
    let end = match usize::try_from(length) {
        Ok(0) | Err(_) => text.len(),
        Ok(length) => (start + length).min(text.len()),
    };
    // SAFETY: the RangeVar of the statement.
    let name_at = usize::try_from(unsafe { (*relation).location }).unwrap_or(0);
    let statement = text[start..end].to_string();
    let name_start = name_at.saturating_sub(start);
    let name_end =
        name_start + quote::qualified_name_length(&statement[name_start.min(statement.len())..]);
    if name_end <= name_start || name_end > statement.len() {
        return Err(refuse(
            "its name could not be found in the statement".into(),
        ));
    }
    Ok(Some(SchemaChange {
        relid,
        statement,
        name_span: (name_start, name_end),
        on_shards,
        new_map,
    }))
}

enum Verdict {
    Alter(*mut pg_sys::List),
    Rename(*mut pg_sys::RenameStmt),
}

impl Verdict {
    /// (whether the shards run the statement, whether the map changes), or
    /// the reason it is refused.
    ///
    /// # Safety
    /// The pointers are the statement's parse nodes.
    unsafe fn judge(
        &self,
        dist: Option<&str>,
        refuse: &dyn Fn(String) -> ShardError,
    ) -> Result<(bool, bool)> {
        let is_dist = |name: *mut c_char| -> bool {
            // SAFETY: a column name of the parse tree, or null.
            !name.is_null()
                && dist.is_some_and(|d| unsafe { CStr::from_ptr(name) }.to_bytes() == d.as_bytes())
        };
        match self {
            Verdict::Rename(rename) => {
                // SAFETY: the RenameStmt node.
                let rename = unsafe { &**rename };
                match rename.renameType {
                    pg_sys::ObjectType::OBJECT_COLUMN if is_dist(rename.subname) => Err(refuse(
                        "the distribution column cannot be renamed yet".into(),
                    )),
                    pg_sys::ObjectType::OBJECT_COLUMN => Ok((true, false)),
                    // The shards keep their names; routers learn the new one.
                    pg_sys::ObjectType::OBJECT_TABLE => Ok((false, true)),
                    _ => Err(refuse(
                        "this RENAME is not carried to the shards yet".into(),
                    )),
                }
            }
            Verdict::Alter(cmds) => {
                let mut on_shards = false;
                // SAFETY: the statement's list of AlterTableCmd nodes.
                let cmds = unsafe { pgrx::PgList::<pg_sys::AlterTableCmd>::from_pg(*cmds) };
                for cmd in cmds.iter_ptr() {
                    // SAFETY: an AlterTableCmd of the list.
                    let cmd = unsafe { &*cmd };
                    use pg_sys::AlterTableType as T;
                    match cmd.subtype {
                        T::AT_AddColumn => {
                            // SAFETY: ADD COLUMN's definition is a ColumnDef.
                            unsafe { check_added_column(cmd.def, refuse)? };
                            on_shards = true;
                        }
                        T::AT_DropColumn if is_dist(cmd.name) => {
                            return Err(refuse(
                                "the distribution column cannot be dropped".into(),
                            ))
                        }
                        T::AT_AlterColumnType if is_dist(cmd.name) => {
                            return Err(refuse(
                                "the distribution column's type cannot change (rows would hash to other shards)"
                                    .into(),
                            ))
                        }
                        T::AT_DropColumn | T::AT_AlterColumnType | T::AT_SetNotNull | T::AT_DropNotNull => {
                            on_shards = true
                        }
                        // Defaults apply where rows are routed from: the
                        // metadata node's table.
                        T::AT_ColumnDefault => {}
                        _ => {
                            return Err(refuse(
                                "this ALTER TABLE action is not carried to the shards yet \
                                 (supported: ADD/DROP COLUMN, ALTER COLUMN TYPE, SET/DROP NOT NULL, \
                                 SET/DROP DEFAULT, RENAME)"
                                    .into(),
                            ))
                        }
                    }
                }
                Ok((on_shards, false))
            }
        }
    }
}

/// A column added to a distributed table may carry NOT NULL and DEFAULT;
/// constraints with indexes or references are not carried over yet.
///
/// # Safety
/// `def` is ADD COLUMN's ColumnDef.
unsafe fn check_added_column(
    def: *mut pg_sys::Node,
    refuse: &dyn Fn(String) -> ShardError,
) -> Result<()> {
    if def.is_null() {
        return Ok(());
    }
    // SAFETY: ADD COLUMN's definition node.
    let constraints = unsafe { (*(def as *mut pg_sys::ColumnDef)).constraints };
    // SAFETY: a list of Constraint nodes.
    let constraints = unsafe { pgrx::PgList::<pg_sys::Constraint>::from_pg(constraints) };
    for constraint in constraints.iter_ptr() {
        use pg_sys::ConstrType as C;
        // SAFETY: a Constraint of the list.
        match unsafe { (*constraint).contype } {
            C::CONSTR_NULL | C::CONSTR_NOTNULL | C::CONSTR_DEFAULT => {}
            _ => {
                return Err(refuse(
                    "a new column's constraints other than NOT NULL and DEFAULT are not carried to the shards yet"
                        .into(),
                ))
            }
        }
    }
    Ok(())
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

/// The distribution column of a distributed table (Some(None) for a
/// reference table), or None when the relation is neither.
fn logical_table(relid: pg_sys::Oid) -> Result<Option<Option<String>>> {
    Spi::connect(|client| {
        let rows = client.select(
            "SELECT dist_column FROM pg_shard.logical_table WHERE table_rel = $1",
            Some(1),
            &[relid.into()],
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Ok(None);
        };
        Ok(Some(row.get::<String>(1)?))
    })
}

impl SchemaChange {
    /// The statement on every shard table (in the remote transactions that
    /// commit with the local one), and the map's new version when routers
    /// must learn a new name.
    fn apply_to_shards(&self) -> Result<()> {
        if self.on_shards {
            let shards = Spi::connect(|client| {
                let mut shards = Vec::new();
                for row in client.select(
                    "SELECT n.node_id, n.host, n.port, s.shard_schema, s.shard_name \
                     FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) \
                     JOIN pg_shard.node n USING (node_id) \
                     WHERE s.table_rel = $1 ORDER BY n.node_id, s.shard_id",
                    None,
                    &[self.relid.into()],
                )? {
                    let node = crate::catalog::Node {
                        node_id: row.get::<i32>(1)?.unwrap_or_default(),
                        host: row.get::<String>(2)?.unwrap_or_default(),
                        port: row.get::<i32>(3)?.unwrap_or_default(),
                    };
                    let schema = row.get::<String>(4)?.unwrap_or_default();
                    let name = row.get::<String>(5)?.unwrap_or_default();
                    shards.push((node, quote::qualified(&schema, &name)));
                }
                Ok::<_, ShardError>(shards)
            })?;
            let (start, end) = self.name_span;
            for (node, shard) in shards {
                let sql = format!(
                    "{}{shard}{}",
                    &self.statement[..start],
                    &self.statement[end..]
                );
                crate::remote::in_transaction(&node, |client| {
                    client
                        .batch_execute(&sql)
                        .map_err(|e| crate::remote::remote_error(&node, &e))
                })?;
            }
        }
        if self.new_map {
            crate::catalog::bump_map_version()?;
        }
        Ok(())
    }
}
