//! A distributed table on the metadata node is a table partitioned by range
//! of `pg_shard.keyspace_id(distribution column)` whose partitions are
//! postgres_fdw foreign tables on the shard tables (in schema
//! pg_shard_partitions). PostgreSQL's own machinery then routes every
//! statement: tuple routing for INSERT and COPY, partition pruning, async
//! append for parallel scans of many shards, partitionwise joins and
//! aggregates.
//!
//! PostgreSQL cannot turn a table into a partitioned one, so
//! `create_distributed_table` builds the partitioned table beside the
//! original, moves over what belongs to the table itself (owner, grants,
//! comments, ownership of its sequences, defaults), drops the original and
//! renames the new one into its place. What cannot be moved yet is refused
//! before anything changes ([`check_replaceable`]). The metadata node's table
//! carries no primary key or unique index (PostgreSQL allows none on a table
//! with foreign partitions); the shards enforce them.

use crate::error::{Result, ShardError};
use crate::metadata::fdw::server_name;
use crate::quote;
use crate::shard_ddl::TableShape;
use pgrx::prelude::*;

/// One shard as a partition: its table on the worker and its range.
pub(crate) struct Partition {
    pub(crate) shard_id: i64,
    pub(crate) shard_name: String,
    pub(crate) node_id: i32,
    pub(crate) range_start: i64,
    pub(crate) range_end: i64,
}

/// Objects that depend on the table and cannot follow it to the
/// partitioned table yet.
pub(crate) fn check_replaceable(relid: pg_sys::Oid, shape: &TableShape) -> Result<()> {
    let unsupported = |reason: String| ShardError::UnsupportedTable {
        table: shape.display_name.clone(),
        reason,
    };
    if let Some(column) = shape.columns.iter().find(|c| c.identity_or_generated) {
        return Err(unsupported(format!(
            "identity and generated columns are not supported yet (column \"{}\")",
            column.name
        )));
    }
    let checks: [(&str, &str); 7] = [
        (
            "SELECT string_agg(polname::text, ', ') FROM pg_policy WHERE polrelid = $1",
            "row-level security policies are not carried over yet",
        ),
        (
            "SELECT string_agg(stxname::text, ', ') FROM pg_statistic_ext WHERE stxrelid = $1",
            "extended statistics are not carried over yet",
        ),
        (
            "SELECT string_agg(DISTINCT chr(1) || r.ev_class::text || chr(1), ', ') \
             FROM pg_depend d JOIN pg_rewrite r ON r.oid = d.objid \
             WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass \
               AND d.refobjid = $1 AND r.ev_class <> $1",
            "views depend on it; drop them first, and recreate them afterwards",
        ),
        (
            "SELECT string_agg(rulename::text, ', ') FROM pg_rewrite WHERE ev_class = $1",
            "rules on distributed tables are not supported",
        ),
        (
            "SELECT string_agg(tgname::text, ', ') FROM pg_trigger \
             WHERE tgrelid = $1 AND NOT tgisinternal",
            "user triggers on distributed tables are not supported yet",
        ),
        (
            "SELECT string_agg(attname::text, ', ') FROM pg_attribute \
             WHERE attrelid = $1 AND attacl IS NOT NULL",
            "column privileges are not carried over yet",
        ),
        (
            "SELECT string_agg(p.pubname::text, ', ') FROM pg_publication_rel r \
             JOIN pg_publication p ON p.oid = r.prpubid WHERE r.prrelid = $1",
            "the table is in a publication",
        ),
    ];
    for (query, reason) in checks {
        if let Some(found) = crate::spi::query_one::<String>(query, &[relid.into()])? {
            let found = crate::spi::caller_names(&found);
            return Err(unsupported(format!("{reason} ({found})")));
        }
    }
    Ok(())
}

