//! `pg_shard.undistribute_table(table)`: a distributed or reference table
//! becomes an ordinary table on the metadata node again, with every row.
//!
//! A reference table already holds its rows: it loses its replication
//! triggers and its copies. A distributed table is rebuilt beside its
//! partitioned table — columns and defaults, then every row read through
//! the foreign partitions, then the indexes and constraints its shards
//! carried (`pg_shard.table_constraint`), owner, grants, comments and
//! sequence ownership — and takes its place; dropping the partitioned table
//! drops the shards and the catalog rows, and moves the map on. All in one
//! transaction (the shards are dropped in two-phase remote transactions):
//! it happens completely or not at all.

use crate::error::{OrReport, Result, ShardError};
use crate::quote;
use crate::settings::PORTABLE_TEXT;
use crate::shard_ddl::TableShape;
use crate::transaction::remote::in_transaction;
use pgrx::prelude::*;

/// Called by the SQL function pg_shard.undistribute_table (sql/pg_shard_api.sql).
#[pg_extern(schema = "pg_shard")]
fn undistribute_table_internal(table_oid: pg_sys::Oid) {
    crate::access::require_granted("pg_shard.undistribute_table(regclass)").or_report();
    undistribute(table_oid).or_report()
}

fn undistribute(relid: pg_sys::Oid) -> Result<()> {
    let table = crate::metadata::LogicalTable::of(relid)?
        .ok_or_else(|| ShardError::NotLogicalTable(crate::spi::caller_relation_name(relid)))?;
    table.require_owner()?;
    table.lock(pg_sys::AccessExclusiveLock);
    crate::commands::distribute::require_read_committed()?;
    table.refuse_during_job()?;
    if crate::lookups::catalog::is_lookup_table(relid)? {
        return Err(
            table.refuse("it is a lookup table: drop it with pg_shard.drop_lookup(table, column)")
        );
    }
    if !crate::lookups::catalog::lookups_of(relid)?.is_empty() {
        return Err(
            table.refuse("drop its lookup tables first (pg_shard.drop_lookup(table, column))")
        );
    }
    // (A reference table's keys to and from other reference tables are on
    // the metadata node too.)
    let foreign_keys = crate::spi::query_one::<String>(
        "SELECT string_agg(key, ', ') FROM ( \
           SELECT format('%I (on %s)', name, chr(1) || table_rel::oid::text || chr(1)) AS key \
           FROM pg_shard.table_constraint \
           WHERE kind = 'f' AND (table_rel = $1 OR referenced_rel = $1) \
           UNION ALL \
           SELECT format('%I (on %s)', conname, chr(1) || conrelid::text || chr(1)) FROM pg_constraint \
           WHERE contype = 'f' AND (conrelid = $1 OR confrelid = $1) \
             AND conrelid IN (SELECT table_rel FROM pg_shard.logical_table) \
             AND confrelid IN (SELECT table_rel FROM pg_shard.logical_table)) keys",
        &[relid.into()],
    )?;
    if let Some(foreign_keys) = foreign_keys {
        return Err(table.refuse(format!(
            "drop the foreign keys between it and other distributed or reference tables first: {}",
            crate::spi::caller_names(&foreign_keys)
        )));
    }
    if !table.is_distributed() {
        let qualified = TableShape::load(relid)?.qualified();
        for statement in crate::commands::reference::drop_replication_trigger_ddl(&qualified) {
            crate::commands::ddl::run_internal(&statement)?;
        }
        return crate::commands::drop::drop_shards(&[(relid, table.display.clone())]);
    }

    let shape = TableShape::load(relid)?;
    let new_name = quote::name_with_suffix(&shape.name, "_pg_shard_local");
    let new_table = quote::qualified(&shape.schema, &new_name);
    crate::spi::run(&format!(
        "CREATE TABLE {new_table} ({})",
        shape.column_definitions(true)
    ))?;
    for shard in crate::transaction::fan_out::shard_tables(relid)? {
        copy_rows(&shard, &new_table)?;
    }
    for statement in crate::commands::ddl::recorded_objects_sql(relid, &new_table)? {
        crate::spi::run(&statement)?;
    }
    for statement in crate::metadata::routing_table::carried_over(relid, &new_table)? {
        crate::spi::run(&statement)?;
    }
    // The event trigger drops the shards and the catalog rows.
    crate::spi::run(&format!("DROP TABLE {}", shape.qualified()))?;
    crate::spi::run(&format!(
        "ALTER TABLE {new_table} RENAME TO {}",
        quote::ident(&shape.name)
    ))?;
    Ok(())
}

/// Rows read per round trip.
const BATCH_ROWS: i64 = 5000;

/// Copy a shard table's rows into `target` on the metadata node. The rows
/// are read in the remote transaction that later drops the shard: read
/// through the foreign partitions instead, they would stay locked by
/// postgres_fdw's own transaction, which the DROP would wait for.
fn copy_rows(shard: &crate::transaction::fan_out::ShardTable, target: &str) -> Result<()> {
    let node = &shard.node;
    in_transaction(node, |client| {
        let mut setup = String::new();
        for (name, value) in PORTABLE_TEXT {
            setup.push_str(&format!("SET LOCAL {name} = {};\n", quote::literal(value)));
        }
        setup.push_str(&format!(
            "DECLARE pg_shard_rows NO SCROLL CURSOR FOR \
             SELECT row_to_json(s)::text FROM {} s",
            shard.qualified
        ));
        client
            .execute(&setup)
            .map(|_| ())
            .map_err(ShardError::into_node_failure)?;
        loop {
            pgrx::check_for_interrupts!();
            let rows = client
                .query(&format!("FETCH {BATCH_ROWS} FROM pg_shard_rows"), &[])
                .map_err(ShardError::into_node_failure)?;
            if rows.is_empty() {
                break;
            }
            let mut batch = String::from("[");
            for (i, row) in rows.iter().enumerate() {
                if i > 0 {
                    batch.push(',');
                }
                let json = row.first().cloned().flatten().unwrap_or_default();
                batch.push_str(&json);
            }
            batch.push(']');
            crate::spi::run_with_args(
                &format!(
                    "INSERT INTO {target} SELECT * FROM json_populate_recordset(NULL::{target}, $1::json)"
                ),
                &[batch.as_str().into()],
            )?;
        }
        client
            .execute("CLOSE pg_shard_rows")
            .map(|_| ())
            .map_err(ShardError::into_node_failure)
    })
}
