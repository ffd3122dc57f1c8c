//! Moving the rows a table already holds into its shard tables.
//!
//! Rows are read by a sequential scan in COPY text form
//! ([`table_scan`]), routed by keyspace id with the core crate's shard map,
//! buffered per shard and streamed with COPY FROM STDIN inside the remote
//! transactions, every node at once, so the shard triggers check every row
//! on arrival.

use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::operations::table_scan;
use crate::settings::{with_settings, PORTABLE_TEXT};
use crate::shard_ddl::TableShape;
use crate::transaction::connection::NodeConnection;
use crate::transaction::remote::{with_declared_transactions, Access};
use pg_shard_core::{KeyspaceId, ShardMap};
use pgrx::prelude::*;

/// A shard's buffer is sent when it reaches this size: small enough that
/// the buffers fill one after another, keeping every node busy while the
/// metadata node reads on, instead of all at once at the end.
const FLUSH_BYTES: usize = 512 << 10;
/// What a node's libpq holds is passed on to it every so many rows.
const SEND_EVERY_ROWS: u64 = 1_000;

/// Where one shard's rows go.
#[derive(Clone, Debug)]
pub(crate) struct ShardTarget {
    pub(crate) node: Node,
    pub(crate) qualified_shard: String,
    pub(crate) shard_id: i64,
    /// The shard table's name within the table's schema.
    pub(crate) shard_name: String,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    rows: u64,
}

/// One COPY at a time on each node's connection, sent without waiting for
/// the node to store it: its outcome is read only before that node's next
/// COPY (or at the end), so reading rows here and storing them on every
/// node go on together.
struct Streams<'a, 'c> {
    connections: &'a mut [&'c mut NodeConnection],
    copying: Vec<bool>,
}

impl Streams<'_, '_> {
    fn send(&mut self, node: usize, statement: &str, bytes: &[u8]) -> Result<()> {
        self.finish(node)?;
        self.copying[node] = true;
        self.connections[node]
            .start_copy_in(statement, bytes)
            .map_err(ShardError::into_node_failure)
    }

    fn finish(&mut self, node: usize) -> Result<()> {
        if std::mem::take(&mut self.copying[node]) {
            self.connections[node]
                .finish_copy_in()
                .map_err(ShardError::into_node_failure)?;
        }
        Ok(())
    }

    fn send_some(&mut self) -> Result<()> {
        for (node, connection) in self.connections.iter_mut().enumerate() {
            if self.copying[node] {
                connection
                    .send_some()
                    .map_err(ShardError::into_node_failure)?;
            }
        }
        Ok(())
    }

    /// Read every outstanding outcome (also after an error, so no
    /// connection is left in the middle of a COPY); the first error wins.
    fn finish_all(&mut self, mut result: Result<()>) -> Result<()> {
        for node in 0..self.connections.len() {
            let finished = self.finish(node);
            if result.is_ok() {
                result = finished;
            }
        }
        result
    }
}

/// Run `work` with a COPY stream to each of `nodes` (distinct servers) in
/// the remote transactions.
fn with_streams<T>(nodes: &[Node], work: impl FnOnce(&mut Streams) -> Result<T>) -> Result<T> {
    with_declared_transactions(nodes, Access::Write, None, |connections| {
        let copying = vec![false; connections.len()];
        let mut streams = Streams {
            connections,
            copying,
        };
        let outcome = work(&mut streams);
        let finished = streams.finish_all(Ok(()));
        let value = outcome?;
        finished.map(|_| value)
    })
}

/// The distinct servers among `nodes`, and each one's position among them.
fn distinct_nodes<'n>(nodes: impl Iterator<Item = &'n Node>) -> (Vec<Node>, Vec<usize>) {
    let mut distinct: Vec<Node> = Vec::new();
    let mut positions = Vec::new();
    for node in nodes {
        let position = match distinct.iter().position(|n| n.same_server(node)) {
            Some(position) => position,
            None => {
                distinct.push(node.clone());
                distinct.len() - 1
            }
        };
        positions.push(position);
    }
    (distinct, positions)
}

