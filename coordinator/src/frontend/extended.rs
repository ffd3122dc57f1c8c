//! The extended query protocol: Parse/Bind/Describe/Execute batches up to
//! Sync or Flush, planned onto one node each and sent on in bounded pieces.

use super::*;
use crate::net::sqlstate;
use crate::net::tags;

pub(super) struct BatchPlan {
    pub(super) target: Target,
    /// Rewritten statement text per Bind (by batch index).
    pub(super) texts: HashMap<usize, String>,
    pub(super) shard: Option<i64>,
    /// Parse/Describe only, answered on a connection outside the
    /// transaction.
    pub(super) side_connection: bool,
    /// Nothing runs and no transaction depends on the connection (Parse,
    /// Describe statement, Close on the metadata node): it may be sent
    /// again after the node restarts.
    pub(super) side_effect_free: bool,
    /// Bound reads by a looked-up column whose lookup must be read first
    /// (by batch index); the batch is planned again with their answers.
    pub(super) lookups: Vec<(usize, router::LookupHop)>,
}

/// The keyspace ids lookups gave, by batch index (None: not read).
pub(super) type LookedUp = HashMap<usize, Option<Vec<i64>>>;

/// A client message of an extended-protocol batch and the statement its
/// name meant where it came (Parse, Bind, Describe statement).
pub(super) struct BatchItem {
    pub(super) message: FrontendMessage,
    pub(super) statement: Option<Arc<Prepared>>,
}

impl Session {
    // ---- extended query -------------------------------------------------

    /// Runs the batch; around a whole-database statement in it (drivers
    /// send DROP DATABASE with the extended protocol too), as for a
    /// simple query.
    pub(super) async fn extended_batch(&mut self) -> Result<(), SessionError> {
        let command = self
            .batch
            .iter()
            .filter(|item| matches!(item.message, FrontendMessage::Bind(_)))
            .filter_map(|item| item.statement.as_ref())
            .find_map(|statement| {
                database_commands::of_statement(&statement.sql, &statement.analysis)
            });
        let holds = self.let_go_of_databases(command.as_ref());
        let result = self.run_extended_batch().await;
        drop(holds);
        if result.is_ok() {
            self.after_database_command(command);
        }
        result
    }

