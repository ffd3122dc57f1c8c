//! Foreign keys of distributed tables: to a co-located distributed table on
//! the distribution column, or to a reference table. Each shard table gets
//! the key to the referenced table's shard on its own node — the co-located
//! shard of the same range, or the node's copy of the reference table — so
//! every check stays on one node. The metadata node's table cannot hold the
//! key (its partitions are foreign tables); `pg_shard.table_constraint`
//! records it. Moves and splits carry the keys with the shards.
//!
//! Refused before anything changes: a key to a distributed table that is
//! not co-located or does not match the distribution columns (rows and the
//! rows they reference would live on different nodes), to an ordinary
//! table, and keys from reference tables (not carried yet).

use super::parse::{logical_table_named, string_list as names};
use super::plan::{Local, Planned};
use crate::error::{Result, ShardError};
use crate::metadata::LogicalTable;
use crate::quote;
use crate::spi::query_one;
use crate::transaction::fan_out::on_shards_in_transaction;
use pgrx::prelude::*;
use std::collections::HashMap;
use std::ffi::{CStr, CString};

/// The plan for an ALTER TABLE that adds, drops or validates a foreign key
/// of a distributed table, or None when the statement touches none.
///
/// # Safety
/// `cmds` are the statement's AlterTableCmd nodes.
pub(super) unsafe fn plan(
    table: &LogicalTable,
    cmds: &pgrx::PgList<pg_sys::AlterTableCmd>,
) -> Result<Option<Planned>> {
    use pg_sys::AlterTableType as T;
    let mut actions = Vec::new();
    for cmd in cmds.iter_ptr() {
        // SAFETY: an AlterTableCmd of the list.
        let cmd = unsafe { &*cmd };
        match cmd.subtype {
            T::AT_AddConstraint if !cmd.def.is_null() => {
                let constraint = cmd.def as *mut pg_sys::Constraint;
                // SAFETY: ADD CONSTRAINT's definition is a Constraint node.
                if unsafe { (*constraint).contype } == pg_sys::ConstrType::CONSTR_FOREIGN {
                    actions.push(Action::Add(constraint));
                }
            }
            T::AT_DropConstraint | T::AT_ValidateConstraint if !cmd.name.is_null() => {
                // SAFETY: the constraint's name in the parse tree.
                let name = unsafe { super::parse::text_of(cmd.name) };
                if recorded(table.relid, &name)?.is_some() || local_key(table.relid, &name)? {
                    actions.push(if cmd.subtype == T::AT_DropConstraint {
                        Action::Drop(name)
                    } else {
                        Action::Validate(name)
                    });
                }
            }
            _ => {}
        }
    }
    let Some(action) = actions.pop() else {
        return Ok(None);
    };
    if cmds.len() > 1 {
        return Err(table
            .refuse("add, drop or validate a foreign key in an ALTER TABLE statement of its own"));
    }
    table.refuse_during_job()?;
    if !table.is_distributed() {
        // SAFETY: the statement's Constraint node, if it adds one.
        return unsafe { plan_reference(table, action) }.map(Some);
    }
    table.require_owner()?;
    table.lock(pg_sys::ShareRowExclusiveLock);
    let relid = table.relid;
    match action {
        // SAFETY: the statement's Constraint node.
        Action::Add(constraint) => unsafe { plan_add(table, &*constraint) }.map(Some),
        Action::Drop(name) => Ok(Some(Planned::new(Local::Skip, move || {
            forget(relid, &name)?;
            on_shards_in_transaction(relid, |shard| {
                vec![format!(
                    "ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}",
                    shard.qualified,
                    quote::ident(&name)
                )]
            })
        }))),
        Action::Validate(name) => Ok(Some(Planned::new(Local::Skip, move || {
            crate::spi::run_with_args(
                "UPDATE pg_shard.table_constraint \
                 SET definition = regexp_replace(definition, ' NOT VALID$', '') \
                 WHERE table_rel = $1 AND name = $2",
                &[relid.into(), name.as_str().into()],
            )?;
            on_shards_in_transaction(relid, |shard| {
                vec![format!(
                    "ALTER TABLE {} VALIDATE CONSTRAINT {}",
                    shard.qualified,
                    quote::ident(&name)
                )]
            })
        }))),
    }
}

enum Action {
    Add(*mut pg_sys::Constraint),
    Drop(String),
    Validate(String),
}

/// Whether the metadata node's table (a reference table) has foreign key
/// `name`.
fn local_key(relid: pg_sys::Oid, name: &str) -> Result<bool> {
    Ok(query_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_constraint \
                        WHERE conrelid = $1 AND conname = $2 AND contype = 'f')",
        &[relid.into(), name.into()],
    )?
    .unwrap_or(false))
}

