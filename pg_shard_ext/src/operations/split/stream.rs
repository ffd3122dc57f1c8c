//! The cutover's reads of a split's slot (and a revert's), over a
//! replication stream rather than `pg_logical_slot_peek_binary_changes`.
//!
//! Each SQL read of a slot starts a logical decoding of its own: the
//! decoding context set up, the WAL read again from the slot's restart
//! point, and the backend's catalog caches thrown away after it — the
//! largest part of a split's pause (3–10 ms of it, measured). A walsender
//! decodes as the WAL comes, with its caches warm: the stream is opened
//! before the lock and brought up to date; under the lock only the last
//! writes come through it.
//!
//! The end of what there is to read is a mark: a non-transactional
//! `pg_logical_emit_message` written (and flushed) after the writes, which
//! the walsender sends once it has decoded everything before it. The
//! cutover's lock writes its mark in the lock's own round trip.
//!
//! The slot's position is not confirmed over the stream: the progress row,
//! written with the changes, says what was applied, as for the SQL reads;
//! the slot goes with the job, or is read again from where it stood.

use super::apply::{Apply, Changes, FLUSH_WAL};
use crate::error::{Result, ShardError};
use crate::operations::node_access::{run_on, value_on};
use crate::operations::replication::unix_micros;
use crate::quote;
use crate::transaction::replication_stream::ReplicationStream;
use pg_shard_core::pgoutput::{self, Lsn, Message};
use postgres::Client;
use std::time::{Duration, Instant};

/// The prefix of the marks' messages.
const MARK_PREFIX: &str = "pg_shard_split";

/// Changes read over the stream are applied, outside the pause, a
/// transaction of this many statements at a time (at a source
/// transaction's end).
const STATEMENTS_PER_WRITE: usize = 10_000;

pub(crate) struct Streamed<'a> {
    apply: &'a Apply<'a>,
    stream: ReplicationStream,
    changes: Changes,
    /// The last mark written.
    mark: String,
}

impl<'a> Streamed<'a> {
    /// Opens the stream of `apply`'s slot and applies (over `node`) what it
    /// brings up to a mark written now, within `longest`.
    pub(crate) fn open(
        apply: &'a Apply<'a>,
        node: &mut Client,
        longest: Duration,
    ) -> Result<Streamed<'a>> {
        let job = apply.job;
        let applied = value_on::<String>(&job.source, node, &apply.applied_query())?
            .and_then(|text| Lsn::parse(&text))
            .unwrap_or_default();
        let slot = apply.direction.slot(job);
        let stream = ReplicationStream::start(&job.source, &slot, &slot)?;
        let mut streamed = Streamed {
            apply,
            stream,
            changes: Changes::new(apply, applied)?,
            mark: String::new(),
        };
        let mark = streamed.next_mark();
        run_on(&job.source, node, &mark)?;
        let statements = streamed.until_mark(node, longest)?;
        apply.apply(node, &statements)?;
        // (Where the crash test kills the runner with the stream open.)
        crate::operations::job::pause_point("streaming")?;
        Ok(streamed)
    }

    /// A script that writes the next mark after the writes so far and
    /// flushes the WAL (the walsender sends only flushed WAL); its last
    /// value is the flushed position.
    pub(crate) fn next_mark(&mut self) -> String {
        // Unique: a mark of an earlier attempt still in the slot is not
        // taken for this one.
        self.mark = format!("job {} at {}", self.apply.job.job_id, unix_micros());
        format!(
            "SELECT pg_catalog.pg_logical_emit_message(false, {}, {});\n{FLUSH_WAL}",
            quote::literal(MARK_PREFIX),
            quote::literal(&self.mark),
        )
    }

    /// Under the cutover's lock: reads up to the mark written in the lock's
    /// round trip, within `longest`, and closes the stream; returns the
    /// statements of the last writes. Closed at once: its walsender would
    /// otherwise go on decoding the node's other writes, on cores the
    /// hand-over needs.
    pub(crate) fn finish(mut self, node: &mut Client, longest: Duration) -> Result<Vec<String>> {
        self.until_mark(node, longest)
    }

    /// Reads up to the last mark, within `longest`; returns the statements
    /// of the changes read that are not applied yet (a long run's earlier
    /// transactions are applied over `node` on the way).
    fn until_mark(&mut self, node: &mut Client, longest: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + longest;
        loop {
            let Some(data) = self.stream.next(deadline)? else {
                return Err(ShardError::Timeout(format!(
                    "the writes before the split's mark were not read within {longest:?}"
                )));
            };
            let message = pgoutput::decode(&data).map_err(|e| {
                ShardError::InvalidArgument(format!("reading the split's replication stream: {e}"))
            })?;
            match message {
                Message::Logical {
                    prefix, content, ..
                } => {
                    if prefix == MARK_PREFIX && content == self.mark.as_bytes() {
                        return Ok(self.changes.statements(self.apply));
                    }
                }
                commit @ Message::Commit { .. } => {
                    self.changes.take(self.apply, commit)?;
                    if self.changes.waiting() >= STATEMENTS_PER_WRITE {
                        let statements = self.changes.statements(self.apply);
                        self.apply.apply(node, &statements)?;
                    }
                }
                other => self.changes.take(self.apply, other)?,
            }
        }
    }
}
