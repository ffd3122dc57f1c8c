//! Plain reads of clients without session state, sent on shared pipes
//! (backend::multiplex) instead of a connection of their own.

use super::*;
use crate::net::sqlstate;

/// A statement that may share a pipe with other clients' (multiplex.rs).
pub(super) fn multiplexable(analysis: &Analysis) -> bool {
    matches!(analysis, Analysis::Routable(shape) if shape.multiplexable())
}

impl Session {
    // ---- multiplexed reads ----------------------------------------------

    /// The pipe to `target` when this client may use one now: outside
    /// transactions, to a worker.
    pub(super) fn pipe(&mut self, target: Target, map: &ClusterMap) -> Option<Arc<Pipe>> {
        if !self.shared.config.multiplex
            || self.tx.state != TxState::Idle
            || self.tx.pinned.is_some()
            || self.held.is_some()
        {
            return None;
        }
        let Target::Worker(node) = target else {
            return None;
        };
        if self.session_targets.contains(&target) {
            return None;
        }
        let address = &map.nodes.get(&node)?.address;
        // The least busy lane.
        let least = |pipes: &[Arc<Pipe>]| pipes.iter().min_by_key(|p| p.load()).cloned();
        if let Some(pipes) = self.pipes.get(&target) {
            if pipes
                .iter()
                .all(|p| p.key.pool.address == *address && p.is_open())
            {
                return least(pipes);
            }
        }
        self.pipes.remove(&target);
        let lanes = self.shared.config.multiplex_connections;
        let open: Vec<Arc<Pipe>> = (0..lanes)
            .filter_map(|lane| {
                self.shared.pipes.get(&PipeKey {
                    pool: PoolKey {
                        address: address.clone(),
                        database: self.database.clone(),
                        user: self.user.clone(),
                    },
                    settings: self.settings.clone(),
                    lane,
                })
            })
            .collect();
        let pipe = least(&open);
        // Kept once every lane is open (until then, asked for again).
        if open.len() == lanes {
            self.pipes.insert(target, open);
        }
        pipe
    }

    /// Whether an extended-protocol batch may go on a pipe: it binds only
    /// reads that may (see [`multiplexable`]), ends with Sync and has no
    /// Flush (a held connection is one client's).
    pub(super) fn batch_multiplexable(&self, batch: &[BatchItem], plan: &BatchPlan) -> bool {
        let mut binds = 0;
        for item in batch {
            match &item.message {
                FrontendMessage::Bind(_) => {
                    binds += 1;
                    match &item.statement {
                        Some(statement) if multiplexable(&statement.analysis) => {}
                        _ => return false,
                    }
                }
                FrontendMessage::Flush => return false,
                _ => {}
            }
        }
        binds > 0
            && !plan.side_connection
            && matches!(
                batch.last().map(|item| &item.message),
                Some(FrontendMessage::Sync)
            )
    }

    /// Runs a request made by `build` on `pipe` and relays its answer. None
    /// when it did not run there (the pipe is busy with a slow statement,
    /// closed, or failed before any answer reached the client): the caller
    /// runs it on a pooled connection.
    pub(super) async fn multiplexed(
        &mut self,
        pipe: Arc<Pipe>,
        map: &ClusterMap,
        shard: Option<i64>,
        retryable: bool,
        build: impl FnOnce(&mut Self, &HashSet<String>) -> Option<(Built, Vec<Expect>)>,
    ) -> Result<Option<Outcome>, SessionError> {
        let started = Instant::now();
        let mut expects = None;
        let ticket = pipe.enqueue(map.version, |prepared| {
            let (built, e) = build(self, prepared)?;
            expects = Some(e);
            Some(built)
        });
        let (Some(ticket), Some(mut expects)) = (ticket, expects) else {
            return Ok(None);
        };
        if ticket.declared_version {
            expects.insert(0, Expect::Hidden);
        }
        let mut turn = match ticket.turn().await {
            Some(turn) => turn,
            None => {
                self.shared
                    .metrics
                    .multiplex_fallbacks
                    .fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        };
        self.watch_cancel(turn.connection());
        self.flushed_in_statement = false;
        self.hold_cancels = true;
        let output_start = self.output.len();
        let result = self
            .relay(turn.connection(), &[], expects, retryable, false)
            .await;
        self.hold_cancels = false;
        self.unwatch_cancel();
        turn.finish(result.is_ok());
        let failed = !matches!(result, Ok((Outcome::Done, false)));
        pipe.stats.observe(started.elapsed(), failed);
        self.shared
            .metrics
            .multiplexed_statements
            .fetch_add(1, Ordering::Relaxed);
        if let Some(shard) = shard {
            self.shared
                .metrics
                .shard_timed(&self.database, shard, started.elapsed());
        }
        let address = &pipe.key.pool.address;
        match result {
            Ok((Outcome::WrongShard(error), _)) if error.code == sqlstate::QUERY_CANCELED => {
                // Another client's cancel request hit this read: run it again.
                self.output.truncate(output_start.min(self.output.len()));
                Ok(None)
            }
            Ok((outcome @ Outcome::WrongShard(_), _)) => {
                self.output.truncate(output_start.min(self.output.len()));
                Ok(Some(outcome))
            }
            Ok((outcome, saw_error)) => {
                self.last_failed = saw_error;
                self.flush().await?;
                Ok(Some(outcome))
            }
            Err(RelayError::Client(e)) => Err(e),
            Err(RelayError::Fatal(message)) => Err(SessionError::ServerEnded(message)),
            Err(RelayError::Server(_) | RelayError::ServerBeforeAnswer(_))
                if !self.flushed_in_statement =>
            {
                // Nothing reached the client and reads can run again.
                self.output.truncate(output_start.min(self.output.len()));
                Ok(None)
            }
            Err(RelayError::Server(e) | RelayError::ServerBeforeAnswer(e)) => {
                self.output.truncate(output_start.min(self.output.len()));
                self.reply_error(ServerError::new(
                    sqlstate::CONNECTION_FAILURE,
                    format!("pg_shard coordinator: connection to {address} failed: {e}"),
                ));
                self.finish_reply().await.map(|_| Some(Outcome::Done))
            }
        }
    }
}
