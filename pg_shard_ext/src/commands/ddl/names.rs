//! Renames of the indexes and constraints of distributed and reference
//! tables (ALTER INDEX … RENAME, ALTER TABLE … RENAME CONSTRAINT), and
//! ALTER TABLE … SET SCHEMA.
//!
//! A shard table's index-backed objects carry its shard id in their names
//! (index names are unique per schema), its other constraints the table's
//! own names; a rename keeps it so, or a later DROP would miss the shard's
//! object. A distributed table's indexes and constraints exist only in
//! `pg_shard.table_constraint` and on the shards, so the metadata node skips
//! the statement and the catalog is renamed instead; a reference table
//! renames its own and the copies follow. SET SCHEMA leaves the shards where
//! they are and moves the map on, so routers learn the table's new name.

use super::parse::{logical_table_named, range_var_parts, text_of};
use super::plan::{Local, Planned};
use super::shard_names::{index_name_taken, namespace_of, shard_object_name};
use crate::error::{Result, ShardError};
use crate::metadata::LogicalTable;
use crate::quote;
use crate::spi::query_one;
use crate::transaction::fan_out::on_shards_in_transaction;
use pgrx::prelude::*;

/// A recorded index or constraint of a distributed table: its kind.
fn recorded_kind(relid: pg_sys::Oid, name: &str) -> Result<Option<char>> {
    Ok(query_one::<String>(
        "SELECT kind::text FROM pg_shard.table_constraint WHERE table_rel = $1 AND name = $2",
        &[relid.into(), name.into()],
    )?
    .and_then(|kind| kind.chars().next()))
}

/// Rename a recorded object of a distributed table, and the shards' copies.
fn rename_recorded(relid: pg_sys::Oid, kind: char, old: String, new: String) -> Planned {
    Planned::new(Local::Skip, move || {
        crate::spi::run_with_args(
            "UPDATE pg_shard.table_constraint SET name = $3 WHERE table_rel = $1 AND name = $2",
            &[relid.into(), old.as_str().into(), new.as_str().into()],
        )?;
        rename_on_shards(relid, kind, &old, &new)
    })
}

/// Each shard table of `relid` renames its copy of the object.
fn rename_on_shards(relid: pg_sys::Oid, kind: char, old: &str, new: &str) -> Result<()> {
    on_shards_in_transaction(relid, |shard| {
        let (old, new) = (
            shard_object_name(kind, old, shard.shard_id),
            quote::ident(&shard_object_name(kind, new, shard.shard_id)),
        );
        vec![if kind == 'i' {
            format!(
                "ALTER INDEX {} RENAME TO {new}",
                quote::qualified(&shard.schema, &old)
            )
        } else {
            format!(
                "ALTER TABLE {} RENAME CONSTRAINT {} TO {new}",
                shard.qualified,
                quote::ident(&old)
            )
        }]
    })
}

/// ALTER INDEX … RENAME (or ALTER TABLE naming an index) of an index of a
/// distributed or reference table; None for other relations.
///
/// # Safety
/// `rename` is the statement's RenameStmt.
pub(super) unsafe fn plan_index_rename(rename: *mut pg_sys::RenameStmt) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let rename = unsafe { &*rename };
    if rename.relation.is_null() {
        return Ok(None);
    }
    // SAFETY: the statement's RangeVar and new name.
    let (parts, new) = unsafe { (range_var_parts(rename.relation), text_of(rename.newname)) };
    if rename.renameType == pg_sys::ObjectType::OBJECT_TABLE {
        // ALTER TABLE accepts an index's name too; only a local index can
        // be meant (a distributed table's exist only in the catalog).
        // SAFETY: the statement's RangeVar; a relkind lookup by oid.
        let is_index = unsafe {
            let relid = super::parse::relation_oid(rename.relation);
            relid != pg_sys::InvalidOid
                && pg_sys::get_rel_relkind(relid) == pg_sys::RELKIND_INDEX as std::ffi::c_char
        };
        if !is_index {
            return Ok(None);
        }
    }
    let Some((table, old)) = super::objects::index_of_logical_table(&parts)? else {
        return Ok(None);
    };
    table.refuse_during_job()?;
    if !table.is_distributed() {
        // The metadata node renames (and checks) its index; copies follow.
        let relid = table.relid;
        return Ok(Some(Planned::new(Local::Run, move || {
            rename_on_shards(relid, 'i', &old, &new)
        })));
    }
    table.require_owner()?;
    table.lock(pg_sys::ShareUpdateExclusiveLock);
    if index_name_taken(namespace_of(table.relid)?, &new, None)? {
        return Err(ShardError::RelationExists(new));
    }
    // A constraint's index renames the constraint too, as in PostgreSQL.
    let kind = recorded_kind(table.relid, &old)?.unwrap_or('i');
    Ok(Some(rename_recorded(table.relid, kind, old, new)))
}