/// A reference table's foreign key (to another reference table): the
/// metadata node's table runs the statement, and each copy follows with
/// the key to the referenced table's copy on its node.
///
/// # Safety
/// An `Action::Add`'s pointer is the statement's Constraint node.
unsafe fn plan_reference(table: &LogicalTable, action: Action) -> Result<Planned> {
    let relid = table.relid;
    match action {
        Action::Add(constraint) => {
            // SAFETY: the caller's Constraint node.
            let referenced = unsafe { logical_table_named((*constraint).pktable)? };
            if referenced.as_ref().is_none_or(|r| r.is_distributed()) {
                return Err(table.refuse(
                    "a reference table's foreign key can only reference another reference table",
                ));
            }
            let before = local_keys(relid)?;
            Ok(Planned::new(Local::Run, move || {
                let added: Vec<(String, String)> = local_keys(relid)?
                    .into_iter()
                    .filter(|(name, _)| !before.iter().any(|(old, _)| old == name))
                    .collect();
                let copies = copy_names()?;
                on_shards_in_transaction(relid, |shard| {
                    added
                        .iter()
                        .map(|(name, definition)| {
                            format!(
                                "ALTER TABLE {} ADD CONSTRAINT {} {}",
                                shard.qualified,
                                quote::ident(name),
                                references_copies(definition, &copies)
                            )
                        })
                        .collect()
                })
            }))
        }
        Action::Drop(name) => Ok(Planned::new(Local::Run, move || {
            on_shards_in_transaction(relid, |shard| {
                vec![format!(
                    "ALTER TABLE {} DROP CONSTRAINT IF EXISTS {}",
                    shard.qualified,
                    quote::ident(&name)
                )]
            })
        })),
        Action::Validate(name) => Ok(Planned::new(Local::Run, move || {
            on_shards_in_transaction(relid, |shard| {
                vec![format!(
                    "ALTER TABLE {} VALIDATE CONSTRAINT {}",
                    shard.qualified,
                    quote::ident(&name)
                )]
            })
        })),
    }
}

/// A table's foreign keys on the metadata node: (name, definition with
/// qualified names).
fn local_keys(relid: pg_sys::Oid) -> Result<Vec<(String, String)>> {
    crate::settings::with_settings(crate::settings::QUALIFIED_NAMES, || {
        crate::spi::connect(|client| {
            let mut keys = Vec::new();
            for row in client.select(
                "SELECT conname::text, pg_get_constraintdef(oid) FROM pg_constraint \
                 WHERE conrelid = $1 AND contype = 'f' ORDER BY conname",
                None,
                &[relid.into()],
            )? {
                keys.push((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?.unwrap_or_default(),
                ));
            }
            Ok(keys)
        })
    })
}

/// Every reference table's name as pg_get_constraintdef prints it (search
/// path pg_catalog), with the qualified name of its copies (the same on
/// every node).
pub(crate) fn copy_names() -> Result<Vec<(String, String)>> {
    crate::settings::with_settings(crate::settings::QUALIFIED_NAMES, || {
        crate::spi::connect(|client| {
            let mut names = Vec::new();
            for row in client.select(
                "SELECT t.table_rel::text, format('%I.%I', s.shard_schema, s.shard_name) \
                 FROM pg_shard.logical_table t JOIN pg_shard.shard s USING (table_rel) \
                 WHERE t.kind = 'reference'",
                None,
                &[],
            )? {
                names.push((
                    row.get::<String>(1)?.unwrap_or_default(),
                    row.get::<String>(2)?.unwrap_or_default(),
                ));
            }
            Ok(names)
        })
    })
}

/// A foreign key definition of a reference table with the referenced
/// reference table's copy in its place.
pub(crate) fn references_copies(definition: &str, copies: &[(String, String)]) -> String {
    copies
        .iter()
        .fold(definition.to_string(), |definition, (table, copy)| {
            definition.replace(
                &format!(" REFERENCES {table}("),
                &format!(" REFERENCES {copy}("),
            )
        })
}

/// The recorded definition of the table's foreign key `name`, if any.
fn recorded(relid: pg_sys::Oid, name: &str) -> Result<Option<String>> {
    query_one::<String>(
        "SELECT definition FROM pg_shard.table_constraint \
         WHERE table_rel = $1 AND name = $2 AND kind = 'f'",
        &[relid.into(), name.into()],
    )
}

