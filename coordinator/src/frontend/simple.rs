//! The simple query protocol: one Query message, its statements routed
//! (or sent to the metadata node), retried once on a stale map; fast-path
//! function calls; statements about whole databases.

use super::*;
use crate::net::tags;

impl Session {
    // ---- statements about whole databases --------------------------------

    /// What `sql` does to whole databases, if it runs on the metadata node.
    pub(super) fn database_command(&self, sql: &str) -> Option<DatabaseCommand> {
        let (analysis, _) = self.shared.statements.get(sql);
        match *analysis {
            Analysis::Other { .. } => database_commands::database_command(sql),
            _ => None,
        }
    }

    /// Before a statement that needs databases free of other sessions: the
    /// coordinator's idle connections to them close, and their map
    /// listeners stay away while the holds live.
    pub(super) fn let_go_of_databases(
        &mut self,
        command: Option<&DatabaseCommand>,
    ) -> Vec<ListenerHold> {
        let Some(command) = command else {
            return Vec::new();
        };
        // Until a server answers it, the statement counts as failed (the
        // coordinator may answer it with an error itself).
        self.last_failed = true;
        let mut holds = Vec::new();
        for database in &command.needs_free {
            holds.extend(
                self.shared
                    .maps
                    .existing(database)
                    .map(|map| map.hold_listener()),
            );
            self.shared.pools.close_idle_to(database);
        }
        holds
    }

    /// After it succeeded, the names it dropped, renamed or created have
    /// their maps read anew (and their old pooled connections are gone).
    pub(super) fn after_database_command(&self, command: Option<DatabaseCommand>) {
        let Some(command) = command else {
            return;
        };
        // Failed, or inside a transaction that may still roll back (ALTER
        // DATABASE … RENAME can run in one): nothing to renew yet.
        if self.last_failed || self.tx.state != TxState::Idle {
            return;
        }
        for database in &command.renews {
            self.shared.maps.renew(database);
            self.shared.pools.close_idle_to(database);
        }
    }

    // ---- simple query ---------------------------------------------------

