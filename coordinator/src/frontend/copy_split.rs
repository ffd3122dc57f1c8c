//! COPY … FROM STDIN into a distributed table, split by the coordinator:
//! each row goes by its key to its shard, in batches (one `COPY shard_table
//! FROM STDIN` each) on the connection of the shard's worker, within the
//! client's transaction or an implicit one that commits at the end (two-
//! phase commit when several workers took rows). A batch is sent without
//! waiting for the one before it on another worker, so the workers load in
//! parallel while the coordinator reads on. A row a worker refuses, or one
//! the coordinator cannot route, fails the whole COPY with its line number.

use super::copy_rows::{KeyValue, Row, RowReader, BINARY_HEADER, BINARY_TRAILER};
use super::*;
use crate::backend::cluster::{Table, TableKind};
use crate::backend::connection::BackendError;
use crate::net::sqlstate;
use crate::router::copy::{CopyFormat, CopyIn};
use pg_shard_core::KeyEncoding;

/// A shard's batch is sent once it holds this much.
const BATCH_BYTES: usize = 512 * 1024;

/// What the coordinator knows to split one COPY.
pub(super) struct SplitCopy {
    copy: CopyIn,
    table: Arc<Table>,
    key_index: usize,
    key_column: String,
    encoding: KeyEncoding,
    /// Columns in the data.
    columns: usize,
}

/// Rows waiting for one shard.
struct Batch {
    shard: i64,
    node: NodeId,
    table: String,
    bytes: BytesMut,
    /// The client's line of each row and the lines it spans, in order.
    lines: Vec<(u64, u64)>,
}

/// A batch sent to a node whose answer is not read yet.
struct InFlight {
    table: String,
    lines: Vec<(u64, u64)>,
}

impl Session {
    /// A COPY of a distributed table in `sql` that the coordinator runs
    /// itself (FROM STDIN split by key, TO STDOUT streamed from the
    /// shards): the statement, its table, and the columns of its data (its
    /// list, or every column but the generated ones).
    pub(super) fn distributed_copy(
        &self,
        sql: &str,
        map: &ClusterMap,
    ) -> Option<(CopyIn, Arc<Table>, Vec<String>)> {
        let head = sql.trim_start().get(..4)?;
        if !head.eq_ignore_ascii_case("copy") || !self.routing {
            return None;
        }
        if self.tx.state == TxState::Failed
            || self.tx.metadata_distributed
            || self.session_targets.contains(&Target::Metadata)
            || self.held.is_some()
        {
            return None;
        }
        let copy = router::copy::copy_statement(sql)?;
        let search_path = match (&copy.schema, self.known_search_path()) {
            (Some(_), _) => &[][..],
            (None, Some(path)) => path,
            (None, None) => return None,
        };
        let table = map
            .table(copy.schema.as_deref(), &copy.name, search_path)?
            .clone();
        // (Rows of a table with lookups go through the metadata node,
        // which keeps the lookups.)
        if !matches!(table.kind, TableKind::Distributed { .. })
            || (!copy.out && table.writes_via_metadata())
        {
            return None;
        }
        let columns = match &copy.columns {
            Some(columns) => columns.clone(),
            None => table
                .columns
                .iter()
                .filter(|c| !table.generated_columns.contains(*c))
                .cloned()
                .collect(),
        };
        Some((copy, table, columns))
    }

    /// A COPY FROM STDIN the coordinator splits: with a key it can find in
    /// every row, and the client's encoding UTF8 (keys hash as UTF-8).
    pub(super) fn split_copy(
        &self,
        copy: CopyIn,
        table: Arc<Table>,
        columns: Vec<String>,
    ) -> Option<SplitCopy> {
        if copy.out || !self.utf8_client {
            return None;
        }
        let TableKind::Distributed {
            column, encoding, ..
        } = &table.kind
        else {
            return None;
        };
        // Defaults the metadata node fills in (from its sequences) must be
        // in the data; generated columns each node computes alike.
        let unfilled = table
            .filled_columns
            .iter()
            .any(|c| !columns.contains(c) && !table.generated_columns.contains(c));
        if unfilled {
            return None;
        }
        let key_index = columns.iter().position(|c| c == column)?;
        Some(SplitCopy {
            columns: columns.len(),
            key_column: column.clone(),
            encoding: *encoding,
            key_index,
            table,
            copy,
        })
    }

