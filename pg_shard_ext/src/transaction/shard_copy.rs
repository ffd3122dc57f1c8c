//! Streaming rows into shard tables with COPY, every node at once, in the
//! local transaction's remote transactions.
//!
//! Rows (COPY data, text lines or binary tuples) are buffered per target shard. A connection holds
//! one COPY at a time, so a node's shards take turns: whenever a node is
//! free (checked every [`PUMP_EVERY_ROWS`] rows, without waiting) it gets
//! its fullest buffer as one `COPY … FROM STDIN`, sent without waiting for
//! the node to store it. The metadata node reading rows and every worker
//! storing them so go on together; the metadata node waits for a node only
//! when the buffers together outgrow [`MAX_BUFFERED_BYTES`].
//!
//! Sending a shard's buffer when it reached a fixed size (as this did
//! before) made the metadata node and the workers take turns: rows routed
//! by a hash fill every buffer at the same rate, so they all filled at
//! once, were sent one node's shard after another while the reading
//! stopped, and then all refilled while the workers had nothing to do.

use crate::copy_rows::CopyFormat;
use crate::error::{Result, ShardError};
use crate::metadata::Node;
use crate::transaction::connection::{NodeConnection, Planning};
use crate::transaction::remote::{with_declared_transactions, Access};

/// A free node is given its fullest buffer once that holds this much:
/// smaller COPYs would cost more in round trips than they save in waiting.
const MIN_SEND_BYTES: usize = 128 << 10;
/// The buffers together hold at most this much: beyond it the metadata
/// node waits for the fullest buffer's node.
const MAX_BUFFERED_BYTES: usize = 16 << 20;
/// One buffer holds at most this much: a full one waits for its node.
/// A COPY's data goes whole into libpq's output buffer, which keeps its
/// size for the connection's life (cached connections live on), so this
/// also bounds what each connection keeps after a large COPY.
const MAX_SHARD_BUFFER_BYTES: usize = 1 << 20;
/// The nodes are checked (what libpq holds passed on, finished COPYs read,
/// free nodes given rows) every so many rows.
const PUMP_EVERY_ROWS: u64 = 1_000;

/// Where one target's rows go: its node, its table there (quoted) and the
/// columns the rows hold (a quoted list).
pub(crate) struct CopyTarget {
    pub(crate) node: Node,
    pub(crate) table: String,
    pub(crate) columns: String,
}

#[derive(Default)]
struct Buffer {
    bytes: Vec<u8>,
    /// What names each row of the buffer in errors: its number in the
    /// input (from 1), or its line ([`ShardCopy::push_line`]).
    rows: Vec<u64>,
}

/// A COPY sent to a node whose outcome is still to be read.
struct InFlight {
    target: usize,
    rows: Vec<u64>,
}

/// Rows on their way to a set of targets.
pub(crate) struct ShardCopy<'a, 'c> {
    connections: &'a mut [&'c mut NodeConnection],
    /// Each node's COPY whose outcome is still to be read.
    copying: Vec<Option<InFlight>>,
    /// What the rows come from, for errors (`COPY orders`).
    source: String,
    format: CopyFormat,
    statements: Vec<String>,
    tables: Vec<String>,
    /// Each target's node, as a position in `connections`.
    node_of: Vec<usize>,
    buffers: Vec<Buffer>,
    /// The bytes all buffers hold.
    buffered: usize,
    rows_in: u64,
    rows_sent: u64,
    /// Whether rows are named by their input's lines ([`ShardCopy::push_line`])
    /// rather than by their number.
    by_line: bool,
}

