//! ALTER TABLE column changes and RENAME of distributed and reference
//! tables.
//!
//! Supported: ADD COLUMN (with NOT NULL or DEFAULT), DROP COLUMN, ALTER
//! COLUMN TYPE, SET / DROP NOT NULL, SET STATISTICS, SET / RESET column
//! options, RENAME COLUMN, and SET / RESET of storage parameters (on the
//! shards only for a distributed table). The metadata node's
//! table runs the statement first (for a distributed table PostgreSQL
//! carries column changes on to the foreign partitions itself), then every
//! shard table runs it with its own name in place of the table's, so the
//! shards keep the table's attribute layout. SET / DROP DEFAULT and RENAME
//! of the table change the metadata node only (shards carry no defaults;
//! they keep their names). The distribution column cannot be dropped,
//! renamed or change its type. Constraint actions go to [`super::objects`].

use super::objects::RecordedChange;
use super::parse::{logical_table_named, StatementText};
use super::plan::{Local, Planned};
use crate::error::Result;
use crate::metadata::LogicalTable;
use crate::transaction::fan_out::on_shards_in_transaction;
use pgrx::prelude::*;
use std::ffi::{c_char, CStr};

/// # Safety
/// `alter` is the statement's AlterTableStmt.
pub(super) unsafe fn plan_alter(
    alter: *mut pg_sys::AlterTableStmt,
    text: StatementText,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let alter = unsafe { &*alter };
    if alter.objtype != pg_sys::ObjectType::OBJECT_TABLE {
        return Ok(None);
    }
    // SAFETY: the statement's RangeVar.
    let Some(table) = (unsafe { logical_table_named(alter.relation)? }) else {
        return Ok(None);
    };
    refuse_lookup_table(&table)?;
    // SAFETY: the statement's list of AlterTableCmd nodes.
    let cmds = unsafe { pgrx::PgList::<pg_sys::AlterTableCmd>::from_pg(alter.cmds) };
    use pg_sys::AlterTableType as T;
    let is_constraint_action = |cmd: *mut pg_sys::AlterTableCmd| {
        // SAFETY: an AlterTableCmd of the list.
        matches!(
            unsafe { (*cmd).subtype },
            T::AT_AddConstraint | T::AT_DropConstraint | T::AT_ValidateConstraint
        )
    };
    // Actions planned apart, which must come alone: whether the statement
    // has one of `kinds` (then only that), or is refused for mixing.
    let alone = |kinds: &[T::Type], what: &str| {
        // SAFETY: AlterTableCmds of the list.
        let found = cmds
            .iter_ptr()
            .any(|c| kinds.contains(&unsafe { (*c).subtype }));
        match (found, cmds.len()) {
            (false, _) => Ok(false),
            (true, 1) => Ok(true),
            _ => Err(table.refuse(format!("{what} in an ALTER TABLE statement of its own"))),
        }
    };
    if alone(&[T::AT_ChangeOwner], "run OWNER TO")? {
        return super::privileges::plan_owner(table).map(Some);
    }
    if alone(
        &[T::AT_SetRelOptions, T::AT_ResetRelOptions],
        "set or reset storage parameters",
    )? {
        // SAFETY: the statement's RangeVar.
        let span = unsafe { text.name_span(alter.relation, &table)? };
        return storage_parameters(table, text, span).map(Some);
    }
    let constraint_actions = cmds.iter_ptr().filter(|c| is_constraint_action(*c)).count();
    // SAFETY: the statement's commands.
    if let Some(planned) = unsafe { super::foreign_keys::plan(&table, &cmds)? } {
        return Ok(Some(planned));
    }
    if constraint_actions > 0 {
        if constraint_actions < cmds.len() {
            return Err(
                table.refuse("run constraint changes in an ALTER TABLE statement of their own")
            );
        }
        for cmd in cmds.iter_ptr() {
            // SAFETY: an AlterTableCmd of the list.
            unsafe { check_added_constraint(&*cmd, &table)? };
        }
        // SAFETY: the statement's RangeVar.
        let (_, end) = unsafe { text.name_span(alter.relation, &table)? };
        let actions = text.text[end..].to_string();
        return super::objects::plan_alter_constraints(table, actions).map(Some);
    }
    let mut on_shards = false;
    for cmd in cmds.iter_ptr() {
        // SAFETY: an AlterTableCmd of the list.
        on_shards |= unsafe { judge_column_action(&*cmd, &table)? };
    }
    // SAFETY: the statement's RangeVar.
    let span = unsafe { text.name_span(alter.relation, &table)? };
    splice_plan(table, text, span, on_shards, false)
}

