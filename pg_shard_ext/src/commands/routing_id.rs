//! `pg_shard.set_routing_id(table, column)`: declare that a column holds
//! ids made by `pg_shard.next_id` for the row's key, so that `column =
//! value` is routed by the prefix the id carries (coordinator and planner
//! hook) instead of scattered.
//!
//! Routing by prefix is exact only while every prefix lies in one shard:
//! the table's co-location group must have shard boundaries at multiples of
//! 2^54, and splits of such a group keep them there (pg_shard.queue_job).
//! The shards check every row: a CHECK constraint says that the id's prefix
//! is its key's, so a row whose id would route elsewhere is refused rather
//! than lost to reads by id.

use crate::error::{OrReport, Result, ShardError};
use crate::metadata::LogicalTable;
use crate::quote;
use pgrx::prelude::*;

/// Called by `pg_shard.set_routing_id(table regclass, column name)`
/// (sql/pg_shard_api.sql). NULL `column` removes the declaration.
#[pg_extern(schema = "pg_shard")]
fn set_routing_id_internal(table: pg_sys::Oid, column: Option<&str>) {
    set_routing_id(table, column).or_report()
}

fn set_routing_id(relid: pg_sys::Oid, column: Option<&str>) -> Result<()> {
    let table = LogicalTable::of(relid)?
        .filter(LogicalTable::is_distributed)
        .ok_or_else(|| ShardError::NotDistributed(crate::spi::caller_relation_name(relid)))?;
    table.require_owner()?;
    table.lock(pg_sys::ShareUpdateExclusiveLock);
    // A split queued meanwhile (pg_shard.queue_job takes this lock before
    // it checks split points) is seen here, or sees this declaration.
    crate::spi::run_with_args(
        "SELECT pg_catalog.pg_advisory_xact_lock(pg_catalog.hashtext('pg_shard co-location'), $1)",
        &[table.colocation_id.into()],
    )?;
    table.refuse_during_job()?;
    let current = declared_column(relid)?;
    match column {
        None => {
            if current.is_some() {
                drop_checks(&table)?;
            }
            record(relid, None)
        }
        Some(column) => {
            let attnum = check_column(&table, column)?;
            if current == Some(attnum) {
                notice!(
                    "column \"{column}\" of {} already holds routing ids",
                    table.display
                );
                return Ok(());
            }
            check_aligned(&table)?;
            if current.is_some() {
                drop_checks(&table)?;
            }
            add_check(&table, column)?;
            record(relid, Some(attnum))
        }
    }
}

/// The routing column (attribute number) recorded for the table.
fn declared_column(relid: pg_sys::Oid) -> Result<Option<i16>> {
    crate::spi::query_one::<i16>(
        "SELECT routing_attnum FROM pg_shard.logical_table WHERE table_rel = $1",
        &[relid.into()],
    )
}

/// The column's attribute number, if it can hold routing ids: a bigint
/// that is not the distribution column.
fn check_column(table: &LogicalTable, column: &str) -> Result<i16> {
    let found = crate::spi::connect(|client| {
        let rows = client.select(
            "SELECT a.attnum, 'pg_catalog.int8'::pg_catalog.regtype = \
                    CASE t.typtype WHEN 'd' THEN t.typbasetype ELSE t.oid END \
             FROM pg_catalog.pg_attribute a JOIN pg_catalog.pg_type t ON t.oid = a.atttypid \
             WHERE a.attrelid = $1 AND a.attname = $2 AND a.attnum > 0 AND NOT a.attisdropped",
            Some(1),
            &[table.relid.into(), column.into()],
        )?;
        let Some(row) = rows.into_iter().next() else {
            return Ok::<_, ShardError>(None);
        };
        Ok(Some((
            row.get::<i16>(1)?.unwrap_or_default(),
            row.get::<bool>(2)?.unwrap_or(false),
        )))
    })?;
    let Some((attnum, is_bigint)) = found else {
        return Err(ShardError::UnknownColumn {
            table: table.display.clone(),
            column: column.into(),
        });
    };
    if table.dist_column.as_deref() == Some(column) {
        return Err(ShardError::InvalidArgument(format!(
            "\"{column}\" is the distribution column of {}: it routes already",
            table.display
        )));
    }
    if !is_bigint {
        return Err(ShardError::InvalidArgument(format!(
            "column \"{column}\" of {} must be bigint to hold routing ids",
            table.display
        )));
    }
    Ok(attnum)
}

