//! COMMIT of a transaction that reached several nodes.
//!
//! Each node is asked whether its part wrote anything. With at most one
//! writer, that node commits first and the others after it (a plain
//! COMMIT each: the readers' outcome does not matter). With several, two-
//! phase commit decided on the metadata node, in the format of the
//! extension's own remote transactions so that its recovery
//! (`pg_shard.recover_prepared_transactions()`, run by the job runners)
//! ends what a crash leaves:
//!
//! 1. a transaction on the metadata node (the client's own there, if the
//!    transaction reached it; else one of the coordinator's) records a
//!    global id per writing worker (`pg_shard.coordinated_commit_gids`),
//!    its WAL flushed;
//! 2. PREPARE TRANSACTION on each writing worker under its id;
//! 3. the metadata node's transaction commits: the decision (no record →
//!    the recovery rolls back, records → it commits);
//! 4. COMMIT PREPARED on each, then COMMIT on the readers.
//!
//! The client hears COMMIT only after step 3. A failure before it rolls
//! back everywhere; a failure after it leaves the rest to the recovery.

use super::participants::{lost_node, NodeAnswer};
use super::*;
use crate::backend::connection::{Answer, BackendError};
use crate::net::sqlstate;
use std::sync::OnceLock;

/// Points of a two-phase commit where a test may hold the coordinator
/// (and kill it): `PGSHARD_COORDINATOR_TEST_PAUSE=<step>:<milliseconds>`.
/// Tests only; unset, nothing pauses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The ids are recorded (not committed), nothing prepared.
    BeforePrepare,
    /// The first writer is prepared, the others not.
    BetweenPrepares,
    /// The decision committed, nothing committed on the workers.
    AfterDecision,
    /// The first writer's prepared transaction committed, the others not.
    BetweenCommitPrepareds,
}

fn test_pause() -> Option<(Step, Duration)> {
    static PAUSE: OnceLock<Option<(Step, Duration)>> = OnceLock::new();
    *PAUSE.get_or_init(|| {
        let setting = std::env::var("PGSHARD_COORDINATOR_TEST_PAUSE").ok()?;
        let (step, ms) = setting.split_once(':')?;
        let step = match step {
            "before_prepare" => Step::BeforePrepare,
            "between_prepares" => Step::BetweenPrepares,
            "after_decision" => Step::AfterDecision,
            "between_commit_prepareds" => Step::BetweenCommitPrepareds,
            _ => return None,
        };
        Some((step, Duration::from_millis(ms.parse().ok()?)))
    })
}

async fn pause_at(step: Step) {
    if let Some((at, duration)) = test_pause() {
        if at == step {
            tracing::warn!(?step, "test pause in a two-phase commit");
            tokio::time::sleep(duration).await;
        }
    }
}

/// Whether a step that runs on several writers goes one writer at a time
/// (so that a test can stop it between two of them).
fn one_at_a_time(step: Step) -> bool {
    test_pause().is_some_and(|(at, _)| at == step)
}