/// ALTER TABLE … RENAME CONSTRAINT of a distributed or reference table.
///
/// # Safety
/// `rename` is the statement's RenameStmt (of a constraint of `table`).
pub(super) unsafe fn plan_constraint_rename(
    rename: &pg_sys::RenameStmt,
    table: LogicalTable,
) -> Result<Planned> {
    // SAFETY: the names of the caller's node.
    let (old, new) = unsafe { (text_of(rename.subname), text_of(rename.newname)) };
    table.refuse_during_job()?;
    let relid = table.relid;
    if !table.is_distributed() {
        return Ok(Planned::new(Local::Run, move || {
            // The renamed constraint's kind tells its name on the copies.
            let kind = query_one::<String>(
                "SELECT contype::text FROM pg_constraint WHERE conrelid = $1 AND conname = $2",
                &[relid.into(), new.as_str().into()],
            )?
            .and_then(|kind| kind.chars().next())
            .unwrap_or('c');
            rename_on_shards(relid, kind, &old, &new)
        }));
    }
    table.require_owner()?;
    table.lock(pg_sys::AccessExclusiveLock);
    let kind = match recorded_kind(relid, &old)? {
        Some(kind) if kind != 'i' => kind,
        _ => {
            return Err(ShardError::UnknownConstraint {
                constraint: old,
                table: table.display,
            })
        }
    };
    if recorded_kind(relid, &new)?.is_some_and(|kind| kind != 'i') {
        return Err(ShardError::ConstraintExists {
            constraint: new,
            table: table.display,
        });
    }
    if matches!(kind, 'p' | 'u' | 'x') && index_name_taken(namespace_of(relid)?, &new, None)? {
        return Err(ShardError::RelationExists(new));
    }
    Ok(rename_recorded(relid, kind, old, new))
}

/// ALTER TABLE … SET SCHEMA of a distributed or reference table.
///
/// # Safety
/// `alter` is the statement's AlterObjectSchemaStmt.
pub(super) unsafe fn plan_set_schema(
    alter: *mut pg_sys::AlterObjectSchemaStmt,
) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let alter = unsafe { &*alter };
    if alter.objectType != pg_sys::ObjectType::OBJECT_TABLE {
        return Ok(None);
    }
    // SAFETY: the statement's RangeVar.
    let Some(table) = (unsafe { logical_table_named(alter.relation)? }) else {
        return Ok(None);
    };
    table.refuse_during_job()?;
    if table.is_distributed() {
        // PostgreSQL checks the indexes the table itself has; the recorded
        // ones must be free in the new schema as well.
        // SAFETY: the new schema's name in the parse tree.
        let schema = unsafe { text_of(alter.newschema) };
        let namespace = query_one::<pg_sys::Oid>(
            "SELECT oid FROM pg_namespace WHERE nspname = $1",
            &[schema.as_str().into()],
        )?;
        if let Some(namespace) = namespace {
            for name in super::objects::recorded_index_names(table.relid)? {
                if index_name_taken(namespace, &name, Some(table.relid))? {
                    return Err(ShardError::RelationExists(name));
                }
            }
        }
    }
    Ok(Some(Planned::new(Local::Run, || {
        crate::metadata::catalog::bump_map_version()?;
        Ok(())
    })))
}
