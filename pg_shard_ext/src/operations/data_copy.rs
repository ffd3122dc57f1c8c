//! Moving the rows a table already holds into its shard tables.
//!
//! Rows are read through an SPI cursor with every column cast to text, routed
//! by keyspace id with the core crate's shard map, buffered per shard in COPY
//! text format and streamed with COPY FROM STDIN inside the remote
//! transactions, so the shard triggers check every row on arrival.

use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::quote;
use crate::settings::{with_settings, PORTABLE_TEXT};
use crate::shard_ddl::TableShape;
use crate::transaction::remote::in_transaction;
use pg_shard_core::{KeyspaceId, ShardMap};
use pgrx::prelude::*;

const FETCH_ROWS: i64 = 10_000;
/// A shard's buffer is sent when it reaches this size…
const FLUSH_BYTES: usize = 4 << 20;
/// …or earlier, when all buffers together would exceed this.
const TOTAL_BUFFER_BYTES: usize = 256 << 20;

/// Where one shard's rows go.
#[derive(Clone, Debug)]
pub(crate) struct ShardTarget {
    pub(crate) node: Node,
    pub(crate) qualified_shard: String,
    pub(crate) shard_id: i64,
    /// The shard table's name within the table's schema.
    pub(crate) shard_name: String,
}

struct Buffer {
    bytes: Vec<u8>,
    rows: u64,
}

/// Copy every row of `shape` into the shard owning its `dist_column` value.
pub(crate) fn copy_into_shards(
    shape: &TableShape,
    dist_column: &str,
    map: &ShardMap<ShardTarget>,
) -> Result<u64> {
    let query = format!(
        "SELECT pg_shard.keyspace_id({}), {} FROM ONLY {}",
        quote::ident(dist_column),
        text_columns(shape),
        shape.qualified()
    );
    let mut buffers: Vec<Buffer> = (0..map.len())
        .map(|_| Buffer {
            bytes: Vec::new(),
            rows: 0,
        })
        .collect();
    let columns = shape.column_list();
    let flush_bytes = FLUSH_BYTES
        .min(TOTAL_BUFFER_BYTES / map.len().max(1))
        .max(64 << 10);
    let mut copied = 0;
    scan(&query, shape.columns.len(), |keyspace_id, line| {
        let Some(keyspace_id) = keyspace_id else {
            return Err(ShardError::InvalidArgument(format!(
                "table {} has rows with a NULL in distribution column \"{dist_column}\"",
                shape.display_name
            )));
        };
        let index = map.index_of(KeyspaceId::from_sql(keyspace_id));
        let buffer = &mut buffers[index];
        buffer.bytes.extend_from_slice(line);
        buffer.rows += 1;
        if buffer.bytes.len() >= flush_bytes {
            copied += flush(&map.entries()[index].1, &columns, buffer)?;
        }
        Ok(())
    })?;
    for (index, buffer) in buffers.iter_mut().enumerate() {
        copied += flush(&map.entries()[index].1, &columns, buffer)?;
    }
    Ok(copied)
}

/// Copy every row of `shape` into each of `targets` (reference table copies).
pub(crate) fn copy_into_all(shape: &TableShape, targets: &[ShardTarget]) -> Result<u64> {
    let query = format!(
        "SELECT NULL::bigint, {} FROM ONLY {}",
        text_columns(shape),
        shape.qualified()
    );
    let columns = shape.column_list();
    let mut buffer = Buffer {
        bytes: Vec::new(),
        rows: 0,
    };
    let mut copied = 0;
    let mut flush_all = |buffer: &mut Buffer| -> Result<()> {
        let rows = buffer.rows;
        for target in targets {
            copy_buffer(target, &columns, &buffer.bytes)?;
        }
        copied += rows;
        buffer.bytes.clear();
        buffer.rows = 0;
        Ok(())
    };
    scan(&query, shape.columns.len(), |_, line| {
        buffer.bytes.extend_from_slice(line);
        buffer.rows += 1;
        if buffer.bytes.len() >= FLUSH_BYTES {
            flush_all(&mut buffer)?;
        }
        Ok(())
    })?;
    if buffer.rows > 0 {
        flush_all(&mut buffer)?;
    }
    Ok(copied)
}

fn text_columns(shape: &TableShape) -> String {
    shape
        .columns
        .iter()
        .map(|c| format!("{}::text", quote::ident(&c.name)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Run `query` (first column a keyspace id, then `width` text columns) and
/// hand each row to `each_row` as a COPY text line. Values print under
/// [`PORTABLE_TEXT`] settings, so the worker reads back what was meant.
fn scan(
    query: &str,
    width: usize,
    each_row: impl FnMut(Option<i64>, &[u8]) -> Result<()>,
) -> Result<()> {
    with_settings(PORTABLE_TEXT, || scan_rows(query, width, each_row))
}

fn scan_rows(
    query: &str,
    width: usize,
    mut each_row: impl FnMut(Option<i64>, &[u8]) -> Result<()>,
) -> Result<()> {
    crate::spi::connect_mut(|client| {
        let mut cursor = client.open_cursor_mut(query, &[]);
        let mut line = Vec::new();
        loop {
            pgrx::check_for_interrupts!();
            let batch = cursor.fetch(FETCH_ROWS)?;
            if batch.is_empty() {
                break;
            }
            for row in batch {
                line.clear();
                for column in 0..width {
                    if column > 0 {
                        line.push(b'\t');
                    }
                    match row.get::<String>(column + 2)? {
                        None => line.extend_from_slice(b"\\N"),
                        Some(value) => escape_copy_text(&value, &mut line),
                    }
                }
                line.push(b'\n');
                each_row(row.get::<i64>(1)?, &line)?;
            }
            // SAFETY: the batch has been consumed; nothing refers to it any
            // more. pgrx keeps fetched batches until SPI_finish otherwise,
            // which would hold the whole table in memory.
            unsafe { pg_sys::SPI_freetuptable(pg_sys::SPI_tuptable) };
        }
        Ok(())
    })
}

/// COPY text format: backslash, tab, newline and carriage return escaped.
fn escape_copy_text(value: &str, out: &mut Vec<u8>) {
    for byte in value.bytes() {
        match byte {
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\t' => out.extend_from_slice(b"\\t"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            other => out.push(other),
        }
    }
}

fn flush(target: &ShardTarget, columns: &str, buffer: &mut Buffer) -> Result<u64> {
    if buffer.rows == 0 {
        return Ok(0);
    }
    copy_buffer(target, columns, &buffer.bytes)?;
    let rows = buffer.rows;
    buffer.bytes.clear();
    buffer.rows = 0;
    Ok(rows)
}

fn copy_buffer(target: &ShardTarget, columns: &str, bytes: &[u8]) -> Result<()> {
    in_transaction(&target.node, |client| {
        let statement = format!("COPY {} ({columns}) FROM STDIN", target.qualified_shard);
        client
            .copy_in(&statement, bytes)
            .map(|_| ())
            .map_err(ShardError::into_node_failure)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_text_escapes() {
        let mut out = Vec::new();
        super::escape_copy_text("a\tb\\c\nd\re", &mut out);
        assert_eq!(out, b"a\\tb\\\\c\\nd\\re");
    }
}