    async fn run_extended_batch(&mut self) -> Result<(), SessionError> {
        let batch = std::mem::take(&mut self.batch);
        self.batch_bytes = 0;
        let synced = matches!(
            batch.last().map(|item| &item.message),
            Some(FrontendMessage::Sync)
        );
        // Names must exist before anything is sent.
        let missing = batch.iter().find_map(|item| match &item.message {
            FrontendMessage::Bind(bind) if item.statement.is_none() => Some(&bind.statement),
            FrontendMessage::Describe {
                kind: tags::STATEMENT,
                name,
            } if item.statement.is_none() => Some(name),
            _ => None,
        });
        if let Some(name) = missing {
            let error = ServerError::new(
                sqlstate::INVALID_SQL_STATEMENT_NAME,
                format!("prepared statement \"{name}\" does not exist"),
            );
            return self.fail_batch(error, synced).await;
        }
        if let Some(succeeded) = self.answer_transaction_batch(&batch).await {
            return if succeeded {
                self.end_batch(synced).await
            } else {
                self.finish_batch(synced).await
            };
        }
        let only_sync = batch
            .iter()
            .all(|item| matches!(item.message, FrontendMessage::Sync | FrontendMessage::Flush));
        if only_sync && self.held.is_none() && self.tx.pinned.is_none() {
            // Nothing is open on a server: the coordinator answers.
            return self.end_batch(synced).await;
        }
        // Rolled back by the coordinator itself: nothing but COMMIT or
        // ROLLBACK (answered above) ends it. On several nodes, the failed
        // transaction's COMMIT, ROLLBACK and savepoint commands come alone
        // (answered above); anything else is refused here.
        let failed_here =
            self.tx.pinned.is_none() || self.tx.members.len() > 1 || self.tx.ended_by_coordinator();
        if self.tx.state == TxState::Failed && failed_here && !only_sync {
            return self.fail_batch(aborted_error(), synced).await;
        }
        let committing = self.tx.state == TxState::Open
            && batch.iter().any(|item| {
                matches!(item.message, FrontendMessage::Bind(_))
                    && item.statement.as_ref().is_some_and(|statement| {
                        matches!(
                            *statement.analysis,
                            Analysis::Transaction(TransactionCommand::Commit)
                        )
                    })
            });
        let mut tries = 0;
        let mut restart_deadline = None;
        loop {
            tries += 1;
            let map = self.map.current();
            let mut looked_up = LookedUp::new();
            let mut planned = self.plan_batch(&batch, &map, &looked_up);
            if let Ok(plan) = &planned {
                if !plan.lookups.is_empty() {
                    for (index, hop) in plan.lookups.clone() {
                        let ids = self.look_up(&hop, &map).await;
                        looked_up.insert(index, ids);
                    }
                    planned = self.plan_batch(&batch, &map, &looked_up);
                }
            }
            let plan = match planned {
                Ok(plan) => plan,
                Err(error) => {
                    self.abort_pinned(error).await;
                    return self.finish_batch(synced).await;
                }
            };
            if plan.target == Target::Metadata && !plan.side_connection {
                for statement in bound_statements(&batch) {
                    self.note_on_metadata(&statement.analysis, &map);
                }
            }
            if !plan.side_connection {
                // (A batch that binds nothing runs portals bound before,
                // whose writes were noted then.)
                let writes = bound_statements(&batch).any(|s| router::may_write(&s.analysis));
                self.tx.note_write(plan.target, writes);
            }
            let retryable = synced
                && self.may_retry(plan.target)
                && tries < self.shared.config.wrong_shard_tries;
            // A prepare (psycopg's fifth execution, pgbench -M prepared)
            // must not fail while the metadata node restarts after a
            // crash: the statements it prepares run on the workers.
            self.metadata_restart_deadline = (synced && plan.side_effect_free).then(|| {
                *restart_deadline.get_or_insert_with(|| Instant::now() + METADATA_RESTART_WAIT)
            });
            let sent = self.send_batch(&batch, &plan, &map, retryable).await;
            self.metadata_restart_deadline = None;
            match sent? {
                Outcome::Done => {
                    let bound = || bound_statements(&batch);
                    if !self.last_failed && self.tx.state != TxState::Idle {
                        // Savepoints the node defined with other statements:
                        // nodes the transaction reaches later get them too.
                        for statement in bound() {
                            if let Analysis::Savepoint(savepoint) = &*statement.analysis {
                                self.tx.note_savepoint(savepoint);
                            }
                        }
                    }
                    if bound().any(|s| matches!(*s.analysis, Analysis::Deallocate { name: None })) {
                        self.forget_server_statements(Target::Metadata);
                    }
                    let sets = bound()
                        .filter(|statement| sets_parameter(&statement.analysis))
                        .map(|statement| statement.sql.clone())
                        .collect();
                    let discards = bound().any(|statement| discards_all(&statement.sql));
                    self.after_statements(sets, committing, discards);
                    if !synced && self.server_skipping {
                        // The server skips to the Sync after an error; so
                        // does the coordinator with what the client sends.
                        self.skip_to_sync = true;
                    }
                    return Ok(());
                }
                Outcome::Stale => tries -= 1,
                Outcome::WrongShard(error) => self.note_wrong_shard(&map, &error).await,
            }
        }
    }

    /// Reports an error the coordinator found in a batch before sending
    /// it; an open extended-protocol transaction is rolled back, and
    /// before a Sync what the client sends up to it is skipped.
    async fn fail_batch(&mut self, error: ServerError, synced: bool) -> Result<(), SessionError> {
        self.reply_error(error);
        self.abort_held();
        self.finish_batch(synced).await
    }

    /// A connection held since a Flush outside a transaction runs the
    /// implicit transaction of the extended-protocol messages so far; a
    /// Sync would commit it, so after an error it is closed instead (the
    /// server rolls back).
    pub(super) fn abort_held(&mut self) {
        if let Some((_, mut lease)) = self.held.take() {
            lease.connection().broken = true;
        }
    }