/// # Safety
/// `rename` is the statement's RenameStmt.
pub(super) unsafe fn plan_rename(
    rename: *mut pg_sys::RenameStmt,
    text: StatementText,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let rename = unsafe { &*rename };
    // SAFETY: the statement's RangeVar.
    let Some(table) = (unsafe { logical_table_named(rename.relation)? }) else {
        return Ok(None);
    };
    refuse_lookup_table(&table)?;
    let (on_shards, new_map) = match rename.renameType {
        // SAFETY: a column name of the parse tree.
        pg_sys::ObjectType::OBJECT_COLUMN if unsafe { is_dist(rename.subname, &table) } => {
            // SAFETY: the statement's RangeVar and new name.
            let (span, new_name) = unsafe {
                (
                    text.name_span(rename.relation, &table)?,
                    super::parse::text_of(rename.newname),
                )
            };
            return rename_distribution_column(table, text, span, new_name).map(Some);
        }
        // The routers name the column of self-routing ids: a new map.
        // The routers name the column of self-routing ids and the
        // looked-up columns: a new map (and the lookups' triggers again).
        // SAFETY: column names of the parse tree.
        pg_sys::ObjectType::OBJECT_COLUMN => (true, unsafe {
            is_routing(rename.subname, &table) || is_looked_up(rename.subname, &table)?
        }),
        // The shards keep their names; routers learn the new one.
        pg_sys::ObjectType::OBJECT_TABLE => (false, true),
        pg_sys::ObjectType::OBJECT_TABCONSTRAINT => {
            // SAFETY: the caller's node.
            return unsafe { super::names::plan_constraint_rename(rename, table) }.map(Some);
        }
        _ => return Err(table.refuse("this RENAME is not carried to the shards yet")),
    };
    // SAFETY: the statement's RangeVar.
    let span = unsafe { text.name_span(rename.relation, &table)? };
    splice_plan(table, text, span, on_shards, new_map)
}

/// The metadata node runs the statement; then each shard table runs it
/// with its name spliced in, and the map moves on when asked.
fn splice_plan(
    table: LogicalTable,
    text: StatementText,
    span: (usize, usize),
    on_shards: bool,
    new_map: bool,
) -> Result<Option<Planned>> {
    if on_shards || new_map {
        table.refuse_during_job()?;
    }
    let recorded = match on_shards && table.is_distributed() {
        true => Some(RecordedChange::of_column_change(
            &table,
            &text.text[span.1..],
        )?),
        false => None,
    };
    let relid = table.relid;
    let key = table.dist_column.clone();
    Ok(Some(Planned::new(Local::Run, move || {
        let distributed = recorded.is_some();
        if let Some(recorded) = recorded {
            recorded.record(relid)?;
        }
        if on_shards {
            // A renamed looked-up column: the lookups' triggers name it.
            let lookups = match (&key, new_map) {
                (Some(_), true) => crate::commands::lookup::lookups_after_rename(relid)?,
                _ => Vec::new(),
            };
            on_shards_in_transaction(relid, |shard| {
                let mut sql = vec![text.spliced(span, &shard.qualified)];
                if let Some(key) = &key {
                    sql.extend(crate::commands::lookup::trigger_script(
                        &lookups,
                        &shard.qualified,
                        key,
                    ));
                }
                sql
            })?;
            if distributed {
                super::foreign_keys::refresh_recorded(relid)?;
            }
        }
        if new_map {
            crate::metadata::catalog::bump_map_version()?;
        }
        Ok(())
    })))
}

/// SET / RESET (storage parameters: fillfactor, autovacuum settings): every
/// shard table; the metadata node's table too for a reference table. A
/// distributed table's partitioned table cannot hold them: its shards keep
/// them (moves and splits copy them from the shard).
fn storage_parameters(
    table: LogicalTable,
    text: StatementText,
    span: (usize, usize),
) -> Result<Planned> {
    table.refuse_during_job()?;
    let local = if table.is_distributed() {
        table.require_owner()?;
        table.lock(pg_sys::ShareUpdateExclusiveLock);
        Local::Skip
    } else {
        Local::Run
    };
    let relid = table.relid;
    Ok(Planned::new(local, move || {
        on_shards_in_transaction(relid, |shard| vec![text.spliced(span, &shard.qualified)])
    }))
}