impl Session {
    /// COMMIT of a transaction on several nodes. The command tag, or None
    /// when an error has been passed on; either way the transaction has
    /// ended.
    pub(super) async fn commit_transaction(&mut self) -> Option<&'static str> {
        if self.tx.state == TxState::Failed {
            return Some(self.roll_back_transaction().await);
        }
        let connected: Vec<Target> = self
            .tx
            .pinned
            .iter()
            .chain(self.tx.parked.iter())
            .map(|(target, _)| *target)
            .collect();
        let writers: Vec<Target> = connected
            .into_iter()
            .filter(|target| self.tx.wrote_on.contains(target))
            .collect();
        let committed = if writers.len() <= 1 {
            self.commit_one_writer(writers.first().copied()).await
        } else {
            self.commit_in_two_phases(&writers).await
        };
        self.end_transaction();
        committed.then_some("COMMIT")
    }

    /// The writer (if any) commits, then the rest.
    async fn commit_one_writer(&mut self, writer: Option<Target>) -> bool {
        if let Some(writer) = writer {
            let answers = self
                .on_each_node(|target| (target == writer).then(|| "COMMIT".into()))
                .await;
            if self.pass_first_failure(&answers) {
                // Its transaction ended with the failed COMMIT.
                self.roll_back_except(&[writer]).await;
                return false;
            }
        }
        let rest = self
            .on_each_node(|target| (Some(target) != writer).then(|| "COMMIT".into()))
            .await;
        self.warn_of_failures(&rest, "its COMMIT failed after the writing node's");
        true
    }

    async fn commit_in_two_phases(&mut self, writers: &[Target]) -> bool {
        // The deciding transaction: the client's own on the metadata node
        // (whatever it wrote commits with the decision), else one of ours.
        let own_decision = self.tx.has_begun_on(Target::Metadata);
        let mut decider = None;
        if !own_decision {
            match self.decision_connection().await {
                Ok(lease) => decider = Some(lease),
                Err(error) => {
                    self.reply_error(error);
                    self.roll_back_transaction().await;
                    return false;
                }
            }
        }
        let prepared: Vec<Target> = writers
            .iter()
            .copied()
            .filter(|t| *t != Target::Metadata)
            .collect();
        let node_ids: Vec<String> = prepared
            .iter()
            .filter_map(|t| match t {
                Target::Worker(node) => Some(node.to_string()),
                Target::Metadata => None,
            })
            .collect();
        let record = format!(
            "SELECT pg_shard.coordinated_commit_gids('{{{}}}'::pg_catalog.int4[])",
            node_ids.join(",")
        );
        let recorded = match decider.as_mut() {
            Some(lease) => {
                let sql = format!("BEGIN ISOLATION LEVEL READ COMMITTED READ WRITE;\n{record}");
                let mut asked = ask(lease, &sql).await;
                if asked.is_err() && lease.reused {
                    // Pooled, and its server went away since: a new one.
                    self.shared.pools.discard_idle(lease);
                    match self.decision_connection().await {
                        Ok(fresh) => {
                            *lease = fresh;
                            asked = ask(lease, &sql).await;
                        }
                        Err(error) => {
                            self.reply_error(error);
                            self.roll_back_transaction().await;
                            return false;
                        }
                    }
                }
                asked
            }
            None => {
                let answers = self
                    .on_each_node(|t| (t == Target::Metadata).then(|| record.clone()))
                    .await;
                first_answer(answers)
            }
        };
        let gids: Vec<String> = match recorded {
            Ok(answer) if answer.error.is_none() => answer
                .first_values
                .first()
                .and_then(|array| array.as_deref())
                .and_then(plain_text_array)
                .unwrap_or_default(),
            Ok(answer) => {
                match answer.error_body {
                    Some(body) => self.pass(tags::backend::ERROR_RESPONSE, &body),
                    None => self.reply_error(ServerError::new(
                        sqlstate::INTERNAL_ERROR,
                        "pg_shard coordinator: the metadata node returned no transaction ids for the commit",
                    )),
                }
                self.abandon_decision(decider).await;
                self.roll_back_transaction().await;
                return false;
            }
            Err(e) => {
                self.reply_error(lost_node(Target::Metadata, &e));
                self.abandon_decision(decider).await;
                self.roll_back_transaction().await;
                return false;
            }
        };
        if gids.len() != prepared.len() {
            self.reply_error(ServerError::new(
                sqlstate::INTERNAL_ERROR,
                "pg_shard coordinator: the metadata node returned no transaction ids for the commit",
            ));
            self.abandon_decision(decider).await;
            self.roll_back_transaction().await;
            return false;
        }
        let gid_of = |target: Target| {
            prepared
                .iter()
                .position(|t| *t == target)
                .map(|at| gids[at].clone())
        };
        pause_at(Step::BeforePrepare).await;

        // Phase one.
        let prepare = |target: Target| {
            gid_of(target).map(|gid| {
                format!(
                    "PREPARE TRANSACTION {}",
                    pg_shard_core::quote::literal(&gid)
                )
            })
        };
        let answers = self
            .on_each_node_paced(Step::BetweenPrepares, &prepared, prepare)
            .await;
        if self.pass_first_failure(&answers) {
            self.abandon_decision(decider).await;
            // A failed PREPARE ends its transaction; the prepared ones and
            // the rest roll back.
            let failed: Vec<Target> = answers
                .iter()
                .filter(|a| a.failed())
                .map(|a| a.target)
                .collect();
            let undo = |target: Target| {
                if failed.contains(&target) {
                    return None;
                }
                Some(match gid_of(target) {
                    Some(gid) if answers.iter().any(|a| a.target == target) => {
                        format!("ROLLBACK PREPARED {}", pg_shard_core::quote::literal(&gid))
                    }
                    _ => "ROLLBACK".into(),
                })
            };
            let rolled_back = self.on_each_node(undo).await;
            drop(rolled_back);
            return false;
        }

        // The decision.
        let decided = match decider.as_mut() {
            Some(lease) => ask(lease, "COMMIT").await,
            None => {
                let answers = self
                    .on_each_node(|t| (t == Target::Metadata).then(|| "COMMIT".into()))
                    .await;
                first_answer(answers)
            }
        };
        match decided {
            Ok(answer) if answer.error.is_none() => {}
            Ok(answer) => {
                // The metadata node did not commit (its own part failed):
                // nothing commits.
                if let Some(body) = answer.error_body {
                    self.pass(tags::backend::ERROR_RESPONSE, &body);
                }
                let undo = |target: Target| match gid_of(target) {
                    Some(gid) => Some(format!(
                        "ROLLBACK PREPARED {}",
                        pg_shard_core::quote::literal(&gid)
                    )),
                    // (The metadata node's transaction ended with its COMMIT.)
                    None if target == Target::Metadata => None,
                    None => Some("ROLLBACK".into()),
                };
                let rolled_back = self.on_each_node(undo).await;
                drop(rolled_back);
                return false;
            }
            Err(e) => {
                // Committed or not: the recovery will tell, by the record.
                self.reply_error(
                    ServerError::new(
                        sqlstate::CONNECTION_FAILURE,
                        format!("pg_shard coordinator: the metadata node was lost while it recorded this transaction's commit: {e}"),
                    )
                    .with_detail("The transaction is prepared on its nodes; whether it commits is decided by the metadata node's record of it.")
                    .with_hint("pg_shard.recover_prepared_transactions() on the metadata node ends it (its job runners call it every minute)."),
                );
                return false;
            }
        }
        pause_at(Step::AfterDecision).await;

        // Phase two (the metadata node committed with the decision).
        let finish = |target: Target| {
            Some(match gid_of(target) {
                Some(gid) => format!("COMMIT PREPARED {}", pg_shard_core::quote::literal(&gid)),
                None => "COMMIT".into(),
            })
            .filter(|_| target != Target::Metadata)
        };
        // Answered before the client hears COMMIT: once it has, any other
        // session must see the transaction committed on every node.
        let finished = self
            .on_each_node_paced(Step::BetweenCommitPrepareds, &prepared, finish)
            .await;
        self.warn_of_failures(
            &finished,
            "it is committed; pg_shard.recover_prepared_transactions() finishes it on that node",
        );
        true
    }

    /// [`Self::on_each_node`], except under a test pause at `step`: then
    /// the `writers` one at a time in order (the pause before the second),
    /// and the other nodes after them.
    async fn on_each_node_paced(
        &mut self,
        step: Step,
        writers: &[Target],
        statement: impl Fn(Target) -> Option<String>,
    ) -> Vec<NodeAnswer> {
        if !one_at_a_time(step) {
            return self.on_each_node(statement).await;
        }
        let mut answers = Vec::new();
        for (at, writer) in writers.iter().enumerate() {
            if at == 1 {
                pause_at(step).await;
            }
            let writer = *writer;
            let one = self
                .on_each_node(|t| if t == writer { statement(t) } else { None })
                .await;
            answers.extend(one);
        }
        let rest = self
            .on_each_node(|t| {
                if writers.contains(&t) {
                    None
                } else {
                    statement(t)
                }
            })
            .await;
        answers.extend(rest);
        answers
    }

    /// A connection to the metadata node for a decision of the
    /// coordinator's own (the client's role, from its pool).
    async fn decision_connection(&mut self) -> Result<Lease, ServerError> {
        let mut lease = self
            .pooled_connection(
                self.shared.metadata.clone(),
                "no connection to the metadata node to decide the commit",
            )
            .await?;
        // Settings made for another client are not this one's.
        lease.connection().session_settings = None;
        Ok(lease)
    }

    /// Rolls back the transaction on its nodes but `except`.
    async fn roll_back_except(&mut self, except: &[Target]) {
        let answers = self
            .on_each_node(|t| (!except.contains(&t)).then(|| "ROLLBACK".into()))
            .await;
        drop(answers);
    }

    /// Rolls back a decision that will not be made (its records go).
    async fn abandon_decision(&mut self, decider: Option<Lease>) {
        if let Some(mut lease) = decider {
            self.roll_back(&mut lease).await;
        }
    }

    /// A warning per node whose last step failed after the decision.
    fn warn_of_failures(&mut self, answers: &[NodeAnswer], consequence: &str) {
        for failed in answers.iter().filter(|a| a.failed()) {
            let cause = match &failed.answer {
                Ok(Answer {
                    error: Some(error), ..
                }) if error.code == "42704" => continue, // the recovery finished it first
                Ok(Answer {
                    error: Some(error), ..
                }) => error.message.clone(),
                Ok(_) => continue,
                Err(e) => e.to_string(),
            };
            let node = match failed.target {
                Target::Metadata => "the metadata node".to_string(),
                Target::Worker(node) => format!("worker node {node}"),
            };
            protocol::notice_response(
                &mut self.output,
                &ServerError::warning(format!(
                    "pg_shard coordinator: on {node}: {cause}; {consequence}"
                )),
            );
        }
    }
}