/// After a column change of distributed table `relid`, the recorded
/// foreign keys from and to it as the shards now have them: a renamed
/// column is renamed in them, and PostgreSQL dropped those on a dropped
/// column. Read from one shard table of the referencing table, in the
/// remote transaction that made the change.
pub(crate) fn refresh_recorded(relid: pg_sys::Oid) -> Result<()> {
    let keys = crate::spi::connect(|client| {
        let mut keys = Vec::new();
        for row in client.select(
            "SELECT c.table_rel::oid, c.name::text, n.node_id, n.host, n.port, \
                    format('%I.%I', s.shard_schema, s.shard_name), \
                    format('%I.%I', rn.nspname, r.relname) \
             FROM pg_shard.table_constraint c \
             JOIN pg_class r ON r.oid = c.referenced_rel \
             JOIN pg_namespace rn ON rn.oid = r.relnamespace \
             JOIN LATERAL (SELECT s.* FROM pg_shard.shard s WHERE s.table_rel = c.table_rel \
                           ORDER BY s.shard_id LIMIT 1) s ON true \
             JOIN pg_shard.placement p ON p.shard_group_id = s.shard_group_id \
             JOIN pg_shard.node n ON n.node_id = p.node_id \
             WHERE c.kind = 'f' AND (c.table_rel = $1 OR c.referenced_rel = $1)",
            None,
            &[relid.into()],
        )? {
            keys.push((
                row.get::<pg_sys::Oid>(1)?.unwrap_or(pg_sys::InvalidOid),
                row.get::<String>(2)?.unwrap_or_default(),
                crate::metadata::Node {
                    node_id: row.get::<i32>(3)?.unwrap_or_default(),
                    host: row.get::<String>(4)?.unwrap_or_default(),
                    port: row.get::<i32>(5)?.unwrap_or_default(),
                },
                row.get::<String>(6)?.unwrap_or_default(),
                row.get::<String>(7)?.unwrap_or_default(),
            ));
        }
        Ok::<_, ShardError>(keys)
    })?;
    for (table, name, node, shard, referenced) in keys {
        // (The remote session's search path is pg_catalog, as when the
        // definition was first printed.)
        let definition = crate::transaction::remote::in_transaction(&node, |client| {
            client
                .query(
                    "SELECT replace(pg_get_constraintdef(k.oid), \
                                    ' REFERENCES ' || k.confrelid::regclass::text || '(', \
                                    ' REFERENCES ' || $3 || '(') \
                     FROM pg_constraint k \
                     WHERE k.conrelid = $1::text::regclass AND k.conname = $2::text AND k.contype = 'f'",
                    &[Some(&shard), Some(&name), Some(&referenced)],
                )
                .map(|rows| rows.into_iter().next().and_then(|row| row.into_iter().next().flatten()))
                .map_err(ShardError::into_node_failure)
        })?;
        match definition {
            Some(definition) => crate::spi::run_with_args(
                "UPDATE pg_shard.table_constraint SET definition = $3 \
                 WHERE table_rel = $1 AND name = $2",
                &[table.into(), name.as_str().into(), definition.into()],
            )?,
            None => forget(table, &name)?,
        }
    }
    Ok(())
}

fn forget(relid: pg_sys::Oid, name: &str) -> Result<()> {
    crate::spi::run_with_args(
        "DELETE FROM pg_shard.table_constraint WHERE table_rel = $1 AND name = $2",
        &[relid.into(), name.into()],
    )?;
    Ok(())
}

