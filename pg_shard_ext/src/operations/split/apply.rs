//! A split's own apply: the changes read from one of the job's slots
//! (`pgoutput` messages, decoded by the core crate) become statements on
//! the tables they belong to, committed together with the position they
//! reach. Forward (until the cutover) the source tables' changes go to the
//! half each row belongs to; in reverse (after it, until the job completes
//! or reverts) the halves' changes go back to the source tables.

use super::tables::{Half, Ranges, SplitTable};
use crate::error::{Result, ShardError};
use crate::operations::job::Job;
use crate::operations::node_access::{connect, run_on, value_on};
use crate::operations::replication::{marker_table, Link};
use crate::operations::settings::{APPLY_WAIT, FINAL_WAIT};
use crate::quote;
use crate::spi::query_one;
use crate::transaction::client as remote;
use pg_shard_core::pgoutput::{self, Lsn, Message, SnapshotVisibility, Value};
use postgres::Client;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How long a read of the slot waits for the walsender of a stream that
/// holds the slot to end once told to.
const SLOT_RELEASE_WAIT: Duration = Duration::from_secs(10);

/// Messages read from the slot per round (a change, or a transaction's
/// begin or commit).
pub(crate) const CHANGES_PER_ROUND: i64 = 10_000;

/// A connection to read the slot and apply its changes on: values are
/// decoded in this session's text forms, and bytea keys are read from the
/// hex form whatever the server's default.
pub(crate) fn connection(job: &Job) -> Result<Client> {
    let mut node = connect(&job.source)?;
    run_on(&job.source, &mut node, "SET bytea_output = hex")?;
    Ok(node)
}

/// Flushes the node's WAL and returns the flushed position: with the
/// source tables locked, every change to them is before it.
pub(crate) fn flushed_position(job: &Job, node: &mut Client) -> Result<Lsn> {
    parse_position(value_on::<String>(&job.source, node, FLUSH_WAL)?)
}

/// The statement that flushes the node's WAL and returns the position.
pub(crate) const FLUSH_WAL: &str = "SELECT pg_shard.flush_wal()";

/// A WAL position as `pg_shard.flush_wal()` returns it.
pub(crate) fn parse_position(text: Option<String>) -> Result<Lsn> {
    text.as_deref()
        .and_then(Lsn::parse)
        .ok_or_else(|| ShardError::InvalidArgument("the node returned no WAL position".into()))
}

/// Brings the point a slot's reads decode from up to now, before a pause
/// (best effort). Every read of a slot (`peek`, and the `advance` after
/// it) decodes the WAL from the slot's restart point, which moves only
/// past a record of the running transactions: PostgreSQL writes one every
/// 15 s, so under load each read decodes megabytes again (measured: the
/// advance alone took 10 ms at 2 MB behind, 150 ms at 35 MB). Creating a
/// logical slot writes such a record at once: a temporary one is made and
/// dropped, and the next round's advance moves the job's slot's restart
/// point to it. (It waits for the transactions in progress, at most
/// [`RESTART_POINT_WAIT`]: before the cutover writes the map, outside the
/// pause.)
pub(crate) fn refresh_restart_point(job: &Job, node: &mut Client) {
    let name = format!("{}_restart", Link::forward(job).name);
    let name = quote::literal(&name);
    // Bounded: the record is written before the slot's wait for the
    // transactions in progress, so one given up still served.
    let refreshed = run_on(
        &job.source,
        node,
        &format!("SET statement_timeout = {}", RESTART_POINT_WAIT.as_millis()),
    )
    .and_then(|()| {
        run_on(
            &job.source,
            node,
            &format!(
                "SELECT pg_catalog.pg_create_logical_replication_slot({name}, 'pgoutput', true)"
            ),
        )
    })
    .and_then(|()| {
        run_on(
            &job.source,
            node,
            &format!("SELECT pg_catalog.pg_drop_replication_slot({name})"),
        )
    });
    let reset = run_on(&job.source, node, "RESET statement_timeout");
    if let Err(e) = refreshed.and(reset) {
        pgrx::log!(
            "pg_shard job {}: the slot's restart point was not refreshed: {e}",
            job.job_id
        );
    }
}