/// RENAME of the distribution column: the shard tables, their guard
/// triggers (which name the column) and ownership records, the catalog, and
/// a new map for the routers, all in the statement's transaction.
fn rename_distribution_column(
    table: LogicalTable,
    text: StatementText,
    span: (usize, usize),
    new_name: String,
) -> Result<Planned> {
    table.refuse_during_job()?;
    let recorded = RecordedChange::of_column_change(&table, &text.text[span.1..])?;
    let relid = table.relid;
    Ok(Planned::new(Local::Run, move || {
        recorded.record(relid)?;
        let ranges = shard_ranges(relid)?;
        let lookups = crate::commands::lookup::lookups_after_rename(relid)?;
        on_shards_in_transaction(relid, |shard| {
            let (range_start, range_end) = ranges.get(&shard.shard_id).copied().unwrap_or_default();
            let mut sql = vec![text.spliced(span, &shard.qualified)];
            for trigger in crate::worker::fencing::COLUMN_GUARD_TRIGGERS {
                sql.push(format!("DROP TRIGGER {trigger} ON {}", shard.qualified));
            }
            sql.extend(crate::worker::fencing::column_guard_ddl(
                &shard.qualified,
                &new_name,
                range_start,
                range_end,
            ));
            // (As the table's owner: see crate::worker::local_shard.)
            sql.push(format!(
                "SELECT pg_shard.record_local_shard(shard_rel, shard_id, {}, range_start, \
                 range_end, state, epoch) FROM pg_shard.local_shard WHERE shard_id = {}",
                crate::quote::literal(&new_name),
                shard.shard_id
            ));
            // (The lookups' triggers name the key too.)
            sql.extend(crate::commands::lookup::trigger_script(
                &lookups,
                &shard.qualified,
                &new_name,
            ));
            sql
        })?;
        super::foreign_keys::refresh_recorded(relid)?;
        crate::metadata::catalog::write(
            "UPDATE pg_shard.logical_table SET dist_column = $2 WHERE table_rel = $1",
            &[relid.into(), new_name.as_str().into()],
        )?;
        crate::metadata::catalog::bump_map_version()?;
        Ok(())
    }))
}

/// Each shard's key range.
fn shard_ranges(relid: pg_sys::Oid) -> Result<std::collections::HashMap<i64, (i64, i64)>> {
    crate::spi::connect(|client| {
        let mut ranges = std::collections::HashMap::new();
        for row in client.select(
            "SELECT s.shard_id, g.range_start, g.range_end FROM pg_shard.shard s \
             JOIN pg_shard.shard_group g USING (shard_group_id) WHERE s.table_rel = $1",
            None,
            &[relid.into()],
        )? {
            ranges.insert(
                row.get::<i64>(1)?.unwrap_or_default(),
                (
                    row.get::<i64>(2)?.unwrap_or_default(),
                    row.get::<i64>(3)?.unwrap_or_default(),
                ),
            );
        }
        Ok(ranges)
    })
}

/// # Safety
/// `name` is a column name of the parse tree, or null.
unsafe fn is_dist(name: *mut c_char, table: &LogicalTable) -> bool {
    // SAFETY: as the caller promises.
    unsafe { names(name, table.dist_column.as_deref()) }
}

/// # Safety
/// `name` is a column name of the parse tree, or null.
unsafe fn is_routing(name: *mut c_char, table: &LogicalTable) -> bool {
    // SAFETY: as the caller promises.
    unsafe { names(name, table.routing_column.as_deref()) }
}

/// A lookup table's shape is pg_shard's: the writes of its table rely on it.
fn refuse_lookup_table(table: &LogicalTable) -> Result<()> {
    if crate::lookups::catalog::is_lookup_table(table.relid)? {
        return Err(table.refuse(
            "it is a lookup table (pg_shard.create_lookup), whose columns pg_shard writes",
        ));
    }
    Ok(())
}

/// Whether the column `name` (or null) has a lookup table.
///
/// # Safety
/// `name` is a column name of the parse tree, or null.
unsafe fn is_looked_up(name: *mut c_char, table: &LogicalTable) -> Result<bool> {
    if name.is_null() || !table.is_distributed() {
        return Ok(false);
    }
    // SAFETY: as the caller promises.
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    Ok(crate::lookups::catalog::lookups_of(table.relid)?
        .iter()
        .any(|l| l.column == name))
}

