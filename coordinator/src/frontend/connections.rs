//! Choosing and preparing the server connection for a request: the
//! transaction's, the session's, or one from the pool; what it needs first
//! (the prelude), and the round trip itself.

use super::*;
use crate::net::sqlstate;
use crate::net::tags;

/// What a connection needs before the client's messages.
pub(super) struct Prelude {
    /// RESET ALL, the client's settings, the map version.
    pub(super) settings: Option<String>,
    pub(super) declares_version: bool,
    /// The transaction's BEGIN, with its first statement.
    pub(super) begin: Option<String>,
}

/// One round trip with a server: what is sent, where, and what may come
/// of it.
pub(super) struct Exchange {
    pub(super) target: Target,
    /// The shard a routed statement went to (for the statistics).
    pub(super) shard: Option<i64>,
    /// A WrongShard (or vanished shard table) answer may be held back and
    /// the request sent again with a fresh map.
    pub(super) retryable: bool,
    /// On a connection of its own beside the transaction's.
    pub(super) side_connection: bool,
    /// The request ends with a Sync (or is a simple query).
    pub(super) synced: bool,
    /// What the statements may leave on the connection.
    pub(super) effect: SessionEffect,
    /// The messages, as sent.
    pub(super) request: BytesMut,
    /// What comes back for each of them, in order.
    pub(super) expects: Vec<Expect>,
}

impl Session {
    /// A connection the client is done with for now: kept when it holds
    /// the client's session state on that node, else back to its pool.
    pub(super) fn release(&mut self, target: Target, lease: Lease) {
        let mut lease = lease;
        if self.session_targets.contains(&target) && !lease.connection().broken {
            self.session_connections.insert(target, lease);
        }
    }

    // ---- sending and relaying -------------------------------------------

    /// The connection for `target`: the transaction's, the one held since
    /// a Flush, or one from the pool. None when there is none to be had
    /// (the client has been told).
    pub(super) async fn acquire(
        &mut self,
        target: Target,
        map: &ClusterMap,
        side_connection: bool,
        synced: bool,
    ) -> Result<Option<Lease>, SessionError> {
        if let Some(lease) = self.take_lease(target, side_connection) {
            return Ok(Some(lease));
        }
        if let Some(lease) = self.session_connections.remove(&target) {
            return Ok(Some(lease));
        }
        if self.session_targets.contains(&target) {
            // The connection that held the client's session state (its
            // temporary tables, LISTENs, …) was lost: so is the session.
            let message =
                "pg_shard coordinator: the server connection holding this session's state was lost";
            self.reply_error(ServerError::fatal(sqlstate::CONNECTION_FAILURE, message));
            self.flush().await?;
            return Err(SessionError::ServerEnded(message.into()));
        }
        // Pools by node, kept per session: no string hashing or copying per
        // statement (checked against the map's address, which may change).
        let current = match target {
            Target::Metadata => Some(&self.shared.metadata),
            Target::Worker(node) => map.nodes.get(&node).map(|n| &n.address),
        };
        let Some(address) = current else {
            self.reply_error(ServerError::new(
                sqlstate::CONNECTION_FAILURE,
                "pg_shard coordinator: the node is no longer in the shard map",
            ));
            self.finish_batch(synced).await?;
            return Ok(None);
        };
        let pool = match self.pools.get(&target) {
            Some(pool) if pool.key.address == *address => pool.clone(),
            _ => {
                let pool = self.shared.pools.pool(&PoolKey {
                    address: address.clone(),
                    database: self.database.clone(),
                    user: self.user.clone(),
                });
                self.pools.insert(target, pool.clone());
                pool
            }
        };
        loop {
            let checkout = self.shared.pools.checkout_from(pool.clone(), self.serial);
            let checked_out = tokio::select! {
                // (The checkout first: most are ready at once.)
                biased;
                checked_out = checkout => Some(checked_out),
                // A client waiting for a free server connection may cancel.
                _ = self.until_cancel_requested() => None,
            }
            // (A cancel that came as the connection did counts too.)
            .filter(|_| !self.cancel_requested());
            let Some(checked_out) = checked_out else {
                // As the server cancels a statement: it did not run.
                self.reply_error(ServerError::new(
                    sqlstate::QUERY_CANCELED,
                    "canceling statement due to user request",
                ));
                if self.tx.state == TxState::Open {
                    self.tx.state = TxState::Failed;
                }
                self.finish_batch(synced).await?;
                return Ok(None);
            };
            match checked_out {
                Ok(mut lease) => {
                    let connection = lease.connection();
                    if target == Target::Metadata
                        && connection.last_session != self.serial
                        && !connection.prepared.is_empty()
                    {
                        // Statements cached for other sessions: on the node the
                        // client sees (its pg_prepared_statements), only its own.
                        connection.prepared.clear();
                        connection.deallocate_first = true;
                    }
                    return Ok(Some(lease));
                }
                Err(_) if self.waits_for_metadata(target) => {
                    // Restarting: try again shortly (a cancel ends the wait).
                    tokio::select! {
                        _ = tokio::time::sleep(METADATA_RESTART_POLL) => {}
                        _ = self.until_cancel_requested() => {}
                    }
                    continue;
                }
                Err(e) => {
                    pool.stats.observe(std::time::Duration::ZERO, true);
                    self.reply_error(ServerError::new(
                        sqlstate::CONNECTION_FAILURE,
                        format!("pg_shard coordinator: {e}"),
                    ));
                    if self.tx.state == TxState::Open && !self.tx.members.is_empty() {
                        self.tx.state = TxState::Failed;
                    }
                    self.finish_batch(synced).await?;
                    return Ok(None);
                }
            }
        }
    }