/// How long the temporary slot of [`refresh_restart_point`] may wait for
/// the node's transactions in progress.
const RESTART_POINT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Which way changes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Source tables to halves, from the copy's snapshot on.
    Forward,
    /// Halves back to the source tables, from the cutover on.
    Reverse,
}

impl Direction {
    /// The slot (and publication) read.
    pub(super) fn slot(self, job: &Job) -> String {
        match self {
            Direction::Forward => Link::forward(job).name,
            Direction::Reverse => Link::reverse(job).name,
        }
    }

    /// The progress table's row of this direction.
    pub(crate) fn progress_key(self, job: &Job) -> i64 {
        match self {
            Direction::Forward => job.job_id,
            Direction::Reverse => -job.job_id,
        }
    }
}

/// What one read of the slot found: the messages read, the statements
/// applying the changes not applied yet (with the progress row's update;
/// none when there are none), and where the slot may advance to.
struct Batch {
    read: i64,
    statements: Vec<String>,
    end: Lsn,
}

/// `statements` after the setting that lets them write frozen or retired
/// shard tables as replication does (no guard triggers, no read fence) for
/// the rest of the transaction.
fn as_replication(statements: &[String]) -> String {
    format!(
        "SET LOCAL session_replication_role = replica;\n{}",
        statements.join(";\n")
    )
}

/// `statements` as the start of a transaction's script (each ended by
/// `;`), or nothing when there are none.
pub(super) fn last_writes(statements: &[String]) -> String {
    if statements.is_empty() {
        return String::new();
    }
    format!("{};\n", as_replication(statements))
}

/// What a run of the slot's messages asks of the tables: the statements
/// of the changes not applied yet (those of a transaction at or before
/// what the progress row says was applied are skipped, and forward those
/// of the transactions the copy's snapshot saw), read in order.
pub(super) struct Changes {
    applied: Lsn,
    seen_by_copy: Option<SnapshotVisibility>,
    relations: HashMap<u32, pgoutput::Relation>,
    skipping: bool,
    /// The last transaction read: its commit record, and just past it.
    last_final: Option<Lsn>,
    last_end: Option<Lsn>,
    statements: Vec<String>,
}

impl Changes {
    pub(super) fn new(apply: &Apply, applied: Lsn) -> Result<Changes> {
        Ok(Changes {
            applied,
            seen_by_copy: apply.seen_by_copy()?,
            relations: HashMap::new(),
            skipping: true,
            last_final: None,
            last_end: None,
            statements: Vec::new(),
        })
    }

    /// Takes the next message.
    pub(super) fn take(&mut self, apply: &Apply, message: Message) -> Result<()> {
        match message {
            Message::Begin { final_lsn, xid } => {
                self.skipping = final_lsn <= self.applied
                    || self
                        .seen_by_copy
                        .as_ref()
                        .is_some_and(|seen| seen.sees(xid));
                self.last_final = Some(final_lsn);
            }
            Message::Commit { end_lsn, .. } => self.last_end = Some(end_lsn),
            Message::Relation(relation) => {
                self.relations.insert(relation.relid, relation);
            }
            change if !self.skipping => self
                .statements
                .extend(apply.change_statements(&change, &self.relations)?),
            _ => {}
        }
        Ok(())
    }

    /// How many statements are waiting.
    pub(super) fn waiting(&self) -> usize {
        self.statements.len()
    }

    /// The statements taken so far, with the progress row's update to the
    /// last transaction read (none when there are none); what comes next
    /// is applied after them.
    pub(super) fn statements(&mut self, apply: &Apply) -> Vec<String> {
        let mut statements = std::mem::take(&mut self.statements);
        if let Some(final_lsn) = self.last_final.filter(|lsn| *lsn > self.applied) {
            statements.push(apply.progress_update(final_lsn));
            self.applied = final_lsn;
        }
        statements
    }
}

/// One direction of a split's apply.
pub(crate) struct Apply<'a> {
    pub(crate) job: &'a Job,
    pub(crate) tables: &'a [SplitTable],
    pub(crate) ranges: &'a Ranges,
    pub(crate) direction: Direction,
}