    /// Picks the batch's node and each bound statement's text there.
    fn plan_batch(
        &self,
        batch: &[BatchItem],
        map: &ClusterMap,
        looked_up: &LookedUp,
    ) -> Result<BatchPlan, ServerError> {
        let pinned = self
            .tx
            .pinned
            .as_ref()
            .or(self.held.as_ref())
            .map(|(target, _)| *target);
        // A failed transaction on its server: the server answers everything.
        if let (TxState::Failed, Some(target)) = (self.tx.state, pinned) {
            return Ok(BatchPlan {
                target,
                texts: HashMap::new(),
                shard: None,
                side_connection: false,
                side_effect_free: false,
                lookups: Vec::new(),
            });
        }
        let mut session = self.routing_session();
        // Read routes only for a batch of plain reads: a read after a write
        // of the same implicit transaction must see it.
        if batch.iter().any(|item| {
            matches!(item.message, FrontendMessage::Bind(_))
                && item
                    .statement
                    .as_ref()
                    .is_some_and(|statement| router::may_write(&statement.analysis))
        }) {
            session.outside_transaction = false;
        }
        let mut routes: Vec<(usize, Route)> = Vec::new();
        let mut lookups = Vec::new();
        let mut runs = false;
        for (index, item) in batch.iter().enumerate() {
            match &item.message {
                FrontendMessage::Bind(bind) => {
                    runs = true;
                    let Some(statement) = &item.statement else {
                        continue;
                    };
                    let route = match &*statement.analysis {
                        Analysis::Routable(shape) if self.routing => {
                            let route = router::route(
                                shape,
                                &statement.sql,
                                &statement.normalized,
                                map,
                                &session,
                                Some(&router::Parameters {
                                    values: &bind.parameters,
                                    formats: &|i| bind.parameter_format(i),
                                    declared_types: &statement.parameter_types,
                                }),
                            );
                            match (route, looked_up.get(&index)) {
                                (Route::Lookup(_), Some(Some(ids))) => router::route_looked_up(
                                    shape,
                                    &statement.sql,
                                    &statement.normalized,
                                    map,
                                    &session,
                                    ids,
                                ),
                                (Route::Lookup(hop), None) => {
                                    lookups.push((index, hop));
                                    Route::Metadata
                                }
                                (route, _) => route,
                            }
                        }
                        _ => Route::Metadata,
                    };
                    routes.push((index, route));
                }
                FrontendMessage::Execute { .. }
                | FrontendMessage::Close {
                    kind: tags::PORTAL, ..
                } => runs = true,
                FrontendMessage::Describe {
                    kind: tags::PORTAL, ..
                } => runs = true,
                _ => {}
            }
        }
        if !runs {
            // Nothing executes. Between Flush and Sync, or in a transaction
            // on the metadata node, the batch goes on its connection (a Sync
            // must end what is open there). Parse / Describe statement in a
            // transaction on a worker: the metadata node answers on another
            // connection (it knows every table by its name; no side effects).
            // Otherwise the metadata node.
            let describes = batch.iter().any(|item| {
                matches!(
                    item.message,
                    FrontendMessage::Parse { .. }
                        | FrontendMessage::Describe {
                            kind: tags::STATEMENT,
                            ..
                        }
                )
            });
            let (target, side_connection) = match (self.held.as_ref(), pinned) {
                (Some((held, _)), _) => (*held, false),
                (None, Some(Target::Worker(_))) if describes => (Target::Metadata, true),
                (None, Some(target)) => (target, false),
                // A transaction that has not picked its node yet (BEGIN,
                // then a prepare, as pgbench -M prepared does): answered
                // outside it, so that its first statement still picks.
                (None, None) if self.tx.state == TxState::Open && describes => {
                    (Target::Metadata, true)
                }
                (None, None) => (Target::Metadata, false),
            };
            return Ok(BatchPlan {
                target,
                texts: HashMap::new(),
                shard: None,
                side_connection,
                side_effect_free: target == Target::Metadata
                    && self.held.is_none()
                    && (pinned.is_none() || side_connection),
                lookups: Vec::new(),
            });
        }
        // Every bound statement must fit one node: the node of the batch
        // held since a Flush, else the one the first statement picks (a
        // batch that binds nothing runs where the transaction last ran).
        let held = self.held.as_ref().map(|(target, _)| *target);
        let mut target: Option<Target> = if routes.is_empty() { pinned } else { held };
        let mut texts = HashMap::new();
        let mut shard = None;
        let mut all_routed = true;
        for (index, route) in routes {
            let Some(statement) = &batch[index].statement else {
                continue;
            };
            let placed = self.place(route, &statement.analysis, &statement.sql, map);
            let (placed, text, s) = match placed {
                Ok(placed) => placed,
                Err(error) if !self.tx.members.is_empty() => return Err(error),
                Err(_) => {
                    all_routed = false;
                    continue;
                }
            };
            if target.is_some_and(|t| t != placed) {
                // The metadata node could run the whole batch, but not in a
                // transaction that ran on workers.
                if self.tx.has_worker_members() || matches!(held, Some(Target::Worker(_))) {
                    return Err(batch_spans_nodes());
                }
                all_routed = false;
            }
            target.get_or_insert(placed);
            shard = shard.or(s);
            texts.insert(index, text);
        }
        let target = match target {
            Some(target) if all_routed => target,
            // Binds that disagree: the metadata node runs the whole batch.
            _ => {
                texts.clear();
                shard = None;
                Target::Metadata
            }
        };
        if target == Target::Metadata {
            texts.clear();
        }
        // The coordinator ends a transaction on several nodes and runs its
        // savepoint commands on each: not in a batch with other statements.
        let controls = batch.iter().any(|item| {
            matches!(item.message, FrontendMessage::Bind(_))
                && item.statement.as_ref().is_some_and(|statement| {
                    matches!(
                        *statement.analysis,
                        Analysis::Savepoint(_)
                            | Analysis::Transaction(
                                TransactionCommand::Commit
                                    | TransactionCommand::Rollback
                                    | TransactionCommand::Other
                            )
                    )
                })
        });
        let nodes = self.tx.members.len() + usize::from(!self.tx.has_begun_on(target));
        if controls && self.tx.state != TxState::Idle && nodes > 1 {
            return Err(batch_spans_nodes());
        }
        Ok(BatchPlan {
            target,
            texts,
            shard,
            side_connection: false,
            side_effect_free: false,
            lookups,
        })
    }