    /// Runs a split COPY: the client's data comes now.
    pub(super) async fn copy_split(&mut self, split: SplitCopy) -> Result<(), SessionError> {
        let map = self.map.current();
        let implicit = self.tx.state == TxState::Idle;
        if implicit {
            self.tx.begin("BEGIN".into());
        }
        let columns = split.columns;
        let binary = split.copy.format == CopyFormat::Binary;
        copy_in_response(&mut self.output, binary, columns);
        self.flush().await?;
        let mut reader = RowReader::new(&split.copy, split.key_index);
        let mut batches: HashMap<i64, Batch> = HashMap::new();
        let mut in_flight: HashMap<NodeId, InFlight> = HashMap::new();
        let mut rows: u64 = 0;
        let result: Result<(), ServerError> = 'copy: loop {
            let (message, _) = self.read_message().await?;
            let at_end = match message {
                FrontendMessage::CopyData(data) => {
                    reader.push(&data);
                    false
                }
                FrontendMessage::CopyDone => true,
                FrontendMessage::CopyFail(reason) => {
                    break Err(ServerError::new(
                        sqlstate::QUERY_CANCELED,
                        format!("COPY from stdin failed: {reason}"),
                    ));
                }
                FrontendMessage::Flush | FrontendMessage::Sync => continue,
                FrontendMessage::Terminate => return Err(SessionError::ClientGone),
                other => {
                    return Err(protocol::ProtocolError::UnexpectedType(
                        frontend_tag(&other) as char
                    )
                    .into())
                }
            };
            loop {
                let row = match reader.next_row(at_end) {
                    Ok(Some(row)) => row,
                    Ok(None) => break,
                    Err(e) => {
                        break 'copy Err(copy_error(&split, reader.line() + 1, e.to_string()));
                    }
                };
                let shard = match route_row(&split, &row) {
                    Ok(shard) => shard,
                    Err(error) => break 'copy Err(error),
                };
                rows += 1;
                let batch = batches.entry(shard.0).or_insert_with(|| Batch {
                    shard: shard.0,
                    node: shard.1,
                    table: shard.2.clone(),
                    bytes: BytesMut::new(),
                    lines: Vec::new(),
                });
                batch.bytes.extend_from_slice(&row.bytes);
                batch.lines.push((row.line, row.spans));
                if batch.bytes.len() >= BATCH_BYTES {
                    if let Some(full) = batches.remove(&shard.0) {
                        if let Err(error) = self
                            .send_batch_of_rows(&split, &map, full, &mut in_flight)
                            .await
                        {
                            break 'copy Err(error);
                        }
                    }
                }
            }
            if at_end {
                for (_, batch) in batches.drain() {
                    if let Err(error) = self
                        .send_batch_of_rows(&split, &map, batch, &mut in_flight)
                        .await
                    {
                        break 'copy Err(error);
                    }
                }
                let nodes: Vec<NodeId> = in_flight.keys().copied().collect();
                for node in nodes {
                    if let Err(error) = self.finish_in_flight(&split, node, &mut in_flight).await {
                        break 'copy Err(error);
                    }
                }
                break Ok(());
            }
        };
        // (After an error the rest of the client's data is ignored, as
        // after a server's COPY error.)
        self.end_copy(result.map(|()| rows), implicit).await
    }

    /// Ends a COPY the coordinator ran on the transaction's nodes: an
    /// implicit transaction commits, and the client hears the row count;
    /// or, after an error, everything rolls back (an explicit transaction
    /// has then failed).
    pub(super) async fn end_copy(
        &mut self,
        result: Result<u64, ServerError>,
        implicit: bool,
    ) -> Result<(), SessionError> {
        match result {
            Ok(rows) => {
                if implicit && self.commit_transaction().await.is_none() {
                    return self.finish_reply().await;
                }
                protocol::command_complete(&mut self.output, &format!("COPY {rows}"));
            }
            Err(error) => {
                self.reply_error(error);
                self.roll_back_everywhere().await;
                self.start_over(!implicit);
                self.portals.clear();
            }
        }
        self.finish_reply().await
    }

    /// Sends a shard's batch on its worker's connection (after reading the
    /// answer to the batch before it there).
    async fn send_batch_of_rows(
        &mut self,
        split: &SplitCopy,
        map: &ClusterMap,
        batch: Batch,
        in_flight: &mut HashMap<NodeId, InFlight>,
    ) -> Result<(), ServerError> {
        let node = batch.node;
        self.shared.metrics.shard(&self.database, batch.shard);
        if in_flight.contains_key(&node) {
            self.finish_in_flight(split, node, in_flight).await?;
        }
        let target = Target::Worker(node);
        self.join_for_copy(target, map).await?;
        self.tx.note_write(target, true);
        let mut out = BytesMut::with_capacity(batch.bytes.len() + 128);
        protocol::query(&mut out, &split.copy.shard_statement(&batch.table));
        let binary = split.copy.format == CopyFormat::Binary;
        let mut data = BytesMut::with_capacity(batch.bytes.len() + 32);
        if binary {
            data.extend_from_slice(BINARY_HEADER);
        }
        data.extend_from_slice(&batch.bytes);
        if binary {
            data.extend_from_slice(BINARY_TRAILER);
        }
        let at = protocol::begin_message(&mut out, tags::frontend::COPY_DATA);
        out.put_slice(&data);
        protocol::end_message(&mut out, at);
        protocol::empty(&mut out, tags::frontend::COPY_DONE);
        let Some(lease) = self.transaction_lease(target) else {
            return Err(lost(target));
        };
        if let Err(e) = lease.connection().write(&out).await {
            lease.connection().broken = true;
            return Err(participants::lost_node(target, &e));
        }
        in_flight.insert(
            node,
            InFlight {
                table: batch.table,
                lines: batch.lines,
            },
        );
        Ok(())
    }

    /// Reads a node's answer to its batch in flight.
    async fn finish_in_flight(
        &mut self,
        split: &SplitCopy,
        node: NodeId,
        in_flight: &mut HashMap<NodeId, InFlight>,
    ) -> Result<(), ServerError> {
        let Some(batch) = in_flight.remove(&node) else {
            return Ok(());
        };
        let target = Target::Worker(node);
        let Some(lease) = self.transaction_lease(target) else {
            return Err(lost(target));
        };
        let answer = lease.connection().read_answer().await;
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => {
                lease.connection().broken = true;
                return Err(participants::lost_node(target, &e));
            }
        };
        for notice in &answer.notices {
            self.pass_notice(tags::backend::NOTICE_RESPONSE, notice);
        }
        match answer.error {
            None => Ok(()),
            Some(error) => Err(worker_row_error(split, &batch, error)),
        }
    }

    /// The transaction's connection to `target`, begun there if needed.
    pub(super) async fn join_for_copy(
        &mut self,
        target: Target,
        map: &ClusterMap,
    ) -> Result<(), ServerError> {
        if self.transaction_lease(target).is_some() {
            return Ok(());
        }
        // A pooled connection whose server went away since answers nothing:
        // once, a new one.
        let mut tries = 0;
        loop {
            tries += 1;
            let mut lease = self.copy_connection(target, map).await?;
            match self.begin_for_copy(&mut lease, target, map).await {
                Ok(()) => {
                    self.tx.join(target);
                    self.tx.parked.push((target, lease));
                    return Ok(());
                }
                Err(Ok(error)) => return Err(error),
                Err(Err(e)) => {
                    lease.connection().broken = true;
                    if !lease.reused || tries > 1 {
                        return Err(participants::lost_node(target, &e));
                    }
                    self.shared.pools.discard_idle(&lease);
                }
            }
        }
    }

    /// A connection to `target` for a COPY: the client's session
    /// connection there, or one from the pool.
    async fn copy_connection(
        &mut self,
        target: Target,
        map: &ClusterMap,
    ) -> Result<Lease, ServerError> {
        if let Some(lease) = self.session_connections.remove(&target) {
            return Ok(lease);
        }
        let Target::Worker(node) = target else {
            return Err(lost(target));
        };
        let address = map
            .nodes
            .get(&node)
            .map(|n| n.address.clone())
            .ok_or_else(|| {
                ServerError::new(
                    sqlstate::CONNECTION_FAILURE,
                    "pg_shard coordinator: the node is no longer in the shard map",
                )
            })?;
        self.pooled_connection(address, "no connection for the COPY")
            .await
    }

    /// The session's settings, the map version and BEGIN (with the
    /// transaction's savepoints) on a connection the COPY joins. A
    /// server's error, or the connection's failure.
    async fn begin_for_copy(
        &mut self,
        lease: &mut Lease,
        target: Target,
        map: &ClusterMap,
    ) -> Result<(), Result<ServerError, BackendError>> {
        let prelude = self.prelude(lease.connection(), target, map, false);
        let connection = lease.connection();
        connection.last_session = self.serial;
        for statement in [&prelude.settings, &prelude.begin].into_iter().flatten() {
            connection.send_query(statement).await.map_err(Err)?;
            let answer = connection.read_answer().await.map_err(Err)?;
            if let Some(error) = answer.error {
                connection.session_settings = None;
                return Err(Ok(error));
            }
        }
        if prelude.settings.is_some() {
            connection.session_settings = Some(self.settings.clone());
        }
        if prelude.declares_version {
            connection.declared_map_version = map.version;
        }
        Ok(())
    }

    pub(super) fn transaction_lease(&mut self, target: Target) -> Option<&mut Lease> {
        self.tx
            .pinned
            .iter_mut()
            .chain(self.tx.parked.iter_mut())
            .find(|(t, _)| *t == target)
            .map(|(_, lease)| lease)
    }
}