impl Apply<'_> {
    /// Applies rounds up to `point` until one reads less than a round's worth
    /// (it then read everything committed before `point`), within
    /// [`FINAL_WAIT`]; `what` names the point in the timeout's error.
    pub(crate) fn up_to(&self, node: &mut Client, point: Lsn, what: &str) -> Result<()> {
        let started = Instant::now();
        while self.round(node, Some(point))? >= CHANGES_PER_ROUND {
            if started.elapsed() > FINAL_WAIT {
                return Err(ShardError::Timeout(format!(
                    "{what} not applied within {FINAL_WAIT:?}"
                )));
            }
        }
        Ok(())
    }

    /// Reads the next changes from the slot (those committed before `upto`,
    /// or before the current end of WAL), applies the ones not applied yet
    /// and advances the slot; returns the number of messages read.
    pub(crate) fn round(&self, node: &mut Client, upto: Option<Lsn>) -> Result<i64> {
        let batch = self.read(node, upto)?;
        self.write(node, &batch)?;
        Ok(batch.read)
    }

    /// How long the cutover's last reads may take (under its lock,
    /// [`super::stream::Streamed::finish`]): the job's
    /// `pg_shard.cutover_apply_timeout`.
    pub(crate) fn drain_limit(&self) -> Result<Duration> {
        self.job.recorded_wait(APPLY_WAIT.0, APPLY_WAIT.1)
    }

    /// Runs `statements` in a transaction of their own.
    pub(super) fn apply(&self, node: &mut Client, statements: &[String]) -> Result<()> {
        if statements.is_empty() {
            return Ok(());
        }
        run_on(
            &self.job.source,
            node,
            &format!("BEGIN;\n{};\nCOMMIT", as_replication(statements)),
        )
    }

    /// Applies a batch in a transaction of its own, then advances the slot
    /// past it.
    fn write(&self, node: &mut Client, batch: &Batch) -> Result<()> {
        let job = self.job;
        self.apply(node, &batch.statements)?;
        run_on(
            &job.source,
            node,
            &format!(
                "SELECT pg_replication_slot_advance({}, {}) \
             FROM pg_replication_slots WHERE slot_name = {0} AND confirmed_flush_lsn < {1}",
                quote::literal(&self.direction.slot(job)),
                quote::literal(&batch.end.to_string())
            ),
        )
    }

    /// Reads the next changes from the slot (those committed before `upto`,
    /// or before the current end of WAL): the statements that apply the
    /// ones not applied yet, with the progress row's update.
    fn read(&self, node: &mut Client, upto: Option<Lsn>) -> Result<Batch> {
        let job = self.job;
        let name = self.direction.slot(job);
        // Read before the changes: the slot may advance to it only if every
        // transaction committed before it was read. Decoding stops at the
        // flushed end of WAL (the local cluster commits asynchronously), and so
        // must this position.
        let upto = match upto {
            Some(lsn) => lsn,
            None => {
                value_on::<String>(&job.source, node, "SELECT pg_current_wal_flush_lsn()::text")?
                    .and_then(|text| Lsn::parse(&text))
                    .unwrap_or_default()
            }
        };
        // What the progress row says was applied comes with each change
        // (one round trip; no change, no need of it).
        let peek = format!(
            "SELECT ({}), data \
             FROM pg_logical_slot_peek_binary_changes({}, {}, {CHANGES_PER_ROUND}, \
                 'proto_version', '1', 'publication_names', {})",
            self.applied_query(),
            quote::literal(&name),
            quote::literal(&upto.to_string()),
            quote::literal(&name),
        );
        // A cutover's stream of the slot ([`super::stream`]) holds it until
        // its walsender has gone: a moment after the stream closed, or
        // longer when its runner died (the walsender may be decoding a
        // large transaction, or not notice for a while). Only the job reads
        // its slot: whoever holds it is ended, waited for, and the read
        // tried again (once).
        let rows = match node.query_typed(&peek, &[]) {
            Err(e) if e.code() == Some(&postgres::error::SqlState::OBJECT_IN_USE) => {
                run_on(
                    &job.source,
                    node,
                    &format!(
                        "SELECT pg_catalog.pg_terminate_backend(active_pid, {}) \
                         FROM pg_catalog.pg_replication_slots \
                         WHERE slot_name = {} AND active_pid IS NOT NULL",
                        SLOT_RELEASE_WAIT.as_millis(),
                        quote::literal(&name)
                    ),
                )?;
                node.query_typed(&peek, &[])
            }
            rows => rows,
        }
        .map_err(|e| remote::remote_error(&job.source, &e))?;
        let applied = rows
            .first()
            .and_then(|row| row.get::<_, Option<String>>(0))
            .and_then(|text| Lsn::parse(&text))
            .unwrap_or_default();
        let mut changes = Changes::new(self, applied)?;
        for row in &rows {
            let data: &[u8] = row.get(1);
            let message = pgoutput::decode(data)
                .map_err(|e| ShardError::InvalidArgument(format!("reading slot {name}: {e}")))?;
            changes.take(self, message)?;
        }
        // A full round may have stopped early: the slot goes to the end of
        // what was read, else to `upto` (nothing published committed before it
        // that was not read).
        let complete = (rows.len() as i64) < CHANGES_PER_ROUND;
        let end = match changes.last_end {
            Some(end) if !complete => end,
            _ => upto,
        };
        Ok(Batch {
            read: rows.len() as i64,
            statements: changes.statements(self),
            end,
        })
    }

    /// Forward, the transactions the copy's snapshot saw (the copy has
    /// their changes); in reverse none: every transaction after the
    /// cutover's position is the new owners'.
    fn seen_by_copy(&self) -> Result<Option<SnapshotVisibility>> {
        let job = self.job;
        match self.direction {
            Direction::Forward => Ok(Some(
                query_one::<String>(
                    "SELECT resources->>'copy_snapshot' FROM pg_shard.job WHERE job_id = $1",
                    &[job.job_id.into()],
                )?
                .and_then(|text| SnapshotVisibility::parse(&text))
                .ok_or_else(|| {
                    ShardError::InvalidArgument(format!("job {} has no copy snapshot", job.job_id))
                })?,
            )),
            Direction::Reverse => Ok(None),
        }
    }

    /// The progress row's `applied` position, as text (no row: nothing
    /// was applied).
    pub(super) fn applied_query(&self) -> String {
        format!(
            "SELECT applied::text FROM {} WHERE job = {}",
            marker_table(self.job),
            self.direction.progress_key(self.job),
        )
    }

    /// The progress row's `UPDATE` to `position`.
    fn progress_update(&self, position: Lsn) -> String {
        format!(
            "UPDATE {} SET applied = '{position}' WHERE job = {}",
            marker_table(self.job),
            self.direction.progress_key(self.job),
        )
    }

    /// The statements applying one change: forward, of a source table to
    /// its halves; in reverse, of a half to its source table.
    fn change_statements(
        &self,
        change: &Message,
        relations: &HashMap<u32, pgoutput::Relation>,
    ) -> Result<Vec<String>> {
        let relid = match change {
            Message::Insert { relid, .. }
            | Message::Update { relid, .. }
            | Message::Delete { relid, .. } => *relid,
            Message::Truncate { relids } => {
                let mut statements = Vec::new();
                for relid in relids {
                    if let Some((table, half)) = self.table_of(*relid, relations) {
                        statements.push(self.truncate(table, half));
                    }
                }
                return Ok(statements);
            }
            _ => return Ok(Vec::new()),
        };
        let relation = relations.get(&relid).ok_or_else(|| {
            ShardError::InvalidArgument(format!(
                "change of relation {relid} before its description"
            ))
        })?;
        let Some((table, _)) = self.table_of(relid, relations) else {
            return Ok(Vec::new());
        };
        let row = RowImage {
            columns: &relation.columns,
            table,
            ranges: self.ranges,
            only: (self.direction == Direction::Reverse).then(|| table.source_half()),
        };
        match change {
            Message::Insert { new, .. } => {
                let half = row.half_of(new)?.ok_or_else(|| {
                    ShardError::InvalidArgument("an inserted row without its key".into())
                })?;
                Ok(vec![row.insert(half, new)])
            }
            Message::Update { old, new, .. } => row.update(old.as_deref(), new),
            Message::Delete { old, .. } => Ok(row.delete(old)?),
            _ => Ok(Vec::new()),
        }
    }

    /// The split table a changed relation belongs to: forward its source
    /// table, in reverse one of its halves (which one, as the second value).
    fn table_of<'t>(
        &'t self,
        relid: u32,
        relations: &HashMap<u32, pgoutput::Relation>,
    ) -> Option<(&'t SplitTable, Option<&'t Half>)> {
        let relation = relations.get(&relid)?;
        self.tables
            .iter()
            .filter(|t| t.source.schema == relation.namespace)
            .find_map(|t| match self.direction {
                Direction::Forward => (t.source.name == relation.name).then_some((t, None)),
                Direction::Reverse => t
                    .halves()
                    .into_iter()
                    .find(|h| h.name == relation.name)
                    .map(|h| (t, Some(h))),
            })
    }

    /// A TRUNCATE of a source table empties both halves; one of a half
    /// deletes that half's range from the source table.
    fn truncate(&self, table: &SplitTable, half: Option<&Half>) -> String {
        let Some(half) = half else {
            return format!(
                "TRUNCATE {}, {}",
                table.qualified(&table.lower),
                table.qualified(&table.upper)
            );
        };
        let (start, end) = if half.shard_id == table.lower.shard_id {
            (self.ranges.range_start, self.ranges.split_at - 1)
        } else {
            (self.ranges.split_at, self.ranges.range_end)
        };
        format!(
            "DELETE FROM {} WHERE pg_shard.keyspace_id({}) BETWEEN {start} AND {end}",
            table.source.qualified(),
            quote::ident(table.source.dist_column.as_deref().unwrap_or_default())
        )
    }
}

