//! `pg_shard.create_lookup(table, column, unique)` and
//! `pg_shard.drop_lookup(table, column)`: a lookup table for a column of a
//! distributed table ([`crate::lookups`]).
//!
//! Creating one, in one distributed transaction: the lookup table
//! `<table>_<column>_lookup` (value, keyspace_id, rows), distributed by its
//! value with the table's shard count; on every shard of the table, the
//! triggers that record changes, and the shard's epoch raised to the new
//! map version, so that a router that does not know of the lookup yet is
//! refused (PS001) and learns of it; then the lookup is filled from the
//! shards' rows. The triggers' DDL locks each shard against writes until
//! the end, so nothing written meanwhile is missed.

use crate::error::{OrReport, Result, ShardError};
use crate::keyspace::key_encoding_of;
use crate::lookups::apply::{self, Change};
use crate::lookups::catalog::{self, Lookup};
use crate::metadata::LogicalTable;
use crate::quote;
use crate::transaction::remote::{in_transaction, run_in_transaction, scripts_by_node};
use crate::worker::lookup_changes::{trigger_ddl, trigger_names};
use pgrx::prelude::*;

/// Called by `pg_shard.create_lookup` (sql/pg_shard_api.sql): the lookup table.
#[pg_extern(schema = "pg_shard")]
fn create_lookup_internal(table: pg_sys::Oid, column: &str, unique: bool) -> pg_sys::Oid {
    crate::access::require_granted("pg_shard.create_lookup(regclass, name, boolean)").or_report();
    create_lookup(table, column, unique).or_report()
}

/// Called by `pg_shard.drop_lookup`.
#[pg_extern(schema = "pg_shard")]
fn drop_lookup_internal(table: pg_sys::Oid, column: &str) {
    crate::access::require_granted("pg_shard.drop_lookup(regclass, name)").or_report();
    drop_lookup(table, column).or_report()
}

/// The distributed table `relid`, owned by the caller, locked against
/// writes through this node and changes of its lookups, with no job on it.
fn base_table(relid: pg_sys::Oid) -> Result<LogicalTable> {
    let table = LogicalTable::of(relid)?
        .filter(LogicalTable::is_distributed)
        .ok_or_else(|| ShardError::NotDistributed(crate::spi::caller_relation_name(relid)))?;
    table.require_owner()?;
    table.lock(pg_sys::ShareRowExclusiveLock);
    crate::commands::distribute::require_read_committed()?;
    // A move or split queued meanwhile (pg_shard.queue_job takes this lock)
    // is seen here, or sees the lookup when it makes its new shards.
    crate::spi::run_with_args(
        "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pg_shard co-location'), $1)",
        &[table.colocation_id.into()],
    )?;
    table.refuse_during_job()?;
    if catalog::is_lookup_table(relid)? {
        return Err(ShardError::InvalidArgument(format!(
            "{} is a lookup table: pg_shard writes it",
            table.display
        )));
    }
    Ok(table)
}

/// What a lookup needs of its column.
struct ColumnInfo {
    attnum: i16,
    type_oid: pg_sys::Oid,
    /// Its collation compares equal only equal bytes.
    deterministic: bool,
    /// Type (and collation) as a column definition spells it.
    definition: String,
}

fn column_info(table: &LogicalTable, column: &str) -> Result<ColumnInfo> {
    let found = crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT a.attnum, a.atttypid, \
                    pg_catalog.format_type(a.atttypid, a.atttypmod) || \
                    CASE WHEN a.attcollation IN (0, 100) THEN '' \
                         ELSE ' COLLATE ' || pg_catalog.quote_ident(n.nspname) || '.' \
                              || pg_catalog.quote_ident(c.collname) END, \
                    coalesce(c.collisdeterministic, true) \
             FROM pg_catalog.pg_attribute a \
             LEFT JOIN pg_catalog.pg_collation c ON c.oid = a.attcollation \
             LEFT JOIN pg_catalog.pg_namespace n ON n.oid = c.collnamespace \
             WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            Some(1),
            &[table.relid.into(), column.into()],
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Ok::<_, ShardError>(None);
        };
        Ok(Some(ColumnInfo {
            attnum: row.get::<i16>(1)?.unwrap_or_default(),
            type_oid: row.get::<pg_sys::Oid>(2)?.unwrap_or_default(),
            definition: row.get::<String>(3)?.unwrap_or_default(),
            deterministic: row.get::<bool>(4)?.unwrap_or(true),
        }))
    })?;
    found.ok_or_else(|| ShardError::UnknownColumn {
        table: table.display.clone(),
        column: column.into(),
    })
}

