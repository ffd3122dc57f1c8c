//! Writes to a reference table reach every copy in the same transaction.
//!
//! The metadata node keeps the table's rows (reads are served locally). Its
//! AFTER … FOR EACH STATEMENT triggers (sql/pg_shard_api.sql) collect the
//! statement's rows from the transition tables as JSON and call
//! `pg_shard.replicate_reference_change`, which applies the same change to
//! every worker's copy in a remote transaction that commits with the local
//! one. Rows are matched by the key columns of the table's primary key (or
//! replica identity index). The statements on the workers run as the
//! writing role, so it needs the same privileges on the copies.

use crate::error::{OrReport, Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::transaction::connection::NodeConnection;
use crate::transaction::remote::in_transaction;
use pgrx::prelude::*;

/// The replication triggers: (name, event, transition tables).
const TRIGGERS: [(&str, &str, &str); 4] = [
    (
        "pg_shard_replicate_insert",
        "INSERT",
        "REFERENCING NEW TABLE AS pg_shard_new",
    ),
    (
        "pg_shard_replicate_update",
        "UPDATE",
        "REFERENCING OLD TABLE AS pg_shard_old NEW TABLE AS pg_shard_new",
    ),
    (
        "pg_shard_replicate_delete",
        "DELETE",
        "REFERENCING OLD TABLE AS pg_shard_old",
    ),
    ("pg_shard_replicate_truncate", "TRUNCATE", ""),
];

/// Trigger DDL that makes writes to `qualified_table` reach its copies.
pub(crate) fn replication_trigger_ddl(qualified_table: &str) -> Vec<String> {
    TRIGGERS
        .iter()
        .map(|(name, event, transition)| {
            format!(
                "CREATE TRIGGER {name} AFTER {event} ON {qualified_table} {transition} \
                 FOR EACH STATEMENT EXECUTE FUNCTION pg_shard.replicate_reference_write()"
            )
        })
        .collect()
}

/// Trigger DDL that stops writes to `qualified_table` from reaching copies.
pub(crate) fn drop_replication_trigger_ddl(qualified_table: &str) -> Vec<String> {
    TRIGGERS
        .iter()
        .map(|(name, _, _)| format!("DROP TRIGGER IF EXISTS {name} ON {qualified_table}"))
        .collect()
}

/// `pg_shard.replicate_reference_change(table, operation, old_rows, new_rows)`:
/// rows as JSON arrays of objects (NULL when the operation has none).
#[pg_extern(schema = "pg_shard")]
fn replicate_reference_change(
    table_oid: pg_sys::Oid,
    operation: &str,
    old_rows: Option<&str>,
    new_rows: Option<&str>,
) {
    replicate(table_oid, operation, old_rows, new_rows).or_report()
}

fn replicate(
    relid: pg_sys::Oid,
    operation: &str,
    old_rows: Option<&str>,
    new_rows: Option<&str>,
) -> Result<()> {
    let operation = operation.to_ascii_uppercase();
    let operation = operation.as_str();
    if !matches!(operation, "INSERT" | "UPDATE" | "DELETE" | "TRUNCATE") {
        return Err(ShardError::InvalidArgument(format!(
            "unknown operation \"{operation}\""
        )));
    }
    // Callable by anyone (the table's triggers run as the writer): allow no
    // more than the caller may do to the table itself.
    let allowed = crate::spi::query_one::<bool>(
        "SELECT has_table_privilege($1, $2)",
        &[relid.into(), operation.into()],
    )?
    .unwrap_or(false);
    if !allowed {
        return Err(ShardError::InvalidArgument(format!(
            "permission denied to {} reference table {}",
            operation.to_lowercase(),
            display_name(relid)?
        )));
    }
    let copies = copies_of(relid)?;
    let key = key_columns(relid)?;
    let needs_key = matches!(operation, "UPDATE" | "DELETE");
    if needs_key && key.is_empty() {
        return Err(ShardError::InvalidArgument(format!(
            "cannot {} rows of reference table {}: it has no primary key or replica \
             identity index to find them by on the workers",
            operation.to_lowercase(),
            display_name(relid)?
        )));
    }
    let columns = if operation == "UPDATE" {
        updatable_columns(relid)?
    } else {
        Vec::new()
    };
    for (node, copy) in &copies {
        let records = format!("json_populate_recordset(NULL::{copy}, $1::text::json)");
        in_transaction(node, |client| {
            let run = |client: &mut NodeConnection, sql: &str, rows: &str| {
                client
                    .execute_with(sql, &[Some(rows)])
                    .map(|_| ())
                    .map_err(ShardError::into_node_failure)
            };
            if operation == "TRUNCATE" {
                return client
                    .execute(&format!("TRUNCATE {copy}"))
                    .map(|_| ())
                    .map_err(ShardError::into_node_failure);
            }
            if let ("UPDATE", Some(old), Some(new)) = (operation, old_rows, new_rows) {
                // An UPDATE stays an UPDATE on the copies (a DELETE and an
                // INSERT would trip foreign keys that reference the copy).
                // The transition tables hold the old and new version of
                // each row at the same position: PostgreSQL appends both
                // at once, and json_agg reads them in that order.
                let matches = key
                    .iter()
                    .map(|c| format!("c.{c} IS NOT DISTINCT FROM o.{c}"))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                let assignments = columns
                    .iter()
                    .map(|c| format!("{c} = n.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                return client
                    .execute_with(
                        &format!(
                            "UPDATE {copy} c SET {assignments} \
                             FROM json_populate_recordset(NULL::{copy}, $1::text::json) \
                                  WITH ORDINALITY o \
                             JOIN json_populate_recordset(NULL::{copy}, $2::text::json) \
                                  WITH ORDINALITY n ON n.ordinality = o.ordinality \
                             WHERE {matches}"
                        ),
                        &[Some(old), Some(new)],
                    )
                    .map(|_| ())
                    .map_err(ShardError::into_node_failure);
            }
            if let (true, Some(rows)) = (needs_key, old_rows) {
                let matches = key
                    .iter()
                    .map(|c| format!("c.{c} IS NOT DISTINCT FROM o.{c}"))
                    .collect::<Vec<_>>()
                    .join(" AND ");
                run(
                    client,
                    &format!("DELETE FROM {copy} c USING {records} o WHERE {matches}"),
                    rows,
                )?;
            }
            if let (true, Some(rows)) = (matches!(operation, "INSERT" | "UPDATE"), new_rows) {
                run(
                    client,
                    &format!("INSERT INTO {copy} SELECT * FROM {records}"),
                    rows,
                )?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Quoted names of the columns an UPDATE sets (not generated ones).
fn updatable_columns(relid: pg_sys::Oid) -> Result<Vec<String>> {
    crate::spi::connect(|client| {
        let mut columns = Vec::new();
        for row in client.select(
            "SELECT quote_ident(attname) FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 \
             AND NOT attisdropped AND attgenerated = '' ORDER BY attnum",
            None,
            &[relid.into()],
        )? {
            columns.push(row.get::<String>(1)?.unwrap_or_default());
        }
        Ok(columns)
    })
}

/// Every worker copy of a reference table: (node, qualified copy name).
fn copies_of(relid: pg_sys::Oid) -> Result<Vec<(Node, String)>> {
    Ok(crate::metadata::catalog::shards_by_node(Some(&[relid]))?
        .into_values()
        .flat_map(|(node, shards)| {
            shards
                .into_iter()
                .map(move |(_, name)| (node.clone(), name))
        })
        .collect())
}

/// Quoted names of the primary key (or replica identity index) columns.
fn key_columns(relid: pg_sys::Oid) -> Result<Vec<String>> {
    crate::spi::connect(|client| {
        let mut columns = Vec::new();
        let rows = client.select(
            "WITH key AS (SELECT indkey, indnkeyatts FROM pg_index \
                          WHERE indrelid = $1 AND (indisprimary OR indisreplident) \
                          ORDER BY indisprimary DESC LIMIT 1) \
             SELECT a.attname::text \
             FROM key, unnest((key.indkey::int2[])[0:key.indnkeyatts - 1]) \
                       WITH ORDINALITY AS k(attnum, position) \
             JOIN pg_attribute a ON a.attrelid = $1 AND a.attnum = k.attnum \
             ORDER BY k.position",
            None,
            &[relid.into()],
        )?;
        for row in rows {
            if let Some(name) = row.get::<String>(1)? {
                let quoted = quote::ident(&name);
                if !columns.contains(&quoted) {
                    columns.push(quoted);
                }
            }
        }
        Ok(columns)
    })
}

fn display_name(relid: pg_sys::Oid) -> Result<String> {
    Ok(crate::spi::caller_relation_name(relid))
}