    pub(super) async fn send_batch(
        &mut self,
        batch: &[BatchItem],
        plan: &BatchPlan,
        map: &ClusterMap,
        retryable: bool,
    ) -> Result<Outcome, SessionError> {
        let synced = matches!(
            batch.last().map(|item| &item.message),
            Some(FrontendMessage::Sync)
        );
        if self.batch_multiplexable(batch, plan) {
            if let Some(pipe) = self.pipe(plan.target, map) {
                let answers = batch
                    .iter()
                    .filter(|item| matches!(item.message, FrontendMessage::Sync))
                    .count();
                let ran = self
                    .multiplexed(pipe, map, plan.shard, retryable, |session, prepared| {
                        let (bytes, expects, prepares) =
                            session.batch_request(batch, plan, prepared);
                        let built = Built {
                            bytes,
                            answers,
                            prepares,
                        };
                        Some((built, expects))
                    })
                    .await?;
                if let Some(outcome) = ran {
                    return Ok(outcome);
                }
            }
        }
        let Some(mut lease) = self
            .acquire(plan.target, map, plan.side_connection, synced)
            .await?
        else {
            return Ok(Outcome::Done);
        };
        // What running the bound statements may leave on the connection.
        let effect = batch
            .iter()
            .filter(|item| matches!(item.message, FrontendMessage::Bind(_)))
            .filter_map(|item| item.statement.as_ref())
            .map(|statement| session_effect(&statement.analysis))
            .max()
            .unwrap_or(SessionEffect::None);
        let (mut request, mut expects, _) =
            self.batch_request(batch, plan, &lease.connection().prepared);
        if plan.side_connection && !synced {
            // Not the client's transaction: its implicit one ends here.
            protocol::sync(&mut request);
            expects.push(Expect::QuietSync);
        }
        self.exchange(
            lease,
            map,
            Exchange {
                target: plan.target,
                shard: plan.shard,
                retryable,
                side_connection: plan.side_connection,
                synced,
                effect,
                request,
                expects,
            },
        )
        .await
    }
}

/// The statements a batch binds, in order.
fn bound_statements(batch: &[BatchItem]) -> impl Iterator<Item = &Arc<Prepared>> {
    batch
        .iter()
        .filter(|item| matches!(item.message, FrontendMessage::Bind(_)))
        .filter_map(|item| item.statement.as_ref())
}