fn create_lookup(relid: pg_sys::Oid, column: &str, unique: bool) -> Result<pg_sys::Oid> {
    let table = base_table(relid)?;
    let key = table.dist_column.clone().unwrap_or_default();
    if key == column {
        return Err(ShardError::InvalidArgument(format!(
            "\"{column}\" is the distribution column of {}: its rows are found by it already",
            table.display
        )));
    }
    let info = column_info(&table, column)?;
    if key_encoding_of(info.type_oid).is_none() {
        return Err(ShardError::InvalidArgument(format!(
            "column \"{column}\" of {} has type {}, which a lookup table cannot be distributed by",
            table.display,
            crate::keyspace::type_name(info.type_oid)
        )));
    }
    if !info.deterministic {
        return Err(ShardError::InvalidArgument(format!(
            "column \"{column}\" of {} has a nondeterministic collation: values it calls equal \
             would hash apart",
            table.display
        )));
    }
    // Rows a foreign key's action changes (a DELETE of the referenced row)
    // change on the shards without a router that keeps the lookup.
    if let Some(key) = crate::spi::query_one::<String>(
        "SELECT name::text FROM pg_shard.table_constraint \
         WHERE table_rel = $1 AND kind = 'f' \
           AND definition ~ 'ON (DELETE|UPDATE) (CASCADE|SET NULL|SET DEFAULT)' LIMIT 1",
        &[relid.into()],
    )? {
        return Err(ShardError::InvalidArgument(format!(
            "foreign key \"{key}\" of {} changes its rows by itself (ON DELETE / ON UPDATE \
             CASCADE, SET NULL or SET DEFAULT), which a lookup could not follow",
            table.display
        )));
    }
    if let Some(existing) = catalog::lookups_of(relid)?
        .into_iter()
        .find(|l| l.column == column)
    {
        return Err(ShardError::InvalidArgument(format!(
            "column \"{column}\" of {} has a lookup already: {}",
            table.display, existing.display
        )));
    }
    let lookup_rel = create_lookup_table(&table, column, &info, unique)?;
    let lookup_id = crate::metadata::catalog::write_returning::<i32>(
        "INSERT INTO pg_shard.lookup (table_rel, column_attnum, lookup_rel, is_unique) \
         VALUES ($1, $2, $3, $4) RETURNING lookup_id",
        &[
            relid.into(),
            info.attnum.into(),
            lookup_rel.into(),
            unique.into(),
        ],
    )?
    .ok_or_else(|| ShardError::Internal("the lookup's catalog row was not written".into()))?;
    let version = crate::metadata::catalog::bump_map_version()?;
    crate::metadata::shard_lookup::at_version(version);
    catalog::forget_cache();
    let lookup = catalog::by_id(lookup_id)?;
    for shard in crate::transaction::fan_out::shard_tables(relid)? {
        let mut script = trigger_ddl(&shard.qualified, lookup_id, column, &key);
        script.push(format!(
            "UPDATE pg_shard.local_shard SET epoch = greatest(epoch, {version}) \
             WHERE shard_id = {}",
            shard.shard_id
        ));
        let changes = in_transaction(&shard.node, |connection| {
            connection
                .execute(&script.join(";\n"))
                .map_err(ShardError::into_node_failure)?;
            if !shard.active {
                return Ok(Vec::new());
            }
            existing_rows(connection, &lookup, &shard.qualified, column, &key)
        })?;
        // (After the shard's own work: the lookup's shards may be on the
        // same node, in the same remote transaction.)
        apply::apply(changes, version)?;
    }
    crate::commands::ddl::lookups_follow(relid)?;
    invalidate(relid);
    Ok(lookup_rel)
}

/// The lookup table, made and distributed by its value with the base
/// table's shard count (a group of its own).
fn create_lookup_table(
    table: &LogicalTable,
    column: &str,
    info: &ColumnInfo,
    unique: bool,
) -> Result<pg_sys::Oid> {
    let (schema, relname) = crate::spi::schema_and_name(table.relid)?;
    let mut name = format!("{relname}_{column}_lookup");
    while name.len() > 63 {
        name.pop();
    }
    let qualified = quote::qualified(&schema, &name);
    let exists = crate::spi::query_one::<bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_class c \
                        JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                        WHERE n.nspname = $1 AND c.relname = $2)",
        &[schema.as_str().into(), name.as_str().into()],
    )?
    .unwrap_or(false);
    if exists {
        return Err(ShardError::RelationExists(qualified));
    }
    let primary_key = if unique {
        "value"
    } else {
        "value, keyspace_id"
    };
    crate::spi::under_safe_path(|| {
        crate::spi::run(&format!(
            "CREATE TABLE {qualified} (value {} NOT NULL, keyspace_id bigint NOT NULL, \
             rows bigint NOT NULL DEFAULT 1, PRIMARY KEY ({primary_key}))",
            info.definition
        ))
    })?;
    let relation_now = || {
        crate::spi::query_one::<pg_sys::Oid>(
            "SELECT c.oid FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relname = $2",
            &[schema.as_str().into(), name.as_str().into()],
        )?
        .ok_or_else(|| ShardError::Internal(format!("{qualified} was not created")))
    };
    let shard_count = crate::spi::query_one::<i32>(
        "SELECT shard_count FROM pg_shard.colocation_group WHERE colocation_id = $1",
        &[table.colocation_id.into()],
    )?;
    crate::commands::distribute::distribute_own_group(relation_now()?, "value", shard_count)?;
    // (Distributing replaces the table with a partitioned one.)
    relation_now()
}

