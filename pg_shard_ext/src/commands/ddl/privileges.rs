//! GRANT / REVOKE, OWNER TO and COMMENT on distributed and reference tables.
//!
//! The metadata node runs the statement; then each shard table gets the
//! table's privileges (revoked from every grantee before and after, granted
//! as they now are), its owner, or the comment. Roles are per server: a role
//! granted to or made owner must exist on every worker, or the statement
//! fails everywhere.
//!
//! A lookup table's owner and privileges follow its table's
//! ([`lookups_follow`]): whoever may write the table writes its lookups
//! with it, and whoever may read it reads them to find its rows.

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
                    if crate::lookups::catalog::is_lookup_table(table.relid)? {
                        return Err(lookup_refusal(&table));
                    }
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
    // Lookup tables the statement reaches (ALL TABLES IN SCHEMA) take
    // their tables' privileges again afterwards, whatever it gave them.
    let mut followed = Vec::new();
    let mut own_tables = Vec::new();
    for table in tables {
        match crate::lookups::catalog::table_of_lookup(table.relid)? {
            Some(base) => followed.push(base),
            None => {
                followed.push(table.relid);
                own_tables.push(table);
            }
        }
    }
    followed.sort_by_key(|oid| oid.to_u32());
    followed.dedup();
    // Who had privileges on the lookups before (the statement may change
    // theirs itself): revoked on their shards too.
    let mut lookups_before = Vec::new();
    for &relid in &followed {
        refuse_unless_owner_of_lookups(relid)?;
        for lookup in crate::lookups::catalog::lookups_of(relid)? {
            lookups_before.extend(TableShape::load(lookup.lookup_rel)?.grantees());
        }
    }
    let tables = own_tables;
    if followed.is_empty() {
        return Ok(None);
    }
    // SAFETY: a list of AccessPriv nodes (NIL for ALL PRIVILEGES).
    let privileges = unsafe { pgrx::PgList::<pg_sys::AccessPriv>::from_pg(grant.privileges) };
    // SAFETY: AccessPriv nodes of the list.
    if let Some(first) = tables.first().filter(|_| {
        privileges
            .iter_ptr()
            .any(|p| unsafe { !(*p).cols.is_null() })
    }) {
        return Err(first.refuse("column privileges are not carried to the shards yet"));
    }
    let mut before = Vec::new();
    for table in &tables {
        table.refuse_during_job()?;
        before.push(TableShape::load(table.relid)?.grantees());
    }
    Ok(Some(Planned::new(Local::Run, move || {
        for (table, before) in tables.iter().zip(before) {
            carry_privileges(table.relid, before)?;
        }
        for &table in &followed {
            follow(table, &lookups_before)?;
        }
        Ok(())
    })))
}

/// A table with lookups has its privileges set by its owner (or a
/// superuser): its lookups' follow, and only the owner may set those.
fn refuse_unless_owner_of_lookups(relid: pg_sys::Oid) -> Result<()> {
    if crate::lookups::catalog::lookups_of(relid)?.is_empty() {
        return Ok(());
    }
    crate::access::require_table_owner(relid, &crate::spi::caller_relation_name(relid))
}

fn lookup_refusal(table: &LogicalTable) -> crate::error::ShardError {
    table.refuse(
        "it is a lookup table, whose owner and privileges follow its table's: \
         GRANT, REVOKE or OWNER TO on the table itself",
    )
}

/// Gives the shards of `relid` its privileges as they are now, revoked
/// first from those it had (`before`) and has.
fn carry_privileges(relid: pg_sys::Oid, before: Vec<String>) -> Result<()> {
    let shape = TableShape::load(relid)?;
    let mut grantees = before;
    grantees.extend(shape.grantees());
    grantees.sort();
    grantees.dedup();
    on_shards_in_transaction(relid, |shard| {
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
    })
}

/// Gives the lookup tables of table `relid`, and their shards, the table's
/// owner and the privileges its own imply: SELECT to those who may read
/// or write it (reads find rows through the lookup, writes check and
/// change entries), INSERT, UPDATE and DELETE to those who may write it,
/// TRUNCATE to those who may truncate it. No grant options: the lookup's
/// privileges are not the grantees' to pass on.
pub(crate) fn lookups_follow(relid: pg_sys::Oid) -> Result<()> {
    follow(relid, &[])
}

