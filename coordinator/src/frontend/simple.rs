//! The simple query protocol: one Query message, its statements routed
//! (or sent to the metadata node), retried once on a stale map; fast-path
//! function calls; statements about whole databases.

use super::*;
use crate::net::tags;

impl Session {
    // ---- statements about whole databases --------------------------------

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

    pub(super) async fn simple_query(
        &mut self,
        sql: String,
        analysis: Arc<Analysis>,
        normalized: Normalized,
    ) -> Result<(), SessionError> {
        // A failed transaction still on its server: the server answers
        // (COMMIT, ROLLBACK, ROLLBACK TO SAVEPOINT work, the rest is 25P02).
        // One the coordinator rolled back itself, or one on several nodes
        // (whose COMMIT, ROLLBACK and savepoint commands the coordinator
        // runs, as statements of their own): answered here.
        let ends_here = matches!(
            *analysis,
            Analysis::Transaction(TransactionCommand::Commit | TransactionCommand::Rollback)
        ) || (self.tx.members.len() > 1
            && matches!(*analysis, Analysis::Savepoint(_)));
        if self.tx.state == TxState::Failed
            && (self.tx.pinned.is_none() || self.tx.members.len() > 1)
            && !ends_here
        {
            self.reply_error(aborted_error());
            return self.finish_reply().await;
        }
        match &*analysis {
            Analysis::Admin(command) => {
                let viewer = admin::Viewer {
                    user: &self.user,
                    database: &self.database,
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
            Analysis::Transaction(command) if self.tx.ended_by_coordinator() => {
                let tag = self.end_transaction_here(*command).await;
                if let Some(tag) = tag {
                    protocol::command_complete(&mut self.output, tag);
                }
                return self.finish_reply().await;
            }
            Analysis::Savepoint(command) if self.tx.state != TxState::Idle => {
                if let Some(tag) = self.savepoint(command).await {
                    protocol::command_complete(&mut self.output, tag);
                }
                return self.finish_reply().await;
            }
            Analysis::Deallocate { name } => {
                if let Some(tag) = self.deallocate_here(name.as_deref()) {
                    protocol::command_complete(&mut self.output, tag);
                    return self.finish_reply().await;
                }
            }
            Analysis::SearchPath { temporary: true } => self.temporary_relations = true,
            Analysis::SearchPath { temporary: false } => self.search_path_changed = true,
            _ => {}
        }
        if matches!(*analysis, Analysis::Other { .. }) {
            let map = self.map.current();
            if let Some((copy, table, columns)) = self.distributed_copy(&sql, &map) {
                if let Some(plan) = self.copy_out_plan(copy.clone(), &table, columns.len()) {
                    return self.copy_out(plan).await;
                }
                if let Some(split) = self.split_copy(copy, table, columns) {
                    return self.copy_split(split).await;
                }
            }
        }
        let effect = session_effect(&analysis);
        let committing = matches!(*analysis, Analysis::Transaction(TransactionCommand::Commit))
            && self.tx.state == TxState::Open;
        let mut tries = 0;
        loop {
            tries += 1;
            let map = self.map.current();
            let (target, text, shard) =
                match self.choose_simple(&analysis, &sql, &normalized, &map).await {
                    Ok(choice) => choice,
                    Err(error) => {
                        self.abort_pinned(error).await;
                        return self.finish_reply().await;
                    }
                };
            if target == Target::Metadata {
                self.note_on_metadata(&analysis, &map);
            }
            self.tx.note_write(target, router::may_write(&analysis));
            let retryable = self.may_retry(target) && tries < self.shared.config.wrong_shard_tries;
            if multiplexable(&analysis) {
                if let Some(pipe) = self.pipe(target, &map) {
                    let ran = self
                        .multiplexed(pipe, &map, shard, retryable, |_, _| {
                            let mut bytes = BytesMut::with_capacity(text.len() + 6);
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
            let mut request = BytesMut::with_capacity(text.len() + 6);
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
        if matches!(*analysis, Analysis::Deallocate { name: None }) {
            self.forget_server_statements(Target::Metadata);
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
        // (lo_write and the like: a write, as far as the commit knows.)
        self.tx.note_write(target, true);
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
    async fn choose_simple(
        &mut self,
        analysis: &Analysis,
        sql: &str,
        normalized: &Normalized,
        map: &ClusterMap,
    ) -> Result<(Target, String, Option<i64>), ServerError> {
        if let (TxState::Failed, Some((target, _))) = (self.tx.state, &self.tx.pinned) {
            return Ok((*target, sql.to_owned(), None));
        }
        let route = match analysis {
            Analysis::Routable(shape) if self.routing => {
                let route =
                    router::route(shape, sql, normalized, map, &self.routing_session(), None);
                match route {
                    Route::Lookup(hop) => match self.look_up(&hop, map).await {
                        Some(ids) => router::route_looked_up(
                            shape,
                            sql,
                            normalized,
                            map,
                            &self.routing_session(),
                            &ids,
                        ),
                        None => Route::Metadata,
                    },
                    route => route,
                }
            }
            _ => Route::Metadata,
        };
        self.place(route, analysis, sql, map)
    }

    /// Counts a statement sent to a worker by key in the hot-key sketch.
    fn count_key(&self, key: Option<router::RoutedKey>) {
        if let Some(key) = key {
            self.shared.metrics.hot_keys.observe(
                &self.database,
                &key.table.schema,
                &key.table.name,
                key.id,
                || key.value.to_string(),
            );
        }
    }

    /// Fits a route to the transaction: a statement goes where it routes,
    /// and the transaction begins on that node if it has not yet, unless it
    /// must see what the transaction did elsewhere (see `docs/coordinator.md`,
    /// "Transactions").
    pub(super) fn place(
        &self,
        route: Route,
        analysis: &Analysis,
        sql: &str,
        map: &ClusterMap,
    ) -> Result<(Target, String, Option<i64>), ServerError> {
        let routed = |route: Route| match route {
            Route::Worker {
                node,
                sql,
                shard,
                key,
                ..
            } => {
                self.count_key(key);
                (Target::Worker(node), sql, shard)
            }
            Route::ReferenceOnly { .. } | Route::Metadata | Route::Lookup(_) => {
                (Target::Metadata, sql.to_owned(), None)
            }
        };
        let tx = &self.tx;
        if tx.state == TxState::Idle {
            return Ok(routed(route));
        }
        let current = tx.pinned.as_ref().map(|(target, _)| *target);
        if tx.members.is_empty() && self.session_targets.contains(&Target::Metadata) {
            // A client with session state on the metadata node (temporary
            // tables, …) runs its transactions there, with that state.
            return Ok((Target::Metadata, sql.to_owned(), None));
        }
        let on_metadata = tx.has_begun_on(Target::Metadata);
        if on_metadata && tx.metadata_distributed {
            // The metadata node can run anything, including statements on
            // distributed tables, and it sees what it wrote before.
            return Ok((Target::Metadata, sql.to_owned(), None));
        }
        // Statements that name no table (SET LOCAL, SELECT now(), SHOW),
        // transaction control and what cannot be parsed (the server reports
        // the syntax error) run where the transaction last ran.
        let anywhere = matches!(
            analysis,
            Analysis::Transaction(_)
                | Analysis::Savepoint(_)
                | Analysis::Other {
                    tableless: true,
                    ..
                }
                | Analysis::SearchPath { temporary: false }
                | Analysis::Unparsed
        );
        if anywhere {
            if let Some(current) = current {
                return Ok((current, sql.to_owned(), None));
            }
        }
        let session = self.routing_session();
        match route {
            Route::Worker {
                node,
                sql,
                shard,
                key,
                ..
            } => {
                // What the metadata node wrote to a reference table this
                // statement reads there is not on the worker's copy.
                if on_metadata && router::footprint(analysis, map, &session).reference {
                    return Err(reference_after_metadata(node));
                }
                self.count_key(key);
                Ok((Target::Worker(node), sql, shard))
            }
            // Copies on the transaction's worker, unless the metadata node
            // (which may have written the table in this transaction) is in it.
            Route::ReferenceOnly { rewrites } => match current {
                Some(Target::Worker(p)) if !on_metadata => match rewrites.get(&p) {
                    Some(text) => Ok((Target::Worker(p), text.clone(), None)),
                    None => Ok((Target::Metadata, sql.to_owned(), None)),
                },
                _ => Ok((Target::Metadata, sql.to_owned(), None)),
            },
            Route::Metadata | Route::Lookup(_) => {
                if tx.has_worker_members() && router::footprint(analysis, map, &session).distributed
                {
                    return Err(needs_metadata_after_workers(&tx.members));
                }
                Ok((Target::Metadata, sql.to_owned(), None))
            }
        }
    }

    /// DEALLOCATE of statements the client prepared with the protocol: the
    /// coordinator forgets them (their server statements, shared by text,
    /// stay on the connections). The tag when answered here; None when it
    /// goes to the metadata node, where the client's SQL-level prepared
    /// statements are (DEALLOCATE ALL then forgets both).
    pub(super) fn deallocate_here(&mut self, name: Option<&str>) -> Option<&'static str> {
        match name {
            Some(name) => self.statements.remove(name).map(|_| "DEALLOCATE"),
            None => {
                self.statements.clear();
                (!self.session_targets.contains(&Target::Metadata)).then_some("DEALLOCATE ALL")
            }
        }
    }

    /// The server ran DEALLOCATE ALL on the client's connection to
    /// `target`: none of the coordinator's statements are there any more.
    pub(super) fn forget_server_statements(&mut self, target: Target) {
        let leases = self
            .tx
            .pinned
            .iter_mut()
            .chain(self.tx.parked.iter_mut())
            .chain(self.held.iter_mut())
            .filter(|(t, _)| *t == target)
            .map(|(_, lease)| lease)
            .chain(self.session_connections.get_mut(&target));
        for lease in leases {
            lease.connection().prepared.clear();
        }
    }

    /// A statement goes to the metadata node: if it may involve distributed
    /// tables, the rest of the transaction runs there too.
    pub(super) fn note_on_metadata(&mut self, analysis: &Analysis, map: &ClusterMap) {
        if self.tx.metadata_distributed {
            return;
        }
        let session = self.routing_session();
        if router::footprint(analysis, map, &session).distributed {
            self.tx.metadata_distributed = true;
        }
    }

    /// COMMIT, ROLLBACK or another transaction command of a transaction the
    /// coordinator ends itself (see `Transaction::ended_by_coordinator`): the
    /// command tag, or None when an error was passed on.
    pub(super) async fn end_transaction_here(
        &mut self,
        command: TransactionCommand,
    ) -> Option<&'static str> {
        let tag = match command {
            TransactionCommand::Commit => self.commit_transaction().await,
            TransactionCommand::Rollback => Some(self.roll_back_transaction().await),
            TransactionCommand::Begin | TransactionCommand::Other => {
                // BEGIN inside the transaction only warns, on the server.
                if command == TransactionCommand::Begin {
                    protocol::notice_response(
                        &mut self.output,
                        &ServerError::warning("there is already a transaction in progress")
                            .with_code("25001"),
                    );
                    return Some("BEGIN");
                }
                self.reply_error(ServerError::new(
                    sqlstate::FEATURE_NOT_SUPPORTED,
                    "pg_shard coordinator: PREPARE TRANSACTION and COMMIT or ROLLBACK AND CHAIN are not supported in a transaction on several nodes",
                ).with_hint("The coordinator commits a transaction on several nodes with two-phase commit itself."));
                if self.tx.state == TxState::Open {
                    self.tx.state = TxState::Failed;
                }
                return None;
            }
        };
        let committed = tag == Some("COMMIT");
        self.last_failed = tag.is_none();
        if committed {
            self.after_statements(Vec::new(), true, false);
        } else {
            // Session SETs made in a transaction that rolled back are undone.
            self.pending_settings.clear();
        }
        tag
    }

    /// A WrongShard answer may be retried when nothing of the transaction
    /// has run yet: autocommit, or the transaction's first statement.
    pub(super) fn may_retry(&self, target: Target) -> bool {
        matches!(target, Target::Worker(_))
            && self.tx.members.is_empty()
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
        // newer map, so that the retry finds the new owner. While the
        // map's listener is connected, the announcement of the new version
        // brings it (a patch or a load ends the wait at once): the version
        // is asked only if nothing came for a while. Otherwise it is asked
        // at once and after each short wait.
        let deadline = Instant::now() + WRONG_SHARD_WAIT;
        let listening = self.map.listening();
        let mut ask = !listening;
        let mut pause = if listening {
            ANNOUNCED_MAP_WAIT
        } else {
            Duration::from_millis(2)
        };
        loop {
            let loaded = self.map.loaded();
            if ask {
                match self.map.reload_if_newer(map.version).await {
                    Ok(newer) if newer.version > map.version => return,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "shard map reload failed");
                        return;
                    }
                }
            } else if self.map.current().version > map.version {
                return;
            }
            if Instant::now() + pause > deadline {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = loaded => {}
            }
            ask = true;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }
}