/// The lookup entries of a shard's rows, counted per value and key.
fn existing_rows(
    connection: &mut crate::transaction::connection::NodeConnection,
    lookup: &Lookup,
    shard: &str,
    column: &str,
    key: &str,
) -> Result<Vec<Change>> {
    let (value, key) = (quote::ident(column), quote::ident(key));
    let mut changes = Vec::new();
    let mut damaged = false;
    connection.for_each_row(
        &format!(
            "SELECT {value}::text, pg_shard.keyspace_id({value}), pg_shard.keyspace_id({key}), \
                    count(*) \
             FROM {shard} WHERE {value} IS NOT NULL AND {key} IS NOT NULL GROUP BY 1, 2, 3"
        ),
        &[],
        &[],
        |row| {
            let number = |i: usize| row.text(i).and_then(|t| t.parse::<i64>().ok());
            match (row.text(0), number(1), number(2), number(3)) {
                (Some(text), Some(value_id), Some(key_id), Some(delta)) => changes.push(Change {
                    lookup_id: lookup.lookup_id,
                    delta,
                    value: text,
                    value_id,
                    key_id,
                }),
                _ => damaged = true,
            }
            Ok(())
        },
    )?;
    if damaged {
        return Err(ShardError::Internal(
            "a shard returned a damaged row while the lookup was filled".into(),
        ));
    }
    Ok(changes)
}

fn drop_lookup(relid: pg_sys::Oid, column: &str) -> Result<()> {
    let table = base_table(relid)?;
    let Some(lookup) = catalog::lookups_of(relid)?
        .into_iter()
        .find(|l| l.column == column)
    else {
        return Err(ShardError::InvalidArgument(format!(
            "column \"{column}\" of {} has no lookup",
            table.display
        )));
    };
    let pieces = crate::transaction::fan_out::shard_tables(relid)?
        .into_iter()
        .map(|shard| {
            let drops: Vec<String> = trigger_names(lookup.lookup_id)
                .iter()
                .map(|name| format!("DROP TRIGGER IF EXISTS {name} ON {}", shard.qualified))
                .collect();
            (shard.node, drops.join(";\n"))
        });
    for (node, script) in scripts_by_node(pieces) {
        run_in_transaction(&node, &script)?;
    }
    crate::metadata::catalog::write(
        "DELETE FROM pg_shard.lookup WHERE lookup_id = $1",
        &[lookup.lookup_id.into()],
    )?;
    crate::metadata::catalog::bump_map_version()?;
    catalog::forget_cache();
    let (schema, name) = crate::spi::schema_and_name(lookup.lookup_rel)?;
    crate::spi::under_safe_path(|| {
        crate::spi::run(&format!("DROP TABLE {}", quote::qualified(&schema, &name)))
    })?;
    invalidate(relid);
    Ok(())
}

/// The lookups of `relid` as the catalog names them after a column was
/// renamed in this transaction.
pub(crate) fn lookups_after_rename(relid: pg_sys::Oid) -> Result<Vec<Lookup>> {
    catalog::forget_cache();
    catalog::lookups_of(relid)
}

/// The statements that make `lookups`' triggers on a shard table again
/// (their arguments name the looked-up column and the key `key`).
pub(crate) fn trigger_script(lookups: &[Lookup], qualified_shard: &str, key: &str) -> Vec<String> {
    let mut script = Vec::new();
    for lookup in lookups {
        for name in trigger_names(lookup.lookup_id) {
            script.push(format!(
                "DROP TRIGGER IF EXISTS {name} ON {qualified_shard}"
            ));
        }
        script.extend(trigger_ddl(
            qualified_shard,
            lookup.lookup_id,
            &lookup.column,
            key,
        ));
    }
    script
}

/// Plans of this node that write the table are made again.
fn invalidate(relid: pg_sys::Oid) {
    // SAFETY: queues a relcache invalidation of an existing relation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
}