/// CopyInResponse: the overall format and each column's.
fn copy_in_response(out: &mut BytesMut, binary: bool, columns: usize) {
    let at = protocol::begin_message(out, tags::backend::COPY_IN_RESPONSE);
    out.put_u8(u8::from(binary));
    out.put_i16(columns.min(i16::MAX as usize) as i16);
    for _ in 0..columns.min(i16::MAX as usize) {
        out.put_i16(i16::from(binary));
    }
    protocol::end_message(out, at);
}

/// The shard a row goes to: (shard id, node, shard table).
fn route_row(split: &SplitCopy, row: &Row) -> Result<(i64, NodeId, String), ServerError> {
    let TableKind::Distributed { shards, .. } = &split.table.kind else {
        return Err(copy_error(
            split,
            row.line,
            "not a distributed table".into(),
        ));
    };
    let id = match &row.key {
        KeyValue::Text(text) => split.encoding.keyspace_id_of_text_form(text),
        KeyValue::Binary(bytes) => router::binary_key_id(bytes, split.encoding),
        KeyValue::Null => {
            return Err(ServerError::new(
                "23502",
                format!(
                    "null value in distribution column \"{}\" of relation {}",
                    split.key_column, split.table.name
                ),
            )
            .with_context(copy_context(split, row.line)))
        }
        KeyValue::Missing => {
            return Err(ServerError::new(
                "22P04",
                format!("missing data for column \"{}\"", split.key_column),
            )
            .with_context(copy_context(split, row.line)))
        }
    };
    let Some(id) = id else {
        let value = match &row.key {
            KeyValue::Text(text) => text.clone(),
            _ => "(binary)".into(),
        };
        return Err(ServerError::new(
            "22P02",
            format!(
                "invalid input for distribution column \"{}\" ({} key): \"{value}\"",
                split.key_column,
                split.encoding.name()
            ),
        )
        .with_context(copy_context(split, row.line)));
    };
    let (_, placement) = shards.lookup(id);
    Ok((
        placement.shard_id,
        placement.node,
        placement.qualified_name.clone(),
    ))
}

