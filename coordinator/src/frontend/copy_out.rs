//! COPY distributed_table TO STDOUT, streamed from the shards: each shard
//! table's COPY on its worker, one after the other in key order, relayed to
//! the client as one COPY (one CSV header, one binary header and trailer).
//! Inside a transaction it reads on the transaction's connections (it sees
//! the transaction's writes); each shard is read at its own moment, as the
//! metadata node's executor reads shards.

use super::copy_rows::{BINARY_HEADER, BINARY_TRAILER};
use super::*;
use crate::backend::cluster::{Table, TableKind};
use crate::net::sqlstate;
use crate::router::copy::{CopyFormat, CopyIn};

/// A COPY TO the coordinator streams from the shards.
pub(super) struct CopyOut {
    copy: CopyIn,
    /// The shard tables in key order, with their nodes.
    placements: Vec<(NodeId, String)>,
    columns: usize,
}

impl Session {
    /// A COPY TO STDOUT the coordinator streams from the shards (not in a
    /// transaction that reached the metadata node, which may have written
    /// the table through its own connections).
    pub(super) fn copy_out_plan(
        &self,
        copy: CopyIn,
        table: &Table,
        columns: usize,
    ) -> Option<CopyOut> {
        if !copy.out || self.tx.has_begun_on(Target::Metadata) {
            return None;
        }
        let TableKind::Distributed { shards, .. } = &table.kind else {
            return None;
        };
        let placements = shards
            .entries()
            .iter()
            .map(|(_, placement)| (placement.node, placement.qualified_name.clone()))
            .collect();
        Some(CopyOut {
            copy,
            placements,
            columns,
        })
    }

    /// Streams the shards' rows to the client.
    pub(super) async fn copy_out(&mut self, plan: CopyOut) -> Result<(), SessionError> {
        let CopyOut {
            copy,
            placements,
            columns,
        } = plan;
        let map = self.map.current();
        let implicit = self.tx.state == TxState::Idle;
        if implicit {
            self.tx.begin("BEGIN".into());
        }
        let binary = copy.format == CopyFormat::Binary;
        // The client is told at once; an error later ends the COPY there.
        copy_out_response(&mut self.output, binary, columns);
        if binary {
            copy_data(&mut self.output, BINARY_HEADER);
        }
        let mut rows: u64 = 0;
        let mut result = Ok(());
        for (index, (node, table)) in placements.iter().enumerate() {
            let target = Target::Worker(*node);
            if let Err(error) = self.join_for_copy(target, &map).await {
                result = Err(error);
                break;
            }
            let statement = copy.shard_statement_with(table, copy.header && index == 0);
            match self.relay_shard_copy(target, &statement, binary).await {
                Ok(count) => rows += count,
                Err(error) => {
                    result = Err(error);
                    break;
                }
            }
        }
        if result.is_ok() {
            if binary {
                copy_data(&mut self.output, BINARY_TRAILER);
            }
            protocol::empty(&mut self.output, tags::frontend::COPY_DONE);
        }
        self.end_copy(result.map(|()| rows), implicit).await
    }

    /// Runs one shard's COPY TO and passes its data on as it comes
    /// (without the binary header and trailer, which the client gets
    /// once). The rows.
    async fn relay_shard_copy(
        &mut self,
        target: Target,
        statement: &str,
        binary: bool,
    ) -> Result<u64, ServerError> {
        // Out of the transaction while it streams (the client's output is
        // written meanwhile), back after.
        if matches!(&self.tx.pinned, Some((t, _)) if *t == target) {
            if let Some((_, mut lease)) = self.tx.pinned.take() {
                let streamed = self
                    .stream_shard_copy(&mut lease, target, statement, binary)
                    .await;
                self.tx.pinned = Some((target, lease));
                return streamed;
            }
        }
        let Some(at) = self.tx.parked.iter().position(|(t, _)| *t == target) else {
            return Err(ServerError::new(
                sqlstate::CONNECTION_FAILURE,
                "pg_shard coordinator: lost a connection of the transaction",
            ));
        };
        let (_, mut lease) = self.tx.parked.swap_remove(at);
        let streamed = self
            .stream_shard_copy(&mut lease, target, statement, binary)
            .await;
        self.tx.parked.push((target, lease));
        streamed
    }

    async fn stream_shard_copy(
        &mut self,
        lease: &mut Lease,
        target: Target,
        statement: &str,
        binary: bool,
    ) -> Result<u64, ServerError> {
        let connection = lease.connection();
        let mut out = BytesMut::new();
        protocol::query(&mut out, statement);
        if let Err(e) = connection.write(&out).await {
            return Err(participants::lost_node(target, &e));
        }
        let mut header_left = if binary { BINARY_HEADER.len() } else { 0 };
        let mut error = None;
        let mut rows = 0;
        loop {
            let (tag, body) = match connection.read().await {
                Ok(message) => message,
                Err(e) => {
                    connection.broken = true;
                    return Err(participants::lost_node(target, &e));
                }
            };
            match tag {
                tags::frontend::COPY_DATA => {
                    let mut data = &body[..];
                    if header_left > 0 {
                        let skip = header_left.min(data.len());
                        data = &data[skip..];
                        header_left -= skip;
                    }
                    if (binary && data == BINARY_TRAILER) || data.is_empty() {
                        continue;
                    }
                    copy_data(&mut self.output, data);
                    // A client gone: the session ends at its next read.
                    if self.output.len() >= OUTPUT_FLUSH_BYTES && self.flush().await.is_err() {
                        connection.broken = true;
                    }
                }
                tags::backend::COMMAND_COMPLETE => {
                    let tag = String::from_utf8_lossy(&body);
                    rows = tag
                        .trim_end_matches('\0')
                        .rsplit(' ')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                }
                tags::backend::ERROR_RESPONSE if error.is_none() => {
                    error = Some(ServerError::parse(&body))
                }
                tags::backend::READY_FOR_QUERY => {
                    connection.status = body.first().copied().unwrap_or(tags::status::FAILED);
                    break;
                }
                _ => {}
            }
        }
        match error {
            Some(error) => Err(error),
            None => Ok(rows),
        }
    }
}

fn copy_out_response(out: &mut BytesMut, binary: bool, columns: usize) {
    let at = protocol::begin_message(out, b'H');
    out.put_u8(u8::from(binary));
    let columns = columns.min(i16::MAX as usize);
    out.put_i16(columns as i16);
    for _ in 0..columns {
        out.put_i16(i16::from(binary));
    }
    protocol::end_message(out, at);
}

fn copy_data(out: &mut BytesMut, data: &[u8]) {
    let at = protocol::begin_message(out, tags::frontend::COPY_DATA);
    out.put_slice(data);
    protocol::end_message(out, at);
}
