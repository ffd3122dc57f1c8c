//! Schema changes of distributed and reference tables (metadata node).
//!
//! A ProcessUtility hook looks at each utility statement that names a table
//! in `pg_shard.logical_table` and plans, before the metadata node runs it:
//! whether the metadata node's own table runs the statement (a distributed
//! table's is partitioned into foreign tables and carries no indexes or
//! constraints; those live on the shards and in
//! `pg_shard.table_constraint`), and what every shard table runs once it
//! has. Shard statements run in the remote transactions of the local one —
//! two-phase commit, so every shard changes or none does — except for the
//! CONCURRENTLY forms, which cannot run in a transaction anywhere: they run
//! shard by shard and are undone on every shard if one fails. What cannot be
//! carried to the shards is refused before anything changes: a table whose
//! shards differ from it is silently broken.
//!
//! - [`columns`]: ALTER TABLE column changes and RENAME;
//! - [`objects`]: indexes and constraints (CREATE/DROP INDEX, ADD/DROP
//!   CONSTRAINT);
//! - [`names`]: renames of indexes and constraints, SET SCHEMA;
//! - [`foreign_keys`]: foreign keys of distributed tables;
//! - [`privileges`]: GRANT/REVOKE and COMMENT;
//! - [`truncate`]: TRUNCATE of distributed tables;
//! - [`reindex`]: REINDEX TABLE / INDEX, shard by shard.
//!
//! DROP TABLE is handled by an event trigger (`crate::drop`).

mod columns;
mod foreign_keys;
mod names;
mod objects;
mod privileges;
mod reindex;
mod truncate;

use foreign_keys::refresh_recorded;
pub(crate) use foreign_keys::{copy_names, references_copies};
pub(crate) use objects::recorded_objects_sql;

use crate::catalog::{query_one, Node};
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

/// What is left to do once the metadata node ran (or skipped) its part.
type AfterLocal = Box<dyn FnOnce() -> Result<()>>;

thread_local! {
    // Set while pg_shard runs DDL of its own on a distributed table (a
    // partition detached by a move, the routing table renamed into place).
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
    // The work left for the statements running (nested statements stack
    // up), kept here while PostgreSQL runs them: an error unwinds through
    // the hook's frame, which must own nothing then.
    static PENDING: RefCell<Vec<Option<AfterLocal>>> = const { RefCell::new(Vec::new()) };
}

/// A statement's plan: the metadata node's part, and the shards' part.
pub(crate) struct Planned {
    local: Local,
    after: Option<AfterLocal>,
}

/// What the metadata node does with the statement itself.
pub(crate) enum Local {
    Run,
    /// Its part is done by the plan (or there is none).
    Skip,
    /// Run this statement instead (a copy, changed).
    Replace(*mut pg_sys::PlannedStmt),
}