fn copy_context(split: &SplitCopy, line: u64) -> String {
    format!("COPY {}, line {line}", split.table.name)
}

fn copy_error(split: &SplitCopy, line: u64, message: String) -> ServerError {
    ServerError::new("22P04", message).with_context(copy_context(split, line))
}

/// A worker's error for a batch, with the line as the client counts it:
/// "COPY accounts_100001, line 3, column balance: …" becomes "COPY
/// accounts, line 41, column balance: …".
fn worker_row_error(split: &SplitCopy, batch: &InFlight, mut error: ServerError) -> ServerError {
    let context = error.take_context().unwrap_or_default();
    let first = context.lines().next().unwrap_or("");
    let in_batch = first.split_once(", line ").and_then(|(_, rest)| {
        let digits = rest.chars().take_while(char::is_ascii_digit).count();
        let n = rest[..digits].parse::<usize>().ok()?;
        Some((n, rest[digits..].to_string()))
    });
    match in_batch {
        Some((n, column_part)) => {
            // The worker counts the batch's lines (quoted newlines
            // included): the row whose lines hold line n.
            let mut seen = 0;
            let line = batch
                .lines
                .iter()
                .find(|(_, spans)| {
                    seen += spans;
                    seen >= n as u64
                })
                .map_or(0, |(line, _)| *line);
            error.with_context(format!("{}{column_part}", copy_context(split, line)))
        }
        None => error.with_context(format!("{context} (in the rows of {})", batch.table)),
    }
}

fn lost(target: Target) -> ServerError {
    participants::lost_node(target, &BackendError::Closed)
}
