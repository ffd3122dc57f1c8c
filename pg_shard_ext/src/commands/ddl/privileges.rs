//! GRANT / REVOKE, OWNER TO and COMMENT on distributed and reference tables.
//!
//! The metadata node runs the statement; then each shard table gets the
//! table's privileges (revoked from every grantee before and after, granted
//! as they now are), its owner, or the comment. Roles are per server: a role
//! granted to or made owner must exist on every worker, or the statement
//! fails everywhere.

use super::parse::{logical_table_named, string_list};
use super::plan::{Local, Planned};
use crate::error::Result;
use crate::metadata::LogicalTable;
use crate::quote;
use crate::shard_ddl::TableShape;
use crate::transaction::fan_out::on_shards_in_transaction;
use pgrx::prelude::*;
use std::ffi::CStr;

/// # Safety
/// `grant` is the statement's GrantStmt.
pub(super) unsafe fn plan_grant(grant: *mut pg_sys::GrantStmt) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let grant = unsafe { &*grant };
    if grant.objtype != pg_sys::ObjectType::OBJECT_TABLE {
        return Ok(None);
    }
    let mut tables = Vec::new();
    match grant.targtype {
        pg_sys::GrantTargetType::ACL_TARGET_OBJECT => {
            // SAFETY: the objects of GRANT … ON TABLE are RangeVars.
            let relations = unsafe { pgrx::PgList::<pg_sys::RangeVar>::from_pg(grant.objects) };
            for relation in relations.iter_ptr() {
                // SAFETY: a RangeVar of the statement.
                if let Some(table) = unsafe { logical_table_named(relation)? } {
                    tables.push(table);
                }
            }
        }
        pg_sys::GrantTargetType::ACL_TARGET_ALL_IN_SCHEMA => {
            // SAFETY: the objects of ALL TABLES IN SCHEMA are String nodes.
            tables = tables_in_schemas(&unsafe { string_list(grant.objects) })?;
        }
        _ => return Ok(None),
    }
    let Some(first) = tables.first() else {
        return Ok(None);
    };
    // SAFETY: a list of AccessPriv nodes (NIL for ALL PRIVILEGES).
    let privileges = unsafe { pgrx::PgList::<pg_sys::AccessPriv>::from_pg(grant.privileges) };
    // SAFETY: AccessPriv nodes of the list.
    if privileges
        .iter_ptr()
        .any(|p| unsafe { !(*p).cols.is_null() })
    {
        return Err(first.refuse("column privileges are not carried to the shards yet"));
    }
    let mut before = Vec::new();
    for table in &tables {
        table.refuse_during_job()?;
        before.push(TableShape::load(table.relid)?.grantees());
    }
    Ok(Some(Planned::new(Local::Run, move || {
        for (table, before) in tables.iter().zip(before) {
            let shape = TableShape::load(table.relid)?;
            let mut grantees = before;
            grantees.extend(shape.grantees());
            grantees.sort();
            grantees.dedup();
            on_shards_in_transaction(table.relid, |shard| {
                let mut sql = Vec::new();
                if !grantees.is_empty() {
                    sql.push(format!(
                        "REVOKE ALL ON {} FROM {}",
                        shard.qualified,
                        grantees.join(", ")
                    ));
                }
                sql.extend(shape.grant_sql(&shard.qualified));
                sql
            })?;
        }
        Ok(())
    })))
}

fn tables_in_schemas(schemas: &[String]) -> Result<Vec<LogicalTable>> {
    let relids = crate::spi::connect(|client| {
        let mut relids = Vec::new();
        for row in client.select(
            "SELECT t.table_rel::oid FROM pg_shard.logical_table t \
             JOIN pg_class c ON c.oid = t.table_rel \
             JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = ANY ($1) ORDER BY 1",
            None,
            &[schemas.to_vec().into()],
        )? {
            if let Some(relid) = row.get::<pg_sys::Oid>(1)? {
                relids.push(relid);
            }
        }
        Ok::<_, crate::error::ShardError>(relids)
    })?;
    let mut tables = Vec::new();
    for relid in relids {
        tables.extend(LogicalTable::of(relid)?);
    }
    Ok(tables)
}

/// COMMENT ON TABLE / COLUMN.
///
/// # Safety
/// `comment` is the statement's CommentStmt.
pub(super) unsafe fn plan_comment(comment: *mut pg_sys::CommentStmt) -> Result<Option<Planned>> {
    // SAFETY: the caller's node.
    let comment = unsafe { &*comment };
    let on_column = match comment.objtype {
        pg_sys::ObjectType::OBJECT_TABLE => false,
        pg_sys::ObjectType::OBJECT_COLUMN => true,
        _ => return Ok(None),
    };
    // SAFETY: the object of COMMENT ON TABLE / COLUMN is a list of String
    // nodes: [schema.]table[.column].
    let mut names = unsafe { string_list(comment.object.cast()) };
    let column = if on_column { names.pop() } else { None };
    let relid = match names.as_slice() {
        [name] => crate::spi::caller_relation(&crate::quote::ident(name)),
        [schema, name] => crate::spi::caller_relation(&crate::quote::qualified(schema, name)),
        _ => None,
    };
    let Some(table) = LogicalTable::of(relid.unwrap_or(pg_sys::InvalidOid))? else {
        return Ok(None);
    };
    table.refuse_during_job()?;
    let text = if comment.comment.is_null() {
        "NULL".to_string()
    } else {
        // SAFETY: the comment's text.
        quote::literal(&unsafe { CStr::from_ptr(comment.comment) }.to_string_lossy())
    };
    Ok(Some(Planned::new(Local::Run, move || {
        on_shards_in_transaction(table.relid, |shard| {
            vec![match &column {
                None => format!("COMMENT ON TABLE {} IS {text}", shard.qualified),
                Some(column) => format!(
                    "COMMENT ON COLUMN {}.{} IS {text}",
                    shard.qualified,
                    quote::ident(column)
                ),
            }]
        })
    })))
}

/// ALTER TABLE … OWNER TO: the shard tables (and a distributed table's
/// foreign partitions, which ALTER TABLE does not recurse to for an owner)
/// follow, so the new owner may change and use them.
pub(super) fn plan_owner(table: LogicalTable) -> Result<Planned> {
    table.refuse_during_job()?;
    Ok(Planned::new(Local::Run, move || {
        let shape = TableShape::load(table.relid)?;
        let partitions = crate::spi::connect(|client| {
            let mut partitions = Vec::new();
            for row in client.select(
                "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1 \
                 ORDER BY 1",
                None,
                &[table.relid.into()],
            )? {
                partitions.push(row.get::<String>(1)?.unwrap_or_default());
            }
            Ok::<_, crate::error::ShardError>(partitions)
        })?;
        for partition in partitions {
            super::internal::run_internal(&shape.owner_sql(&partition))?;
        }
        on_shards_in_transaction(table.relid, |shard| vec![shape.owner_sql(&shard.qualified)])
    }))
}