/// The foreign table standing for a shard: table name, shard id and node,
/// so that EXPLAIN names the shards and nodes a statement touches
/// (`Foreign Scan on orders_100003_node_2`).
pub(crate) fn partition_name(table_name: &str, shard_id: i64, node_id: i32) -> String {
    quote::name_with_suffix(table_name, &format!("_{shard_id}_node_{node_id}"))
}

/// Replace the (empty) table `relid` by its partitioned routing table, and
/// point the catalog at the new table.
pub(crate) fn replace_with_routing_table(
    relid: pg_sys::Oid,
    shape: &TableShape,
    dist_column: &str,
    partitions: &[Partition],
) -> Result<()> {
    let original = shape.qualified();
    let new_name = quote::name_with_suffix(&shape.name, "_pg_shard_new");
    let new_table = quote::qualified(&shape.schema, &new_name);
    crate::spi::run(&format!(
        "CREATE TABLE {new_table} ({}) PARTITION BY RANGE (pg_shard.keyspace_id({}))",
        shape.column_definitions(true),
        quote::ident(dist_column)
    ))?;
    // The owner first: the partitions take the parent's.
    for statement in carried_over(relid, &new_table)? {
        crate::spi::run(&statement)?;
    }
    for partition in partitions {
        let upper = if partition.range_end == i64::MAX {
            "MAXVALUE".to_string()
        } else {
            (partition.range_end + 1).to_string()
        };
        create_foreign_partition(
            &new_table,
            &quote::qualified(
                "pg_shard_partitions",
                &partition_name(&shape.name, partition.shard_id, partition.node_id),
            ),
            &format!("FOR VALUES FROM ({}) TO ({upper})", partition.range_start),
            partition.node_id,
            &shape.schema,
            &partition.shard_name,
        )?;
    }
    crate::metadata::catalog::write(
        "UPDATE pg_shard.logical_table SET table_rel = to_regclass($2) WHERE table_rel = $1",
        &[relid.into(), new_table.as_str().into()],
    )?;
    // The catalog no longer names the original, so the DROP's event trigger
    // leaves the shards alone.
    crate::spi::run(&format!("DROP TABLE {original}"))?;
    crate::commands::ddl::run_internal(&format!(
        "ALTER TABLE {new_table} RENAME TO {}",
        quote::ident(&shape.name)
    ))?;
    Ok(())
}

/// Attach `partition` (qualified) to the routing table `parent` with
/// `bounds` (`FOR VALUES …`): a foreign table for the shard table
/// `shard_schema.shard_name` on node `node_id`, owned by the parent's owner
/// (who may then change the table: ALTER TABLE recurses to partitions).
pub(crate) fn create_foreign_partition(
    parent: &str,
    partition: &str,
    bounds: &str,
    node_id: i32,
    shard_schema: &str,
    shard_name: &str,
) -> Result<()> {
    crate::spi::run(&format!(
        "CREATE FOREIGN TABLE {partition} PARTITION OF {parent} {bounds} SERVER {} \
         OPTIONS (schema_name {}, table_name {})",
        quote::ident(&server_name(node_id)),
        quote::literal(shard_schema),
        quote::literal(shard_name),
    ))?;
    let owner = crate::spi::query_one::<String>(
        "SELECT quote_ident(pg_get_userbyid(relowner)) FROM pg_class WHERE oid = $1::regclass",
        &[parent.into()],
    )?;
    if let Some(owner) = owner {
        crate::spi::run(&format!("ALTER FOREIGN TABLE {partition} OWNER TO {owner}"))?;
    }
    Ok(())
}

/// Owner, grants, comments and sequence ownership of `relid`, as statements
/// applying them to `new_table`.
pub(crate) fn carried_over(relid: pg_sys::Oid, new_table: &str) -> Result<Vec<String>> {
    let mut statements = TableShape::load(relid)?.owner_grant_and_comment_sql(new_table);
    for (sequence, column) in crate::metadata::catalog::owned_sequences(relid)? {
        statements.push(format!(
            "ALTER SEQUENCE {sequence} OWNED BY {new_table}.{column}"
        ));
    }
    Ok(statements)
}