/// Whether the parse tree's column name `name` (or null) is `column`.
///
/// # Safety
/// `name` is a column name of the parse tree, or null.
unsafe fn names(name: *mut c_char, column: Option<&str>) -> bool {
    // SAFETY: as the caller promises.
    !name.is_null()
        && column.is_some_and(|c| unsafe { CStr::from_ptr(name) }.to_bytes() == c.as_bytes())
}

/// Whether the shards run this action, or the reason it is refused.
///
/// # Safety
/// `cmd` is an AlterTableCmd of the statement.
unsafe fn judge_column_action(cmd: &pg_sys::AlterTableCmd, table: &LogicalTable) -> Result<bool> {
    use pg_sys::AlterTableType as T;
    // SAFETY: the command's column name, or null.
    let dist = unsafe { is_dist(cmd.name, table) };
    match cmd.subtype {
        T::AT_AddColumn => {
            // SAFETY: ADD COLUMN's definition is a ColumnDef.
            unsafe { check_added_column(cmd.def, table)? };
            Ok(true)
        }
        T::AT_DropColumn if dist => Err(table.refuse("the distribution column cannot be dropped")),
        // SAFETY: the command's column name, or null.
        T::AT_DropColumn | T::AT_AlterColumnType if unsafe { is_routing(cmd.name, table) } => {
            Err(table.refuse(
                "the column holds routing ids (pg_shard.set_routing_id): run \
                 pg_shard.set_routing_id(table, NULL) first",
            ))
        }
        // SAFETY: the command's column name, or null.
        T::AT_DropColumn | T::AT_AlterColumnType if unsafe { is_looked_up(cmd.name, table)? } => {
            Err(table.refuse(
                "the column has a lookup table (pg_shard.create_lookup): run \
                 pg_shard.drop_lookup(table, column) first",
            ))
        }
        T::AT_AlterColumnType if dist => Err(table.refuse(
            "the distribution column's type cannot change (rows would hash to other shards)",
        )),
        T::AT_DropColumn | T::AT_AlterColumnType | T::AT_SetNotNull | T::AT_DropNotNull => Ok(true),
        // Planner statistics are gathered on each shard by its own ANALYZE.
        T::AT_SetStatistics | T::AT_SetOptions | T::AT_ResetOptions => Ok(true),
        // Defaults apply where rows are routed from: the metadata node's
        // table.
        T::AT_ColumnDefault => Ok(false),
        _ => Err(table.refuse(
            "this ALTER TABLE action is not carried to the shards yet (supported: ADD/DROP \
             COLUMN, ALTER COLUMN TYPE, SET/DROP NOT NULL, SET/DROP DEFAULT, SET STATISTICS, \
             SET/RESET (…), RENAME, ADD/DROP/VALIDATE CONSTRAINT, OWNER TO, SET SCHEMA)",
        )),
    }
}

/// A distributed table's constraints cannot adopt an index (it has none on
/// the metadata node).
///
/// # Safety
/// `cmd` is an AlterTableCmd of the statement.
unsafe fn check_added_constraint(cmd: &pg_sys::AlterTableCmd, table: &LogicalTable) -> Result<()> {
    if cmd.subtype != pg_sys::AlterTableType::AT_AddConstraint || cmd.def.is_null() {
        return Ok(());
    }
    // SAFETY: ADD CONSTRAINT's definition is a Constraint node.
    let constraint = unsafe { &*(cmd.def as *mut pg_sys::Constraint) };
    if !constraint.indexname.is_null() && table.is_distributed() {
        return Err(table.refuse(
            "a distributed table's constraint cannot use an existing index (USING INDEX); \
             name the columns instead",
        ));
    }
    Ok(())
}

/// A column added to a distributed table may carry NOT NULL and DEFAULT;
/// other constraints go in an ADD CONSTRAINT of their own.
///
/// # Safety
/// `def` is ADD COLUMN's ColumnDef.
unsafe fn check_added_column(def: *mut pg_sys::Node, table: &LogicalTable) -> Result<()> {
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
                return Err(table.refuse(
                    "a new column may carry NOT NULL and DEFAULT; add other constraints with \
                     ALTER TABLE … ADD CONSTRAINT once the column exists",
                ))
            }
        }
    }
    Ok(())
}