/// # Safety
/// `constraint` is the statement's FOREIGN KEY Constraint node.
unsafe fn plan_add(table: &LogicalTable, constraint: &pg_sys::Constraint) -> Result<Planned> {
    // SAFETY: the constraint's referenced table.
    let referenced = unsafe { logical_table_named(constraint.pktable)? }.ok_or_else(|| {
        table.refuse(
            "a distributed table's foreign key must reference a distributed table co-located \
             with it or a reference table",
        )
    })?;
    referenced.refuse_during_job()?;
    referenced.lock(pg_sys::ShareRowExclusiveLock);
    // SAFETY: lists of column names.
    let columns = unsafe { names(constraint.fk_attrs) };
    // SAFETY: as above.
    let mut referenced_columns = unsafe { names(constraint.pk_attrs) };
    if referenced_columns.is_empty() {
        referenced_columns = primary_key_columns(&referenced)?;
    }
    if columns.len() != referenced_columns.len() || columns.is_empty() {
        return Err(
            table.refuse("the foreign key's columns and referenced columns must be as many")
        );
    }
    // SAFETY: the ON DELETE SET NULL/DEFAULT column list.
    if !unsafe { names(constraint.fk_del_set_cols) }.is_empty() {
        return Err(table.refuse(
            "ON DELETE SET NULL/SET DEFAULT with a column list is not supported on distributed tables",
        ));
    }
    if let Some(referenced_dist) = referenced.dist_column.as_deref() {
        let colocated = query_one::<bool>(
            "SELECT a.colocation_id = b.colocation_id FROM pg_shard.logical_table a, \
             pg_shard.logical_table b WHERE a.table_rel = $1 AND b.table_rel = $2",
            &[table.relid.into(), referenced.relid.into()],
        )?
        .unwrap_or(false);
        if !colocated {
            return Err(table.refuse(format!(
                "a foreign key to distributed table {} needs the two tables co-located \
                 (create_distributed_table(…, colocate_with => {})): otherwise rows and the rows \
                 they reference live on different nodes",
                referenced.display,
                quote::literal(&referenced.display)
            )));
        }
        let dist = table.dist_column.as_deref().unwrap_or_default();
        let pairs_dist = columns
            .iter()
            .zip(&referenced_columns)
            .any(|(c, r)| c == dist && r == referenced_dist);
        if !pairs_dist {
            return Err(table.refuse(format!(
                "a foreign key to distributed table {} must map the distribution column \"{dist}\" \
                 to its distribution column \"{referenced_dist}\"",
                referenced.display
            )));
        }
    }
    let name = match constraint.conname.is_null() {
        // SAFETY: the name given in the statement.
        false => unsafe { CStr::from_ptr(constraint.conname) }
            .to_string_lossy()
            .into_owned(),
        true => choose_name(table, &columns)?,
    };
    if recorded(table.relid, &name)?.is_some() {
        return Err(ShardError::InvalidArgument(format!(
            "constraint \"{name}\" for relation {} already exists",
            table.display
        )));
    }
    let clauses = clauses(constraint);
    let column_list = |list: &[String]| {
        list.iter()
            .map(|c| quote::ident(c))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (columns, referenced_columns) = (column_list(&columns), column_list(&referenced_columns));
    let definition = move |target: &str| {
        format!("FOREIGN KEY ({columns}) REFERENCES {target}({referenced_columns}){clauses}")
    };
    let relid = table.relid;
    let referenced_relid = referenced.relid;
    let logical_name = query_one::<String>(
        "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c \
         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
        &[referenced_relid.into()],
    )?
    .unwrap_or_default();
    Ok(Planned::new(Local::Skip, move || {
        crate::metadata::catalog::insert_table_constraint(
            relid,
            'f',
            &name,
            &definition(&logical_name),
            false,
        )?;
        crate::spi::run_with_args(
            "UPDATE pg_shard.table_constraint SET referenced_rel = $3 \
             WHERE table_rel = $1 AND name = $2",
            &[relid.into(), name.as_str().into(), referenced_relid.into()],
        )?;
        let targets = referenced_shards(relid, referenced_relid)?;
        on_shards_in_transaction(relid, |shard| {
            match targets.get(&(shard.shard_id, shard.node.node_id)) {
                Some(target) => vec![format!(
                    "ALTER TABLE {} ADD CONSTRAINT {} {}",
                    shard.qualified,
                    quote::ident(&name),
                    definition(target)
                )],
                None => Vec::new(),
            }
        })
    }))
}

/// MATCH, ON UPDATE / ON DELETE, DEFERRABLE and NOT VALID, as written.
fn clauses(constraint: &pg_sys::Constraint) -> String {
    let action = |code: u8| match code {
        b'r' => Some("RESTRICT"),
        b'c' => Some("CASCADE"),
        b'n' => Some("SET NULL"),
        b'd' => Some("SET DEFAULT"),
        _ => None, // 'a': NO ACTION, the default
    };
    let mut clauses = String::new();
    if constraint.fk_matchtype as u8 == b'f' {
        clauses.push_str(" MATCH FULL");
    }
    if let Some(action) = action(constraint.fk_upd_action as u8) {
        clauses.push_str(&format!(" ON UPDATE {action}"));
    }
    if let Some(action) = action(constraint.fk_del_action as u8) {
        clauses.push_str(&format!(" ON DELETE {action}"));
    }
    if constraint.deferrable {
        clauses.push_str(" DEFERRABLE");
        if constraint.initdeferred {
            clauses.push_str(" INITIALLY DEFERRED");
        }
    }
    if constraint.skip_validation {
        clauses.push_str(" NOT VALID");
    }
    clauses
}

/// The referenced table's primary key columns (REFERENCES table without a
/// column list).
fn primary_key_columns(referenced: &LogicalTable) -> Result<Vec<String>> {
    let definition = if referenced.is_distributed() {
        query_one::<String>(
            "SELECT definition FROM pg_shard.table_constraint WHERE table_rel = $1 AND kind = 'p'",
            &[referenced.relid.into()],
        )?
    } else {
        query_one::<String>(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint \
             WHERE conrelid = $1 AND contype = 'p'",
            &[referenced.relid.into()],
        )?
    };
    let definition = definition.ok_or_else(|| {
        ShardError::InvalidArgument(format!(
            "there is no primary key for referenced table {}",
            referenced.display
        ))
    })?;
    Ok(key_columns(&definition))
}

/// The column names of `PRIMARY KEY (a, "B c")…` as PostgreSQL prints it.
fn key_columns(definition: &str) -> Vec<String> {
    let Some(open) = definition.find('(') else {
        return Vec::new();
    };
    let mut columns = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut chars = definition[open + 1..].chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                chars.next();
                current.push('"');
            }
            '"' => quoted = !quoted,
            ',' if !quoted => columns.push(std::mem::take(&mut current).trim().to_string()),
            ')' if !quoted => break,
            c => current.push(c),
        }
    }
    columns.push(current.trim().to_string());
    columns
}