/// [`lookups_follow`], revoking on the lookups' shards from `earlier`
/// grantees too.
fn follow(relid: pg_sys::Oid, earlier: &[String]) -> Result<()> {
    for lookup in crate::lookups::catalog::lookups_of(relid)? {
        // (Its own shard group: a move or split of it would miss the
        // privileges on its new shards.)
        if let Some(table) = LogicalTable::of(lookup.lookup_rel)? {
            table.refuse_during_job()?;
        }
        let (owner, owner_changes, grants) = crate::spi::connect(|client| {
            let row = client
                .select(
                    "SELECT pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(t.relowner)), \
                            t.relowner <> l.relowner \
                     FROM pg_catalog.pg_class t, pg_catalog.pg_class l \
                     WHERE t.oid = $1 AND l.oid = $2",
                    Some(1),
                    &[relid.into(), lookup.lookup_rel.into()],
                )?
                .first();
            let owner = row.get::<String>(1)?.unwrap_or_default();
            let owner_changes = row.get::<bool>(2)?.unwrap_or(true);
            let mut grants = Vec::new();
            for row in client.select(
                "SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' \
                             ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(a.grantee)) \
                        END, \
                        pg_catalog.bool_or(a.privilege_type IN ('INSERT', 'UPDATE', 'DELETE')), \
                        pg_catalog.bool_or(a.privilege_type = 'SELECT'), \
                        pg_catalog.bool_or(a.privilege_type = 'TRUNCATE') \
                 FROM pg_catalog.pg_class c, \
                      pg_catalog.aclexplode(coalesce(c.relacl, \
                                                     pg_catalog.acldefault('r', c.relowner))) a \
                 WHERE c.oid = $1 AND a.grantee <> c.relowner GROUP BY 1 ORDER BY 1",
                None,
                &[relid.into()],
            )? {
                let grantee = row.get::<String>(1)?.unwrap_or_default();
                let writes = row.get::<bool>(2)?.unwrap_or(false);
                let reads = row.get::<bool>(3)?.unwrap_or(false);
                let truncates = row.get::<bool>(4)?.unwrap_or(false);
                let mut privileges = Vec::new();
                if reads || writes {
                    privileges.push("SELECT");
                }
                if writes {
                    privileges.extend(["INSERT", "UPDATE", "DELETE"]);
                }
                if truncates {
                    privileges.push("TRUNCATE");
                }
                if !privileges.is_empty() {
                    grants.push((grantee, privileges.join(", ")));
                }
            }
            Ok::<_, crate::error::ShardError>((owner, owner_changes, grants))
        })?;
        let (schema, name) = crate::spi::schema_and_name(lookup.lookup_rel)?;
        let target = quote::qualified(&schema, &name);
        // (Only a change of owner: ALTER … OWNER TO is for the owner, and a
        // GRANT may come from a role granted the table WITH GRANT OPTION.)
        if owner_changes {
            super::internal::run_internal(&format!("ALTER TABLE {target} OWNER TO {owner}"))?;
            carry_owner(lookup.lookup_rel)?;
        }
        // The owner keeps its own privileges: the others' are set again.
        let before: Vec<String> = TableShape::load(lookup.lookup_rel)?
            .grantees()
            .into_iter()
            .filter(|grantee| *grantee != owner)
            .collect();
        let mut sql = Vec::new();
        if !before.is_empty() {
            sql.push(format!("REVOKE ALL ON {target} FROM {}", before.join(", ")));
        }
        for (grantee, privileges) in &grants {
            sql.push(format!("GRANT {privileges} ON {target} TO {grantee}"));
        }
        for statement in sql {
            super::internal::run_internal(&statement)?;
        }
        let mut revoked = before;
        revoked.extend(earlier.iter().filter(|g| **g != owner).cloned());
        carry_privileges(lookup.lookup_rel, revoked)?;
    }
    Ok(())
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
    // (ALTER TABLE of a lookup table is refused before: `columns`.)
    table.refuse_during_job()?;
    Ok(Planned::new(Local::Run, move || {
        carry_owner(table.relid)?;
        lookups_follow(table.relid)
    }))
}

/// Gives the foreign partitions and the shards of `relid` its owner.
fn carry_owner(relid: pg_sys::Oid) -> Result<()> {
    let shape = TableShape::load(relid)?;
    let partitions = crate::spi::connect(|client| {
        let mut partitions = Vec::new();
        for row in client.select(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = $1 \
             ORDER BY 1",
            None,
            &[relid.into()],
        )? {
            partitions.push(row.get::<String>(1)?.unwrap_or_default());
        }
        Ok::<_, crate::error::ShardError>(partitions)
    })?;
    for partition in partitions {
        super::internal::run_internal(&shape.owner_sql(&partition))?;
    }
    on_shards_in_transaction(relid, |shard| vec![shape.owner_sql(&shard.qualified)])
}