    /// A connection to `address` from the client's pool there, for work of
    /// the coordinator's own (`purpose` words the error).
    pub(super) async fn pooled_connection(
        &self,
        address: ServerAddress,
        purpose: &str,
    ) -> Result<Lease, ServerError> {
        let pool = self.shared.pools.pool(&PoolKey {
            address,
            database: self.database.clone(),
            user: self.user.clone(),
        });
        self.shared
            .pools
            .checkout_from(pool, self.serial)
            .await
            .map_err(|e| {
                ServerError::new(
                    sqlstate::CONNECTION_FAILURE,
                    format!("pg_shard coordinator: {purpose}: {e}"),
                )
            })
    }

    /// A batch without side effects bound for the metadata node, within
    /// its wait for the node to come back (see METADATA_RESTART_WAIT).
    fn waits_for_metadata(&self, target: Target) -> bool {
        target == Target::Metadata
            && self
                .metadata_restart_deadline
                .is_some_and(|deadline| Instant::now() < deadline)
    }

    /// Sends the session prelude and `request` on the lease and relays the
    /// answers until every expectation is met; then keeps, pins or returns
    /// the connection.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn exchange(
        &mut self,
        mut lease: Lease,
        map: &ClusterMap,
        exchange: Exchange,
    ) -> Result<Outcome, SessionError> {
        let Exchange {
            target,
            shard,
            retryable,
            side_connection,
            synced,
            effect,
            request,
            mut expects,
        } = exchange;
        let started = Instant::now();
        let address = lease.connection().address.clone();
        if target == Target::Metadata && lease.connection().last_client != self.cancel_key.0 {
            let connection = lease.connection();
            connection.last_client = self.cancel_key.0;
            self.shared
                .notifiers
                .note(connection.process_id, self.cancel_key.0);
        }
        let mut out = BytesMut::with_capacity(request.len() + 64);
        let prelude = self.prelude(lease.connection(), target, map, side_connection);
        lease.connection().last_session = self.serial;
        let begins = prelude.begin.is_some();
        // Settings and BEGIN go as separate queries: settings must outlive
        // the client's transaction (a ROLLBACK must not undo them).
        let mut hidden = 0;
        for statement in [&prelude.settings, &prelude.begin].into_iter().flatten() {
            protocol::query(&mut out, statement);
            hidden += 1;
        }
        expects.splice(0..0, (0..hidden).map(|_| Expect::Hidden));
        out.put_slice(&request);
        self.watch_cancel(lease.connection());
        let watchdog = self.watchdog(target, &mut lease, side_connection);
        self.deadlock_fired = watchdog.as_ref().map(|w| w.fired.clone());
        self.flushed_in_statement = false;
        let output_start = self.output.len();
        let result = self
            .relay(
                lease.connection(),
                &out,
                expects,
                retryable,
                side_connection,
            )
            .await;
        self.unwatch_cancel();
        let deadlock = watchdog
            .as_ref()
            .is_some_and(|w| w.fired.load(Ordering::Acquire));
        drop(watchdog);
        self.deadlock_fired = None;
        let synced = synced || std::mem::take(&mut self.synced_by_copy);
        let failed = !matches!(result, Ok((Outcome::Done, false)));
        lease.pool().stats.observe(started.elapsed(), failed);
        if let Some(shard) = shard {
            self.shared
                .metrics
                .shard_timed(&self.database, shard, started.elapsed());
        }
        let (outcome, saw_error) = match result {
            Ok(result) => result,
            Err(RelayError::Client(e)) => {
                lease.connection().broken = true;
                return Err(e);
            }
            Err(RelayError::Fatal(message)) => return Err(SessionError::ServerEnded(message)),
            Err(RelayError::ServerBeforeAnswer(_)) | Err(RelayError::Server(_))
                if self.waits_for_metadata(target) =>
            {
                // The metadata node went down under a batch that changes
                // nothing: send it again once the node is back.
                lease.connection().broken = true;
                self.shared.pools.discard_idle(&lease);
                self.output.truncate(output_start.min(self.output.len()));
                return Ok(Outcome::Stale);
            }
            Err(RelayError::ServerBeforeAnswer(_))
                if lease.reused && (self.tx.state == TxState::Idle || begins) =>
            {
                // Nothing ran: try again on a new connection.
                lease.connection().broken = true;
                self.shared.pools.discard_idle(&lease);
                self.output.truncate(output_start.min(self.output.len()));
                return Ok(Outcome::Stale);
            }
            Err(RelayError::ServerBeforeAnswer(
                crate::backend::connection::BackendError::Refused(error),
            )) => {
                // The server ended the session before answering (terminated,
                // timed out, shut down): its own error, and the end.
                lease.connection().broken = true;
                self.output.truncate(output_start.min(self.output.len()));
                self.reply_error(error.clone());
                self.flush().await?;
                return Err(SessionError::ServerEnded(error.message));
            }
            Err(RelayError::Server(e)) | Err(RelayError::ServerBeforeAnswer(e)) => {
                lease.connection().broken = true;
                self.output.truncate(output_start.min(self.output.len()));
                self.reply_error(ServerError::new(
                    sqlstate::CONNECTION_FAILURE,
                    format!("pg_shard coordinator: connection to {address} failed: {e}"),
                ));
                if self.tx.state != TxState::Idle {
                    self.tx.state = TxState::Failed;
                }
                self.tx.pinned = None;
                self.held = None;
                return self.finish_batch(synced).await.map(|_| Outcome::Done);
            }
        };
        self.last_failed = saw_error;
        let connection = lease.connection();
        // A side connection's batch got a Sync of its own (send_batch).
        connection.awaiting_sync = !synced && !side_connection;
        if prelude.settings.is_some() {
            connection.session_settings = Some(self.settings.clone());
        }
        if prelude.declares_version {
            connection.declared_map_version = map.version;
        }
        if saw_error {
            // Whatever failed (possibly part of the prelude), start over
            // next time.
            connection.session_settings = None;
            connection.declared_map_version = 0;
            if prelude.settings.is_some() {
                connection.last_session = UNKNOWN_SESSION;
            }
        }
        match effect {
            SessionEffect::None => {}
            // The client may have changed session state: reset before reuse.
            SessionEffect::Unknown => connection.session_settings = None,
            // State RESET ALL does not undo: the client keeps the
            // connection (session mode for this client, on this node).
            SessionEffect::Keeps => {
                self.session_targets.insert(target);
            }
        }
        if self.session_targets.contains(&target) {
            // The server session is the client's own: never reset.
            lease.connection().session_settings = Some(self.settings.clone());
        }
        if let Outcome::WrongShard(_) = outcome {
            // The statement and its transaction (if it began one) are gone
            // on the server; roll back what the prelude began.
            self.output.truncate(output_start.min(self.output.len()));
            if lease.connection().status != tags::status::IDLE {
                let mut rollback = BytesMut::new();
                protocol::query(&mut rollback, "ROLLBACK");
                if self
                    .relay(
                        lease.connection(),
                        &rollback,
                        vec![Expect::Hidden],
                        false,
                        true,
                    )
                    .await
                    .is_err()
                {
                    lease.connection().broken = true;
                }
            }
            self.release(target, lease);
            return Ok(outcome);
        }
        if begins {
            // Sent: a batch ended by Flush leaves the transaction open on
            // its connection, and the next one must not begin it again.
            self.tx.join(target);
        }
        let status = lease.connection().status;
        if side_connection {
            // Not the transaction's connection.
            self.release(target, lease);
        } else if !synced {
            if self.tx.members.is_empty() && status == tags::status::IDLE {
                self.held = Some((target, lease));
            } else {
                self.tx.pinned = Some((target, lease));
            }
        } else {
            match status {
                tags::status::IDLE => {
                    self.end_transaction();
                    self.release(target, lease);
                }
                tags::status::IN_TRANSACTION => {
                    self.tx.state = TxState::Open;
                    self.tx.join(target);
                    self.tx.pinned = Some((target, lease));
                }
                _ => {
                    self.tx.state = TxState::Failed;
                    self.tx.join(target);
                    self.tx.pinned = Some((target, lease));
                    if deadlock && self.tx.savepoints.is_empty() {
                        // As a node's own deadlock victim, whose locks go
                        // when its statement fails: the transaction's
                        // other branches hold locks the other side of the
                        // cycle waits for, until the client's ROLLBACK.
                        // Rolled back now, so that the other side goes on
                        // rather than being canceled too. (With savepoints
                        // the client may go back to one instead.)
                        self.roll_back_everywhere().await;
                        self.start_over(true);
                    }
                }
            }
        }
        self.flush().await?;
        Ok(outcome)
    }

    fn take_lease(&mut self, target: Target, side_connection: bool) -> Option<Lease> {
        if side_connection {
            return None;
        }
        if let Some((t, _)) = &self.held {
            if *t == target {
                return self.held.take().map(|(_, lease)| lease);
            }
        }
        // A held connection for another node: a batch moved elsewhere.
        self.held = None;
        if matches!(&self.tx.pinned, Some((t, _)) if *t == target) {
            return self.tx.pinned.take().map(|(_, lease)| lease);
        }
        // Another node of the transaction: the last one's connection waits
        // with the others.
        if let Some(previous) = self.tx.pinned.take() {
            self.tx.parked.push(previous);
        }
        let at = self.tx.parked.iter().position(|(t, _)| *t == target)?;
        Some(self.tx.parked.swap_remove(at).1)
    }

    /// Ends a batch the coordinator answered itself.
    pub(super) async fn end_batch(&mut self, synced: bool) -> Result<(), SessionError> {
        if synced {
            self.finish_reply().await
        } else {
            self.flush().await
        }
    }

    /// Ends a batch after an error: before its Sync, the rest of what the
    /// client sends up to the Sync is skipped, as the server does.
    pub(super) async fn finish_batch(&mut self, synced: bool) -> Result<(), SessionError> {
        if !synced {
            self.skip_to_sync = true;
        }
        self.end_batch(synced).await
    }

    /// SET statements, the map version and BEGIN the connection needs
    /// before the client's messages; None when it needs nothing.
    pub(super) fn prelude(
        &self,
        connection: &mut ServerConnection,
        target: Target,
        map: &ClusterMap,
        side_connection: bool,
    ) -> Prelude {
        let mut statements: Vec<String> = Vec::new();
        if std::mem::take(&mut connection.deallocate_first) {
            // First: a failing statement after it must not skip it.
            statements.push("DEALLOCATE ALL".into());
        }
        // Only outside a transaction: inside one the settings were made at
        // its start, and a SET there is the client's own.
        // Not between Flush and Sync either: the server may be skipping to
        // the Sync after an error, and would skip these too.
        let idle = connection.status == tags::status::IDLE && !connection.awaiting_sync;
        if idle && connection.last_session != 0 && connection.last_session != self.serial {
            // Another client's currval and lastval must not be this one's.
            statements.push("DISCARD SEQUENCES".into());
        }
        if idle && connection.session_settings.as_ref() != Some(&self.settings) {
            // Start from the server's defaults, then the client's settings.
            statements.extend(SERVER_DEFAULTS.map(String::from));
            statements.extend(self.settings.iter().map(|(_, sql)| sql.clone()));
            connection.declared_map_version = 0;
        }
        let mut declares_version = false;
        if let Target::Worker(_) = target {
            if idle && connection.declared_map_version != map.version && map.version > 0 {
                statements.push(format!("SET pg_shard.map_version = {}", map.version));
                declares_version = true;
            }
        }
        let begin = if idle
            && !side_connection
            && self.tx.state == TxState::Open
            && !self.tx.has_begun_on(target)
        {
            Some(self.tx.begin_on_new_node())
        } else {
            None
        };
        Prelude {
            // One statement per line: each was generated or checked to be a
            // single statement.
            settings: (!statements.is_empty()).then(|| statements.join(";\n")),
            declares_version,
            begin,
        }
    }
}