    pub(super) async fn simple_query(&mut self, sql: String) -> Result<(), SessionError> {
        let (analysis, normalized) = self.analysis(&sql);
        // A failed transaction still on its server: the server answers
        // (COMMIT, ROLLBACK, ROLLBACK TO SAVEPOINT work, the rest is 25P02).
        // One the coordinator rolled back itself: answered here.
        if self.tx.state == TxState::Failed
            && self.tx.pinned.is_none()
            && !matches!(
                *analysis,
                Analysis::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback)
            )
        {
            self.reply_error(aborted_error());
            return self.finish_reply().await;
        }
        match &*analysis {
            Analysis::Admin(command) => {
                let viewer = admin::Viewer {
                    user: &self.user,
                    superuser: self.superuser,
                };
                admin::reply(
                    command,
                    &self.shared,
                    &self.map.current(),
                    &viewer,
                    &mut self.output,
                );
                return self.finish_reply().await;
            }
            Analysis::Transaction(command) if self.tx.answered_here(*command).is_some() => {
                let tag = self.tx.answered_here(*command).unwrap_or("ROLLBACK");
                if *command == TransactionCommand::Begin {
                    self.tx.begin(sql);
                } else {
                    // Nothing was sent anywhere: the transaction ends here.
                    self.end_transaction();
                }
                protocol::command_complete(&mut self.output, tag);
                return self.finish_reply().await;
            }
            Analysis::SearchPath { temporary: true } => self.temporary_relations = true,
            Analysis::SearchPath { temporary: false } => self.search_path_changed = true,
            _ => {}
        }
        let effect = session_effect(&analysis);
        let committing = matches!(*analysis, Analysis::Transaction(TransactionCommand::Commit))
            && self.tx.state == TxState::Open;
        let mut tries = 0;
        loop {
            tries += 1;
            let map = self.map.current();
            let (target, text, shard) = match self.choose_simple(&analysis, &sql, &normalized, &map)
            {
                Ok(choice) => choice,
                Err(error) => {
                    self.abort_pinned(error).await;
                    return self.finish_reply().await;
                }
            };
            let retryable = self.may_retry(target) && tries < self.shared.config.wrong_shard_tries;
            if multiplexable(&analysis) {
                if let Some(pipe) = self.pipe(target, &map) {
                    let ran = self
                        .multiplexed(pipe, &map, shard, retryable, |_, _| {
                            let mut bytes = BytesMut::new();
                            protocol::query(&mut bytes, &text);
                            let built = Built {
                                bytes,
                                answers: 1,
                                prepares: Vec::new(),
                            };
                            Some((built, vec![Expect::Query]))
                        })
                        .await?;
                    match ran {
                        Some(Outcome::WrongShard(error)) => {
                            self.note_wrong_shard(&map, &error).await;
                            continue;
                        }
                        Some(_) => break,
                        None => {}
                    }
                }
            }
            let Some(lease) = self.acquire(target, &map, false, true).await? else {
                return Ok(());
            };
            let mut request = BytesMut::new();
            protocol::query(&mut request, &text);
            match self
                .exchange(
                    lease,
                    &map,
                    Exchange {
                        target,
                        shard,
                        retryable,
                        side_connection: false,
                        synced: true,
                        effect,
                        request,
                        expects: vec![Expect::Query],
                    },
                )
                .await?
            {
                Outcome::Done => break,
                // Pooled connections are discarded, so this ends.
                Outcome::Stale => tries -= 1,
                Outcome::WrongShard(error) => {
                    self.note_wrong_shard(&map, &error).await;
                }
            }
        }
        let sets = if sets_parameter(&analysis) {
            vec![sql.clone()]
        } else {
            Vec::new()
        };
        self.after_statements(sets, committing, discards_all(&sql));
        Ok(())
    }

    /// A fast-path function call: on the transaction's node, else on the
    /// metadata node (large objects live there).
    pub(super) async fn function_call(&mut self, body: Bytes) -> Result<(), SessionError> {
        if self.tx.state == TxState::Failed && self.tx.pinned.is_none() {
            self.reply_error(aborted_error());
            return self.finish_reply().await;
        }
        let target = self
            .tx
            .pinned
            .as_ref()
            .map_or(Target::Metadata, |(target, _)| *target);
        let map = self.map.current();
        for _ in 0..3 {
            let Some(lease) = self.acquire(target, &map, false, true).await? else {
                return Ok(());
            };
            let mut request = BytesMut::new();
            let at = protocol::begin_message(&mut request, tags::frontend::FUNCTION_CALL);
            request.put_slice(&body);
            protocol::end_message(&mut request, at);
            let outcome = self
                .exchange(
                    lease,
                    &map,
                    Exchange {
                        target,
                        shard: None,
                        retryable: false,
                        side_connection: false,
                        synced: true,
                        effect: SessionEffect::Unknown,
                        request,
                        expects: vec![Expect::Query],
                    },
                )
                .await?;
            // A pooled connection found dead before it answered: again.
            if !matches!(outcome, Outcome::Stale) {
                break;
            }
        }
        Ok(())
    }

    /// The node and text for a simple-query statement.
    fn choose_simple(
        &self,
        analysis: &Analysis,
        sql: &str,
        normalized: &Normalized,
        map: &ClusterMap,
    ) -> Result<(Target, String, Option<i64>), ServerError> {
        if let (TxState::Failed, Some((target, _))) = (self.tx.state, &self.tx.pinned) {
            return Ok((*target, sql.to_owned(), None));
        }
        let route = match analysis {
            Analysis::Routable(shape) if self.routing => router::route(
                shape,
                sql,
                normalized,
                map,
                &router::Session {
                    search_path: self.known_search_path(),
                },
                None,
            ),
            _ => Route::Metadata,
        };
        self.place(route, analysis, sql)
    }

    /// Fits a route to the transaction's node.
    pub(super) fn place(
        &self,
        route: Route,
        analysis: &Analysis,
        sql: &str,
    ) -> Result<(Target, String, Option<i64>), ServerError> {
        let pinned = self.tx.pinned.as_ref().map(|(target, _)| *target);
        if self.tx.state != TxState::Idle
            && pinned.is_none()
            && self.session_targets.contains(&Target::Metadata)
        {
            // A client with session state on the metadata node (temporary
            // tables, …) runs its transactions there, with that state.
            return Ok((Target::Metadata, sql.to_owned(), None));
        }
        match (route, pinned) {
            (
                Route::Worker {
                    node, sql, shard, ..
                },
                None,
            ) => Ok((Target::Worker(node), sql, shard)),
            (
                Route::Worker {
                    node, sql, shard, ..
                },
                Some(Target::Worker(p)),
            ) if p == node => Ok((Target::Worker(node), sql, shard)),
            // The metadata node can run anything, including statements on
            // distributed tables, in the same transaction.
            (_, Some(Target::Metadata)) => Ok((Target::Metadata, sql.to_owned(), None)),
            (Route::ReferenceOnly { rewrites }, Some(Target::Worker(p))) => {
                match rewrites.get(&p) {
                    Some(text) => Ok((Target::Worker(p), text.clone(), None)),
                    None => Err(spans_nodes(p)),
                }
            }
            (Route::ReferenceOnly { .. }, None) | (Route::Metadata, None) => {
                Ok((Target::Metadata, sql.to_owned(), None))
            }
            (Route::Worker { .. }, Some(Target::Worker(p))) => Err(spans_nodes(p)),
            (Route::Metadata, Some(Target::Worker(p))) => match analysis {
                // Statements that name no table (SET LOCAL, SELECT now(),
                // SHOW, SET search_path), transaction control and what
                // cannot be parsed (the worker reports the syntax error)
                // run where the transaction is.
                Analysis::Transaction(_)
                | Analysis::Other {
                    tableless: true, ..
                }
                | Analysis::SearchPath { temporary: false }
                | Analysis::Unparsed => Ok((Target::Worker(p), sql.to_owned(), None)),
                _ => Err(spans_nodes(p)),
            },
        }
    }

    /// A WrongShard answer may be retried when nothing of the transaction
    /// has run yet: autocommit, or the transaction's first statement.
    pub(super) fn may_retry(&self, target: Target) -> bool {
        matches!(target, Target::Worker(_))
            && self.tx.pinned.is_none()
            // Messages sent before a Flush ran on the held connection: a
            // retry of the rest would lose them.
            && self.held.is_none()
            && self.tx.state != TxState::Failed
    }

    pub(super) async fn note_wrong_shard(&mut self, map: &ClusterMap, error: &ServerError) {
        self.shared
            .metrics
            .wrong_shard_retries
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(database = %self.database, version = map.version, message = %error.message, "WrongShard: reloading the shard map and retrying");
        if error.code == sqlstate::UNDEFINED_TABLE {
            // Whatever its version: the database may be another one now.
            self.map.reload_anew(Some(map)).await;
            return;
        }
        // During a shard move's cutover the old owner refuses before the
        // new map is published: wait (a little longer each time) for a
        // newer map, so that the retry finds the new owner. NOTIFY usually
        // brings it first.
        let deadline = Instant::now() + WRONG_SHARD_WAIT;
        let mut pause = Duration::from_millis(5);
        loop {
            match self.map.reload(map.version).await {
                Ok(newer) if newer.version > map.version => return,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "shard map reload failed");
                    return;
                }
            }
            if Instant::now() + pause > deadline {
                return;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
    }
}
