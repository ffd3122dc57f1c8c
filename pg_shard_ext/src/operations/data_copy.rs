//! Moving the rows a table already holds into its shard tables.
//!
//! Rows are read by a sequential scan in COPY text form
//! ([`table_scan`]), routed by keyspace id with the core crate's shard map,
//! buffered per shard and streamed with COPY FROM STDIN inside the remote
//! transactions, every node at once, so the shard triggers check every row
//! on arrival.

use crate::copy_rows::CopyFormat;
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::operations::table_scan;
use crate::settings::{with_settings, PORTABLE_TEXT};
use crate::shard_ddl::TableShape;
use crate::transaction::shard_copy::{with_shard_copy, CopyTarget};
use pg_shard_core::{KeyspaceId, ShardMap};
use pgrx::prelude::*;

/// Where one shard's rows go.
#[derive(Clone, Debug)]
pub(crate) struct ShardTarget {
    pub(crate) node: Node,
    pub(crate) qualified_shard: String,
    pub(crate) shard_id: i64,
    /// The shard table's name within the table's schema.
    pub(crate) shard_name: String,
}

/// Copy every row of `shape` into the shard owning its `dist_column` value.
pub(crate) fn copy_into_shards(
    relid: pg_sys::Oid,
    shape: &TableShape,
    dist_column: &str,
    map: &ShardMap<ShardTarget>,
) -> Result<u64> {
    let columns = shape.column_list();
    let targets = map
        .entries()
        .iter()
        .map(|(_, target)| copy_target(target, &columns))
        .collect();
    let source = format!("distributing {}", shape.display_name);
    let format = scan_format(relid, shape)?;
    let ((), copied) = with_shard_copy(targets, None, &source, format, None, |copy| {
        let format = copy.format();
        scan(
            relid,
            shape,
            Some(dist_column),
            format,
            |keyspace_id, line| {
                let Some(keyspace_id) = keyspace_id else {
                    return Err(ShardError::InvalidArgument(format!(
                        "table {} has rows with a NULL in distribution column \"{dist_column}\"",
                        shape.display_name
                    )));
                };
                copy.push(map.index_of(keyspace_id), line)
            },
        )
    })?;
    Ok(copied)
}

/// Copy every row of `shape` into each of `targets` (reference table
/// copies, one per node); returns the rows read.
pub(crate) fn copy_into_all(
    relid: pg_sys::Oid,
    shape: &TableShape,
    targets: &[ShardTarget],
) -> Result<u64> {
    let columns = shape.column_list();
    let targets = targets
        .iter()
        .map(|target| copy_target(target, &columns))
        .collect();
    let source = format!("copying {}", shape.display_name);
    let format = scan_format(relid, shape)?;
    let (rows, _) = with_shard_copy(targets, None, &source, format, None, |copy| {
        let mut rows = 0;
        let format = copy.format();
        scan(relid, shape, None, format, |_, line| {
            rows += 1;
            copy.push_to_all(line)
        })?;
        Ok(rows)
    })?;
    Ok(rows)
}

fn copy_target(target: &ShardTarget, columns: &str) -> CopyTarget {
    CopyTarget {
        node: target.node.clone(),
        table: target.qualified_shard.clone(),
        columns: columns.to_string(),
    }
}

/// The format the table's rows can travel in (binary when every column's
/// type allows).
fn scan_format(relid: pg_sys::Oid, shape: &TableShape) -> Result<CopyFormat> {
    table_scan::copy_format(relid, &column_names(shape))
}

fn column_names(shape: &TableShape) -> Vec<String> {
    shape.columns.iter().map(|c| c.name.clone()).collect()
}

/// Every row of the table as one row of COPY data in `format`, text
/// printed under [`PORTABLE_TEXT`] settings so that the worker reads back
/// what was meant.
fn scan(
    relid: pg_sys::Oid,
    shape: &TableShape,
    key_column: Option<&str>,
    format: CopyFormat,
    each_row: impl FnMut(Option<KeyspaceId>, &[u8]) -> Result<()>,
) -> Result<()> {
    let columns = column_names(shape);
    with_settings(PORTABLE_TEXT, || {
        table_scan::for_each_copy_line(relid, &columns, key_column, format, each_row)
    })
}