/// Run `work` with a [`ShardCopy`] to `targets`, then send what is left
/// and read every node's outcome; returns `work`'s value and the rows
/// stored. An error leaves no node in the middle of a COPY, and the local
/// transaction's abort rolls every node back. A row a node refuses is
/// named in the error's CONTEXT by `source` and its number in the input.
/// `format` is the format the caller's rows can take; binary becomes text
/// when a node's database has another encoding than ours (a conservative
/// choice: text values in binary are converted from the client encoding
/// too, but the text path is the one tested across encodings): `work`
/// encodes its rows as [`ShardCopy::format`] says. With `lookups`, the
/// changes the rows made to lookups are taken from every node into it
/// (to be written once the connections are back).
pub(crate) fn with_shard_copy<T>(
    targets: Vec<CopyTarget>,
    version: Option<i64>,
    source: &str,
    format: CopyFormat,
    lookups: Option<&mut Vec<crate::lookups::apply::Change>>,
    work: impl FnOnce(&mut ShardCopy) -> Result<T>,
) -> Result<(T, u64)> {
    let (nodes, node_of) = distinct_nodes(targets.iter().map(|t| &t.node));
    with_declared_transactions(&nodes, Access::Write, version, |connections| {
        if let Some(version) = version {
            for connection in connections.iter_mut() {
                connection.declare_session(version, "", Planning::Own)?;
            }
        }
        let local_encoding = crate::transaction::connection::database_encoding();
        let format = if connections
            .iter()
            .all(|connection| connection.server_encoding().as_deref() == Some(&*local_encoding))
        {
            format
        } else {
            CopyFormat::Text
        };
        let statements: Vec<String> = targets
            .iter()
            .map(|t| {
                format!(
                    "COPY {} ({}) FROM STDIN{}",
                    t.table,
                    t.columns,
                    format.options()
                )
            })
            .collect();
        let tables: Vec<String> = targets.iter().map(|t| t.table.clone()).collect();
        let mut copy = ShardCopy {
            copying: (0..connections.len()).map(|_| None).collect(),
            connections,
            source: source.to_string(),
            format,
            buffers: (0..statements.len()).map(|_| Buffer::default()).collect(),
            statements,
            tables,
            node_of,
            buffered: 0,
            rows_in: 0,
            rows_sent: 0,
            by_line: false,
        };
        let outcome = work(&mut copy).and_then(|value| copy.send_all().map(|_| value));
        let finished = copy.finish_all();
        let value = outcome?;
        finished?;
        if let Some(changes) = lookups {
            for connection in copy.connections.iter_mut() {
                crate::lookups::apply::take(connection, changes)?;
            }
        }
        Ok((value, copy.rows_sent))
    })
}

impl ShardCopy<'_, '_> {
    /// Add one row of COPY data (a text line ending in a newline, or a
    /// binary tuple, as [`ShardCopy::format`] says) for `target`.
    pub(crate) fn push(&mut self, target: usize, row: &[u8]) -> Result<()> {
        self.rows_in += 1;
        self.add(target, row, self.rows_in)?;
        self.pump_now_and_then()
    }

    /// [`ShardCopy::push`] of a row that its input names by `line` (a COPY
    /// input's line, as PostgreSQL's COPY names it in errors): a node that
    /// refuses it names that line.
    pub(crate) fn push_line(&mut self, target: usize, row: &[u8], line: u64) -> Result<()> {
        self.by_line = true;
        self.rows_in += 1;
        self.add(target, row, line)?;
        self.pump_now_and_then()
    }

    /// Add one row for every target (a reference table's copies): one row
    /// of the input, whichever node refuses it.
    pub(crate) fn push_to_all(&mut self, row: &[u8]) -> Result<()> {
        self.rows_in += 1;
        for target in 0..self.buffers.len() {
            self.add(target, row, self.rows_in)?;
        }
        self.pump_now_and_then()
    }

    /// Every [`PUMP_EVERY_ROWS`] rows, read what the nodes sent back.
    fn pump_now_and_then(&mut self) -> Result<()> {
        if self.rows_in.is_multiple_of(PUMP_EVERY_ROWS) {
            self.pump()?;
        }
        Ok(())
    }

    /// Buffer `row` (named `number` in errors) for `target`, sending
    /// buffers that outgrew their bounds.
    fn add(&mut self, target: usize, row: &[u8], number: u64) -> Result<()> {
        let buffer = &mut self.buffers[target];
        buffer.bytes.extend_from_slice(row);
        buffer.rows.push(number);
        self.buffered += row.len();
        if self.buffers[target].bytes.len() >= MAX_SHARD_BUFFER_BYTES {
            self.send(target)?;
        }
        while self.buffered > MAX_BUFFERED_BYTES {
            match self.fullest(None) {
                Some(target) => self.send(target)?,
                None => break,
            }
        }
        Ok(())
    }

    /// The format the rows pushed must be in.
    pub(crate) fn format(&self) -> CopyFormat {
        self.format
    }

    /// The target (of `node`'s, or of any node) whose buffer holds most;
    /// None when they are all empty.
    fn fullest(&self, node: Option<usize>) -> Option<usize> {
        (0..self.buffers.len())
            .filter(|&target| node.is_none_or(|node| self.node_of[target] == node))
            .filter(|&target| !self.buffers[target].rows.is_empty())
            .max_by_key(|&target| self.buffers[target].bytes.len())
    }