/// Copy every row of `shape` into the shard owning its `dist_column` value.
pub(crate) fn copy_into_shards(
    relid: pg_sys::Oid,
    shape: &TableShape,
    dist_column: &str,
    map: &ShardMap<ShardTarget>,
) -> Result<u64> {
    let columns = shape.column_list();
    let statements: Vec<String> = map
        .entries()
        .iter()
        .map(|(_, target)| copy_statement(target, &columns))
        .collect();
    let (nodes, node_of) = distinct_nodes(map.entries().iter().map(|(_, t)| &t.node));
    let mut buffers: Vec<Buffer> = (0..map.len()).map(|_| Buffer::default()).collect();
    with_streams(&nodes, |streams| {
        let mut copied = 0;
        let mut read: u64 = 0;
        scan(relid, shape, Some(dist_column), |keyspace_id, line| {
            let Some(keyspace_id) = keyspace_id else {
                return Err(ShardError::InvalidArgument(format!(
                    "table {} has rows with a NULL in distribution column \"{dist_column}\"",
                    shape.display_name
                )));
            };
            let index = map.index_of(keyspace_id);
            let buffer = &mut buffers[index];
            buffer.bytes.extend_from_slice(line);
            buffer.rows += 1;
            if buffer.bytes.len() >= FLUSH_BYTES {
                streams.send(node_of[index], &statements[index], &buffer.bytes)?;
                copied += std::mem::take(buffer).rows;
            }
            read += 1;
            if read % SEND_EVERY_ROWS == 0 {
                streams.send_some()?;
            }
            Ok(())
        })?;
        for (index, buffer) in buffers.iter_mut().enumerate() {
            if buffer.rows > 0 {
                streams.send(node_of[index], &statements[index], &buffer.bytes)?;
                copied += std::mem::take(buffer).rows;
            }
        }
        Ok(copied)
    })
}

/// Copy every row of `shape` into each of `targets` (reference table
/// copies, one per node).
pub(crate) fn copy_into_all(
    relid: pg_sys::Oid,
    shape: &TableShape,
    targets: &[ShardTarget],
) -> Result<u64> {
    let columns = shape.column_list();
    let statements: Vec<String> = targets
        .iter()
        .map(|target| copy_statement(target, &columns))
        .collect();
    let (nodes, node_of) = distinct_nodes(targets.iter().map(|t| &t.node));
    with_streams(&nodes, |streams| {
        let mut buffer = Buffer::default();
        let mut copied = 0;
        let mut send_all = |streams: &mut Streams, buffer: &mut Buffer| -> Result<()> {
            for (index, statement) in statements.iter().enumerate() {
                streams.send(node_of[index], statement, &buffer.bytes)?;
            }
            copied += std::mem::take(buffer).rows;
            Ok(())
        };
        scan(relid, shape, None, |_, line| {
            buffer.bytes.extend_from_slice(line);
            buffer.rows += 1;
            if buffer.bytes.len() >= FLUSH_BYTES {
                send_all(streams, &mut buffer)?;
            }
            if buffer.rows % SEND_EVERY_ROWS == 0 {
                streams.send_some()?;
            }
            Ok(())
        })?;
        if buffer.rows > 0 {
            send_all(streams, &mut buffer)?;
        }
        Ok(copied)
    })
}

fn copy_statement(target: &ShardTarget, columns: &str) -> String {
    format!("COPY {} ({columns}) FROM STDIN", target.qualified_shard)
}

/// Every row of the table as a COPY text line, printed under
/// [`PORTABLE_TEXT`] settings so that the worker reads back what was meant.
fn scan(
    relid: pg_sys::Oid,
    shape: &TableShape,
    key_column: Option<&str>,
    each_row: impl FnMut(Option<KeyspaceId>, &[u8]) -> Result<()>,
) -> Result<()> {
    let columns: Vec<String> = shape.columns.iter().map(|c| c.name.clone()).collect();
    with_settings(PORTABLE_TEXT, || {
        table_scan::for_each_copy_line(relid, &columns, key_column, each_row)
    })
}