/// A query of the coordinator's own on one connection.
async fn ask(lease: &mut Lease, sql: &str) -> Result<Answer, BackendError> {
    let connection = lease.connection();
    let answer = async {
        connection.send_query(sql).await?;
        connection.read_answer().await
    }
    .await;
    if answer.is_err() {
        connection.broken = true;
    }
    answer
}

/// The metadata node's answer among `answers` (the only one asked).
fn first_answer(answers: Vec<NodeAnswer>) -> Result<Answer, BackendError> {
    match answers.into_iter().next() {
        Some(NodeAnswer { answer, .. }) => answer,
        None => Err(BackendError::Closed),
    }
}

/// The elements of a text array in PostgreSQL's output form whose
/// elements need no quoting (global transaction ids: letters, digits and
/// underscores); None for anything else.
fn plain_text_array(text: &str) -> Option<Vec<String>> {
    let inner = text.strip_prefix('{')?.strip_suffix('}')?;
    if inner.is_empty() {
        return Some(Vec::new());
    }
    inner
        .split(',')
        .map(|element| {
            element
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                .then(|| element.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::plain_text_array;

    #[test]
    fn reads_the_ids_of_a_text_array() {
        assert_eq!(
            plain_text_array("{pg_shard_1_2_3_4,pg_shard_1_2_3_5}"),
            Some(vec!["pg_shard_1_2_3_4".into(), "pg_shard_1_2_3_5".into()])
        );
        assert_eq!(plain_text_array("{}"), Some(vec![]));
        // Anything quoted or not an array is not a list of ids.
        assert_eq!(plain_text_array("{\"a,b\",c}"), None);
        assert_eq!(plain_text_array("pg_shard_1"), None);
    }
}