    /// Without waiting: pass on what libpq holds, read the outcome of every
    /// COPY that ended, and give each free node its fullest buffer when it
    /// holds at least [`MIN_SEND_BYTES`].
    fn pump(&mut self) -> Result<()> {
        for node in 0..self.connections.len() {
            if self.copying[node].is_some() {
                let done = self.connections[node]
                    .copy_in_done()
                    .map_err(ShardError::into_node_failure)?;
                if !done {
                    continue;
                }
                self.finish(node)?;
            }
            if let Some(target) = self.fullest(Some(node)) {
                if self.buffers[target].bytes.len() >= MIN_SEND_BYTES {
                    self.send(target)?;
                }
            }
        }
        Ok(())
    }

    /// Send `target`'s buffer, once its node has finished the COPY before.
    fn send(&mut self, target: usize) -> Result<()> {
        let node = self.node_of[target];
        self.finish(node)?;
        let buffer = std::mem::take(&mut self.buffers[target]);
        if buffer.rows.is_empty() {
            return Ok(());
        }
        self.buffered -= buffer.bytes.len();
        self.rows_sent += buffer.rows.len() as u64;
        self.copying[node] = Some(InFlight {
            target,
            rows: buffer.rows,
        });
        self.connections[node]
            .start_copy_in(
                &self.statements[target],
                &[self.format.header(), &buffer.bytes, self.format.trailer()],
            )
            .map_err(|error| self.row_error(node, error))
    }

    /// Send every buffer left, the nodes taking turns so that one stores a
    /// batch while the next is sent to another.
    fn send_all(&mut self) -> Result<()> {
        loop {
            let mut sent = false;
            for node in 0..self.connections.len() {
                if let Some(target) = self.fullest(Some(node)) {
                    self.send(target)?;
                    sent = true;
                }
            }
            if !sent {
                return Ok(());
            }
        }
    }

    fn finish(&mut self, node: usize) -> Result<()> {
        if self.copying[node].is_some() {
            let finished = self.connections[node].finish_copy_in();
            if let Err(error) = finished {
                return Err(self.row_error(node, error));
            }
            self.copying[node] = None;
        }
        Ok(())
    }

    /// A node's error of the COPY in flight there: a row it refused keeps
    /// the node's SQLSTATE, message and detail, with a CONTEXT naming the
    /// row in the input (the node's own names the line of one batch);
    /// other failures name the node.
    fn row_error(&mut self, node: usize, error: ShardError) -> ShardError {
        let in_flight = self.copying[node].take();
        let ShardError::RemoteStatement {
            node: label,
            sqlstate,
            message,
            detail,
            notes,
        } = error
        else {
            return error.into_node_failure();
        };
        let row = notes
            .context
            .as_deref()
            .and_then(batch_line)
            .zip(in_flight.as_ref())
            .and_then(|(line, in_flight)| in_flight.rows.get(line.checked_sub(1)? as usize));
        let shard = in_flight
            .as_ref()
            .and_then(|in_flight| self.tables.get(in_flight.target))
            .cloned()
            .unwrap_or_default();
        let context = match row {
            Some(line) if self.by_line => {
                format!("{}, line {line} (on node {label}, {shard})", self.source)
            }
            Some(row) => format!(
                "{}, row {row} of the input (on node {label}, {shard})",
                self.source
            ),
            None => format!("{} (on node {label}, {shard})", self.source),
        };
        ShardError::CopyRow {
            sqlstate,
            message,
            detail,
            hint: notes.hint,
            context: Some(context),
        }
    }

    /// Read every outstanding outcome (also after an error, so that no
    /// connection is left in the middle of a COPY); the first error wins.
    fn finish_all(&mut self) -> Result<()> {
        let mut result = Ok(());
        for node in 0..self.connections.len() {
            let finished = self.finish(node);
            if result.is_ok() {
                result = finished;
            }
        }
        result
    }
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

/// The line a node's COPY CONTEXT names (`COPY t_1, line 17, column x: …`).
fn batch_line(context: &str) -> Option<u64> {
    let after = &context[context.find(", line ")? + ", line ".len()..];
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn node_context_lines() {
        assert_eq!(
            super::batch_line("COPY orders_100001, line 17, column total: \"x\""),
            Some(17)
        );
        assert_eq!(super::batch_line("COPY orders_100001, line 3"), Some(3));
        assert_eq!(super::batch_line("SQL statement \"SELECT 1\""), None);
    }
}