/// A row image of a changed table and the statements that apply it.
struct RowImage<'a> {
    columns: &'a [String],
    table: &'a SplitTable,
    ranges: &'a Ranges,
    /// The one table every change goes to (in reverse, the source table);
    /// None: the half the row's key belongs to.
    only: Option<Half>,
}

impl RowImage<'_> {
    fn value<'v>(&self, values: &'v [Value], column: &str) -> Option<&'v Value> {
        let index = self.columns.iter().position(|c| c == column)?;
        values.get(index)
    }

    /// The half the image's distribution key belongs to; None when the key
    /// was not sent (an unchanged TOASTed value).
    fn half_of(&self, values: &[Value]) -> Result<Option<&Half>> {
        if let Some(only) = &self.only {
            return Ok(Some(only));
        }
        let dist = self.table.source.dist_column.as_deref().unwrap_or_default();
        match self.value(values, dist) {
            Some(Value::Text(key)) => Ok(Some(if self.ranges.upper(key)? {
                &self.table.upper
            } else {
                &self.table.lower
            })),
            _ => Ok(None),
        }
    }

    fn literal(value: &Value) -> String {
        match value {
            Value::Text(text) => quote::literal(text),
            Value::Null | Value::Unchanged => "NULL".into(),
        }
    }

    /// The condition finding the image's row in `half`: `key = value AND …`,
    /// or under REPLICA IDENTITY FULL the first row with all its values.
    fn row_condition(&self, half: &Half, values: &[Value]) -> Result<String> {
        let full = self.table.key_columns.is_empty();
        let columns: Vec<&String> = if full {
            self.columns.iter().collect()
        } else {
            self.table.key_columns.iter().collect()
        };
        let mut conditions = Vec::new();
        for column in columns {
            let value = match self.value(values, column) {
                Some(Value::Text(text)) => quote::literal(text),
                Some(Value::Null) if full => "NULL".to_string(),
                _ => {
                    return Err(ShardError::InvalidArgument(format!(
                        "a change of {} without its key column {column}",
                        self.table.source.qualified()
                    )))
                }
            };
            let operator = if full { "IS NOT DISTINCT FROM" } else { "=" };
            conditions.push(format!("{} {operator} {value}", quote::ident(column)));
        }
        if full {
            return Ok(format!(
                "ctid = (SELECT ctid FROM {} WHERE {} LIMIT 1)",
                self.table.qualified(half),
                conditions.join(" AND ")
            ));
        }
        Ok(conditions.join(" AND "))
    }

    fn insert(&self, half: &Half, values: &[Value]) -> String {
        let columns: Vec<String> = self.columns.iter().map(|c| quote::ident(c)).collect();
        let literals: Vec<String> = values.iter().map(Self::literal).collect();
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            self.table.qualified(half),
            columns.join(", "),
            literals.join(", ")
        )
    }

    fn delete(&self, old: &[Value]) -> Result<Vec<String>> {
        let halves: Vec<&Half> = match self.half_of(old)? {
            Some(half) if self.old_image_has_dist() => vec![half],
            _ => self.candidates(),
        };
        halves
            .into_iter()
            .map(|half| {
                Ok(format!(
                    "DELETE FROM {} WHERE {}",
                    self.table.qualified(half),
                    self.row_condition(half, old)?
                ))
            })
            .collect()
    }

    /// The tables a row whose key was not sent may be in.
    fn candidates(&self) -> Vec<&Half> {
        match &self.only {
            Some(only) => vec![only],
            None => self.table.halves().to_vec(),
        }
    }

    /// Whether old row images carry the distribution column: it is part of
    /// the key, or the whole row is sent.
    fn old_image_has_dist(&self) -> bool {
        let dist = self.table.source.dist_column.as_deref().unwrap_or_default();
        self.table.key_columns.is_empty() || self.table.key_columns.iter().any(|c| c == dist)
    }

    /// An update: in place when the row stays in its half, otherwise moved
    /// (deleted from whichever half holds it, inserted into the new one,
    /// unsent TOASTed values taken from the old row).
    fn update(&self, old: Option<&[Value]>, new: &[Value]) -> Result<Vec<String>> {
        let key_image = old.unwrap_or(new);
        let new_half = self.half_of(new)?;
        // The old row's half: from the old image, or from the new one when
        // the key (with the distribution column in it) did not change.
        let old_half = match old {
            Some(old) => self.half_of(old)?,
            None if self.old_image_has_dist() || self.only.is_some() => new_half,
            None => None,
        };
        let assignments: Vec<String> = self
            .columns
            .iter()
            .zip(new)
            .filter(|(_, value)| **value != Value::Unchanged)
            .map(|(column, value)| format!("{} = {}", quote::ident(column), Self::literal(value)))
            .collect();
        let in_place = |halves: Vec<&Half>| -> Result<Vec<String>> {
            halves
                .into_iter()
                .map(|half| {
                    Ok(format!(
                        "UPDATE {} SET {} WHERE {}",
                        self.table.qualified(half),
                        assignments.join(", "),
                        self.row_condition(half, key_image)?
                    ))
                })
                .collect()
        };
        match (old_half, new_half) {
            // The key's half did not change (or the key was not sent, so it
            // did not change either).
            (Some(old), Some(new)) if old.shard_id == new.shard_id => in_place(vec![new]),
            (Some(old), None) => in_place(vec![old]),
            (None, None) => in_place(self.candidates()),
            (_, Some(new_half)) => {
                let selected: Vec<String> = self
                    .columns
                    .iter()
                    .zip(new)
                    .map(|(column, value)| match value {
                        Value::Unchanged => format!("moved.{}", quote::ident(column)),
                        other => Self::literal(other),
                    })
                    .collect();
                let columns: Vec<String> = self.columns.iter().map(|c| quote::ident(c)).collect();
                Ok(vec![format!(
                    "WITH from_lower AS (DELETE FROM {lower} WHERE {lower_row} RETURNING *), \
                          from_upper AS (DELETE FROM {upper} WHERE {upper_row} RETURNING *) \
                     INSERT INTO {target} ({columns}) \
                     SELECT {selected} FROM (SELECT * FROM from_lower UNION ALL SELECT * FROM from_upper) moved",
                    lower = self.table.qualified(&self.table.lower),
                    upper = self.table.qualified(&self.table.upper),
                    lower_row = self.row_condition(&self.table.lower, key_image)?,
                    upper_row = self.row_condition(&self.table.upper, key_image)?,
                    target = self.table.qualified(new_half),
                    columns = columns.join(", "),
                    selected = selected.join(", "),
                )])
            }
        }
    }
}