/// Every shard boundary of the table's co-location group is a multiple of
/// 2^54 (the keyspace ids are stored with their top bit flipped, which
/// keeps the low 54 bits).
fn check_aligned(table: &LogicalTable) -> Result<()> {
    let unaligned = crate::spi::query_one::<i64>(
        "SELECT range_start FROM pg_shard.shard_group \
         WHERE colocation_id = $1 AND range_start % 18014398509481984 <> 0 \
         ORDER BY range_start LIMIT 1",
        &[table.colocation_id.into()],
    )?;
    match unaligned {
        None => Ok(()),
        Some(start) => Err(ShardError::UnalignedRanges(format!(
            "cannot route {} by id: a shard of its co-location group starts at keyspace id \
             {start}, which is not a multiple of 2^54, so an id's prefix could name two shards",
            table.display
        ))),
    }
}

fn check_name(table: &LogicalTable, column: &str) -> Result<String> {
    let relname = crate::spi::query_one::<String>(
        "SELECT relname::text FROM pg_catalog.pg_class WHERE oid = $1",
        &[table.relid.into()],
    )?
    .unwrap_or_default();
    // (Truncated as PostgreSQL truncates names, on a character boundary.)
    let mut name = format!("{relname}_{column}_routes");
    while name.len() > 63 {
        name.pop();
    }
    Ok(name)
}

/// Adds the CHECK through ALTER TABLE, which carries it to every shard and
/// validates the rows there.
fn add_check(table: &LogicalTable, column: &str) -> Result<()> {
    let dist = table.dist_column.as_deref().unwrap_or_default();
    let sql = format!(
        "ALTER TABLE {} ADD CONSTRAINT {} CHECK (pg_shard.id_prefix({}) = pg_shard.key_prefix({}))",
        qualified_name(table)?,
        quote::ident(&check_name(table, column)?),
        quote::ident(column),
        quote::ident(dist),
    );
    crate::spi::run(&sql)?;
    Ok(())
}

/// Drops the CHECK that set_routing_id added for the recorded column
/// (found by its definition: a rename of the table or column leaves its
/// name behind).
fn drop_checks(table: &LogicalTable) -> Result<()> {
    let names = crate::spi::connect(|client| {
        let mut names = Vec::new();
        for row in client.select(
            "SELECT c.name::text FROM pg_shard.table_constraint c \
             JOIN pg_shard.logical_table t ON t.table_rel = c.table_rel \
             JOIN pg_catalog.pg_attribute a \
               ON a.attrelid = t.table_rel AND a.attnum = t.routing_attnum \
             WHERE c.table_rel = $1 AND c.kind = 'c' \
               AND c.definition = pg_catalog.format( \
                   'CHECK ((pg_shard.id_prefix(%s) = pg_shard.key_prefix(%s)))', \
                   pg_catalog.quote_ident(a.attname), pg_catalog.quote_ident(t.dist_column))",
            None,
            &[table.relid.into()],
        )? {
            names.push(row.get::<String>(1)?.unwrap_or_default());
        }
        Ok::<_, ShardError>(names)
    })?;
    for name in names {
        crate::spi::run(&format!(
            "ALTER TABLE {} DROP CONSTRAINT {}",
            qualified_name(table)?,
            quote::ident(&name),
        ))?;
    }
    Ok(())
}

fn qualified_name(table: &LogicalTable) -> Result<String> {
    let (schema, name) = crate::spi::schema_and_name(table.relid)?;
    Ok(quote::qualified(&schema, &name))
}

/// Records the column (or none) and tells the routers: a new map version,
/// and a relcache invalidation for the planner hooks of this node.
fn record(relid: pg_sys::Oid, attnum: Option<i16>) -> Result<()> {
    crate::metadata::catalog::write(
        "UPDATE pg_shard.logical_table SET routing_attnum = $2 WHERE table_rel = $1",
        &[relid.into(), attnum.into()],
    )?;
    crate::metadata::catalog::bump_map_version()?;
    // SAFETY: queues a relcache invalidation of an existing relation, sent at commit.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(relid) };
    Ok(())
}