impl Planned {
    fn new(local: Local, after: impl FnOnce() -> Result<()> + 'static) -> Planned {
        Planned {
            local,
            after: Some(Box::new(after)),
        }
    }
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
    struct Reset(bool);
    impl Drop for Reset {
        fn drop(&mut self) {
            INTERNAL.set(self.0);
        }
    }
    let _reset = Reset(INTERNAL.replace(true));
    crate::spi::run(sql)?;
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
                if let Err(e) = crate::catalog::as_extension_owner(after) {
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
    if INTERNAL.get() || query_string.is_null() {
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

/// A deep copy of the planned statement (in the current memory context),
/// to change and run instead of it, and its utility statement.
///
/// # Safety
/// `pstmt` is ProcessUtility's planned statement; `T` its utility
/// statement's node type.
pub(crate) unsafe fn copy_statement<T>(
    pstmt: *mut pg_sys::PlannedStmt,
) -> (*mut pg_sys::PlannedStmt, *mut T) {
    // SAFETY: copyObjectImpl copies any node tree.
    unsafe {
        let copy = pg_sys::copyObjectImpl(pstmt.cast()) as *mut pg_sys::PlannedStmt;
        (copy, (*copy).utilityStmt.cast())
    }
}

/// The text of the statement being run (one of possibly several in the
/// query string), with positions relative to it.
pub(crate) struct StatementText {
    text: String,
    /// Where the statement starts in the query string.
    offset: usize,
}

impl StatementText {
    /// # Safety
    /// As for [`plan`].
    unsafe fn of(pstmt: *mut pg_sys::PlannedStmt, query_string: *const c_char) -> StatementText {
        // SAFETY: query_string is the NUL-terminated text the statement was
        // parsed from; locations are byte offsets into it.
        let (all, location, length) = unsafe {
            (
                CStr::from_ptr(query_string).to_string_lossy(),
                (*pstmt).stmt_location,
                (*pstmt).stmt_len,
            )
        };
        let start = usize::try_from(location).unwrap_or(0).min(all.len());
        let end = match usize::try_from(length) {
            Ok(0) | Err(_) => all.len(),
            Ok(length) => (start + length).min(all.len()),
        };
        StatementText {
            text: all.get(start..end).unwrap_or_default().to_string(),
            offset: start,
        }
    }

    /// The statement with `name` in place of the text at `span` (a shard
    /// table's name in place of its table's).
    fn spliced(&self, (start, end): (usize, usize), name: &str) -> String {
        format!("{}{name}{}", &self.text[..start], &self.text[end..])
    }

    /// Where the name of `table`, `relation` of the statement, is (as
    /// written, maybe qualified and quoted).
    ///
    /// # Safety
    /// `relation` is a RangeVar of this statement.
    unsafe fn name_span(
        &self,
        relation: *mut pg_sys::RangeVar,
        table: &LogicalTable,
    ) -> Result<(usize, usize)> {
        // SAFETY: the caller's RangeVar.
        let at = usize::try_from(unsafe { (*relation).location }).ok();
        let start = at.and_then(|at| at.checked_sub(self.offset));
        let length = start
            .and_then(|start| self.text.get(start..))
            .map(quote::qualified_name_length);
        match (start, length) {
            (Some(start), Some(length)) if length > 0 => Ok((start, start + length)),
            _ => Err(table.refuse("its name could not be found in the statement")),
        }
    }
}

/// A distributed (Some(column)) or reference (None) table's identity.
#[derive(Clone)]
pub(crate) struct LogicalTable {
    pub relid: pg_sys::Oid,
    /// As PostgreSQL prints it, for messages.
    pub display: String,
    pub dist_column: Option<String>,
}

impl LogicalTable {
    /// The table `relation` names, if it is distributed or a reference table.
    ///
    /// # Safety
    /// `relation` is a RangeVar of the statement, or null.
    unsafe fn named(relation: *mut pg_sys::RangeVar) -> Result<Option<LogicalTable>> {
        if relation.is_null() {
            return Ok(None);
        }
        // SAFETY: the caller's RangeVar.
        LogicalTable::of(unsafe { relation_oid(relation) })
    }

    pub fn of(relid: pg_sys::Oid) -> Result<Option<LogicalTable>> {
        if relid == pg_sys::InvalidOid {
            return Ok(None);
        }
        let found = crate::spi::connect(|client| {
            let rows = client.select(
                "SELECT dist_column FROM pg_shard.logical_table WHERE table_rel = $1",
                Some(1),
                &[relid.into()],
            )?;
            let Some(row) = rows.into_iter().next() else {
                return Ok::<_, ShardError>(None);
            };
            Ok(Some(row.get::<String>(1)?))
        })?;
        Ok(found.map(|dist_column| LogicalTable {
            relid,
            display: crate::spi::caller_relation_name(relid),
            dist_column,
        }))
    }

    pub fn is_distributed(&self) -> bool {
        self.dist_column.is_some()
    }

    /// The refusal of a change of this table.
    pub fn refuse(&self, reason: impl Into<String>) -> ShardError {
        ShardError::UnsupportedSchemaChange {
            table: self.display.clone(),
            reason: reason.into(),
        }
    }

    /// Changes wait for no job: a move or split of the table would copy the
    /// old shape to its new shards.
    pub fn refuse_during_job(&self) -> Result<()> {
        let running = query_one::<bool>(
            "SELECT EXISTS (SELECT 1 FROM pg_shard.job j \
                            JOIN pg_shard.shard s USING (shard_group_id) \
             WHERE s.table_rel = $1 AND j.state IN ('queued', 'running'))",
            &[self.relid.into()],
        )?
        .unwrap_or(false);
        if running {
            return Err(ShardError::SchemaChangeDuringJob(self.display.clone()));
        }
        Ok(())
    }

    /// The current role must own the table: for changes the metadata node
    /// does not run itself (a distributed table's indexes and constraints
    /// exist only on its shards), so PostgreSQL does not check that.
    pub fn require_owner(&self) -> Result<()> {
        crate::access::require_table_owner(self.relid, &self.display)
    }

    /// Take `mode` on the metadata node's table until the transaction ends.
    pub fn lock(&self, mode: u32) {
        // SAFETY: a heavyweight lock on an existing relation, held to
        // transaction end; an error is raised through pgrx's guard.
        unsafe { pg_sys::LockRelationOid(self.relid, mode as pg_sys::LOCKMODE) };
    }
}

/// The relation a statement's RangeVar names, or InvalidOid.
///
/// # Safety
/// `relation` is a RangeVar of the statement.
unsafe fn relation_oid(relation: *mut pg_sys::RangeVar) -> pg_sys::Oid {
    // SAFETY: a name lookup without a lock (the statement itself locks).
    unsafe {
        pg_sys::RangeVarGetRelidExtended(
            relation,
            pg_sys::NoLock as pg_sys::LOCKMODE,
            pg_sys::RVROption::RVR_MISSING_OK,
            None,
            std::ptr::null_mut(),
        )
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

/// The texts of a List of String nodes (a qualified name, a column list).
///
/// # Safety
/// `list` is a List of String nodes, or NIL.
pub(crate) unsafe fn string_list(list: *mut pg_sys::List) -> Vec<String> {
    // SAFETY: as the caller promises.
    unsafe { pgrx::PgList::<pg_sys::String>::from_pg(list) }
        .iter_ptr()
        .map(|s| {
            // SAFETY: a String node's NUL-terminated text.
            unsafe { text_of((*s).sval) }
        })
        .collect()
}

/// The text of a C string of the parse tree ("" for null).
///
/// # Safety
/// `text` is a NUL-terminated string of the parse tree, or null.
pub(crate) unsafe fn text_of(text: *const c_char) -> String {
    if text.is_null() {
        return String::new();
    }
    // SAFETY: as the caller promises.
    unsafe { CStr::from_ptr(text) }
        .to_string_lossy()
        .into_owned()
}

/// The name a RangeVar spells, as `[schema, ]name`.
///
/// # Safety
/// `relation` is a RangeVar of the statement.
unsafe fn range_var_parts(relation: *mut pg_sys::RangeVar) -> Vec<String> {
    // SAFETY: as the caller promises; its names are C strings or null.
    unsafe {
        let relation = &*relation;
        [relation.schemaname, relation.relname]
            .into_iter()
            .filter(|name| !name.is_null())
            .map(|name| text_of(name))
            .collect()
    }
}

/// One shard table: its node, id, schema and qualified name.
pub(crate) struct ShardTable {
    pub node: Node,
    pub shard_id: i64,
    pub schema: String,
    pub qualified: String,
}

/// Every placement of `relid`'s shards, in node order.
pub(crate) fn shard_tables(relid: pg_sys::Oid) -> Result<Vec<ShardTable>> {
    crate::spi::connect(|client| {
        let mut tables = Vec::new();
        for row in client.select(
            "SELECT n.node_id, n.host, n.port, s.shard_id, s.shard_schema, s.shard_name \
             FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) \
             JOIN pg_shard.node n USING (node_id) \
             WHERE s.table_rel = $1 ORDER BY n.node_id, s.shard_id",
            None,
            &[relid.into()],
        )? {
            let schema = row.get::<String>(5)?.unwrap_or_default();
            let name = row.get::<String>(6)?.unwrap_or_default();
            tables.push(ShardTable {
                node: Node {
                    node_id: row.get::<i32>(1)?.unwrap_or_default(),
                    host: row.get::<String>(2)?.unwrap_or_default(),
                    port: row.get::<i32>(3)?.unwrap_or_default(),
                },
                shard_id: row.get::<i64>(4)?.unwrap_or_default(),
                qualified: quote::qualified(&schema, &name),
                schema,
            });
        }
        Ok(tables)
    })
}

/// Run the statements `sql` gives for each shard table of `relid`, in the
/// remote transactions that commit with the local one (all of a node's in
/// one round trip).
pub(crate) fn on_shards_in_transaction(
    relid: pg_sys::Oid,
    sql: impl Fn(&ShardTable) -> Vec<String>,
) -> Result<()> {
    let shards = shard_tables(relid)?;
    let mut by_node: Vec<(Node, Vec<String>)> = Vec::new();
    for shard in &shards {
        let statements = sql(shard);
        if statements.is_empty() {
            continue;
        }
        match by_node
            .iter_mut()
            .find(|(n, _)| n.node_id == shard.node.node_id)
        {
            Some((_, all)) => all.extend(statements),
            None => by_node.push((shard.node.clone(), statements)),
        }
    }
    for (node, statements) in by_node {
        let script = statements.join(";\n");
        crate::remote::in_transaction(&node, |client| {
            client
                .batch_execute(&script)
                .map_err(|e| crate::remote::remote_error(&node, &e))
        })?;
    }
    Ok(())
}

/// Run `sql` on each shard table of `relid` one statement at a time outside
/// any transaction (CREATE/DROP INDEX CONCURRENTLY). If one fails, `undo`
/// runs on every shard table (it must tolerate shards `sql` never reached),
/// and the error is returned.
pub(crate) fn on_shards_one_by_one(
    relid: pg_sys::Oid,
    sql: impl Fn(&ShardTable) -> String,
    undo: impl Fn(&ShardTable) -> String,
) -> Result<()> {
    let shards = shard_tables(relid)?;
    // Every node is reached before anything changes.
    let mut clients: Vec<(i32, postgres::Client)> = Vec::new();
    for shard in &shards {
        if !clients.iter().any(|(id, _)| *id == shard.node.node_id) {
            let client = crate::remote::connect(&shard.node.host, shard.node.port)?;
            clients.push((shard.node.node_id, client));
        }
    }
    fn client_of<'a>(
        clients: &'a mut [(i32, postgres::Client)],
        node: &Node,
    ) -> Option<&'a mut postgres::Client> {
        clients
            .iter_mut()
            .find(|(id, _)| *id == node.node_id)
            .map(|(_, client)| client)
    }
    let mut failure = None;
    for shard in &shards {
        pgrx::check_for_interrupts!();
        let Some(client) = client_of(&mut clients, &shard.node) else {
            continue;
        };
        if let Err(e) = client.batch_execute(&sql(shard)) {
            failure = Some(crate::remote::remote_error(&shard.node, &e));
            break;
        }
    }
    let Some(failure) = failure else {
        return Ok(());
    };
    for shard in &shards {
        if let Some(client) = client_of(&mut clients, &shard.node) {
            if let Err(e) = client.batch_execute(&undo(shard)) {
                pgrx::warning!(
                    "could not undo a change of shard table {} on node {}: {}",
                    shard.qualified,
                    shard.node.label(),
                    crate::remote::describe(&e)
                );
            }
        }
    }
    Err(failure)
}