/// The name PostgreSQL would pick: `table_columns_fkey`, free in the schema.
fn choose_name(table: &LogicalTable, columns: &[String]) -> Result<String> {
    let (relname, namespace) = crate::spi::connect(|client| {
        let row = client
            .select(
                "SELECT relname::text, relnamespace FROM pg_class WHERE oid = $1",
                Some(1),
                &[table.relid.into()],
            )?
            .next()
            .map(|row| Ok::<_, ShardError>((row.get::<String>(1)?, row.get::<pg_sys::Oid>(2)?)))
            .transpose()?;
        Ok::<_, ShardError>(row.unwrap_or((None, None)))
    })?;
    let to_c = |s: &str| CString::new(s.replace('\0', "")).unwrap_or_default();
    let (relname, columns, label) = (
        to_c(&relname.unwrap_or_default()),
        to_c(&columns.join("_")),
        to_c("fkey"),
    );
    // SAFETY: NUL-terminated strings that outlive the call; the result is
    // a palloc'd NUL-terminated name.
    let chosen = unsafe {
        let name = pg_sys::ChooseRelationName(
            relname.as_ptr(),
            columns.as_ptr(),
            label.as_ptr(),
            namespace.unwrap_or(pg_sys::InvalidOid),
            true,
        );
        CStr::from_ptr(name).to_string_lossy().into_owned()
    };
    Ok(chosen)
}

/// For each shard placement of `relid`, keyed by (shard id, node id): the
/// qualified name of the `referenced` table's shard on the same node.
fn referenced_shards(
    relid: pg_sys::Oid,
    referenced: pg_sys::Oid,
) -> Result<HashMap<(i64, i32), String>> {
    crate::spi::connect(|client| {
        let mut targets = HashMap::new();
        for row in client.select(
            "SELECT s.shard_id, p.node_id, format('%I.%I', r.shard_schema, r.shard_name) \
             FROM pg_shard.shard s JOIN pg_shard.placement p USING (shard_group_id) \
             JOIN pg_shard.logical_table rt ON rt.table_rel = $2 \
             JOIN pg_shard.shard r ON r.table_rel = $2 \
              AND (rt.kind = 'reference' OR r.shard_group_id = s.shard_group_id) \
             WHERE s.table_rel = $1",
            None,
            &[relid.into(), referenced.into()],
        )? {
            let key = (
                row.get::<i64>(1)?.unwrap_or_default(),
                row.get::<i32>(2)?.unwrap_or_default(),
            );
            targets.insert(key, row.get::<String>(3)?.unwrap_or_default());
        }
        Ok(targets)
    })
}

#[cfg(test)]
mod tests {
    use super::key_columns;

    #[test]
    fn key_columns_of_printed_definitions() {
        assert_eq!(key_columns("PRIMARY KEY (id)"), vec!["id"]);
        assert_eq!(
            key_columns("PRIMARY KEY (customer_id, \"Order Id\") INCLUDE (x)"),
            vec!["customer_id", "Order Id"]
        );
        assert_eq!(key_columns("PRIMARY KEY (\"a,\"\"b\")"), vec!["a,\"b"]);
    }
}
