//! The nodes a transaction reached: statements the coordinator runs on
//! each of them itself (savepoint commands, ROLLBACK, the steps of a
//! COMMIT), sent to all before any answer is read so that the round trips
//! overlap.

use super::*;
use crate::backend::connection::{Answer, BackendError};
use crate::net::sqlstate;
use crate::net::tags;

/// What one node answered to a statement the coordinator sent it.
pub(super) struct NodeAnswer {
    pub(super) target: Target,
    pub(super) answer: Result<Answer, BackendError>,
}

impl NodeAnswer {
    /// The statement failed, or the node could not be asked.
    pub(super) fn failed(&self) -> bool {
        !matches!(&self.answer, Ok(answer) if answer.error.is_none())
    }
}

impl Session {
    /// Sends `statement(target)` to each of the transaction's connections
    /// it gives a statement for, then reads every answer. Notices are
    /// passed on to the client.
    pub(super) async fn on_each_node(
        &mut self,
        statement: impl Fn(Target) -> Option<String>,
    ) -> Vec<NodeAnswer> {
        let mut asked: Vec<(Target, &mut Lease, Result<(), BackendError>)> = Vec::new();
        for (target, lease) in self.tx.pinned.iter_mut().chain(self.tx.parked.iter_mut()) {
            if let Some(sql) = statement(*target) {
                let sent = lease.connection().send_query(&sql).await;
                asked.push((*target, lease, sent));
            }
        }
        let mut answers = Vec::with_capacity(asked.len());
        for (target, lease, sent) in asked {
            let answer = match sent {
                Ok(()) => lease.connection().read_answer().await,
                Err(e) => Err(e),
            };
            if answer.is_err() {
                lease.connection().broken = true;
            }
            answers.push(NodeAnswer { target, answer });
        }
        for answer in &answers {
            if let Ok(answer) = &answer.answer {
                for notice in &answer.notices {
                    self.pass_notice(tags::backend::NOTICE_RESPONSE, notice);
                }
            }
        }
        answers
    }

    /// Passes on the first failure among `answers`: the node's error as it
    /// sent it, or a lost connection. False when there was none.
    pub(super) fn pass_first_failure(&mut self, answers: &[NodeAnswer]) -> bool {
        let Some(failed) = answers.iter().find(|a| a.failed()) else {
            return false;
        };
        match &failed.answer {
            Ok(Answer {
                error_body: Some(body),
                ..
            }) => self.pass(tags::backend::ERROR_RESPONSE, body),
            Ok(_) => {}
            Err(e) => self.reply_error(lost_node(failed.target, e)),
        }
        true
    }

    /// SAVEPOINT, RELEASE or ROLLBACK TO inside a transaction: run on every
    /// node the transaction reached, and noted for the nodes it reaches
    /// later (before any node, only noted). The command tag, or None when
    /// the error has been passed on (the transaction has then failed).
    pub(super) async fn savepoint(&mut self, command: &router::Savepoint) -> Option<&'static str> {
        let (tag, verb, name) = match command {
            router::Savepoint::Define(name) => ("SAVEPOINT", "SAVEPOINT", name),
            router::Savepoint::Release(name) => ("RELEASE", "RELEASE SAVEPOINT", name),
            router::Savepoint::RollbackTo(name) => ("ROLLBACK", "ROLLBACK TO SAVEPOINT", name),
        };
        let restores = matches!(command, router::Savepoint::RollbackTo(_));
        // A failed transaction takes only ROLLBACK TO, and only when every
        // node it reached is still there to roll back.
        let lost_a_node = self.tx.members.len() > self.tx.connections();
        if self.tx.state == TxState::Failed && (!restores || lost_a_node) {
            self.reply_error(aborted_error());
            return None;
        }
        let on_nodes = self.tx.connections() > 0;
        if on_nodes {
            let sql = format!("{verb} {}", pg_shard_core::quote::ident(name));
            let answers = self.on_each_node(|_| Some(sql.clone())).await;
            if self.pass_first_failure(&answers) {
                self.tx.state = TxState::Failed;
                return None;
            }
        }
        let noted = self.tx.note_savepoint(command);
        if !noted && on_nodes {
            // Every node has it though the coordinator did not note it (it
            // was defined in a batch that then failed, as pgjdbc's autosave
            // does): from here on it is known.
            if let router::Savepoint::RollbackTo(name) = command {
                self.tx.savepoints.push(name.clone());
            }
        } else if !noted {
            // No node has it (none was reached yet): the server's error.
            self.reply_error(ServerError::new(
                "3B001",
                format!("savepoint \"{name}\" does not exist"),
            ));
            self.tx.state = TxState::Failed;
            return None;
        }
        if restores {
            self.tx.state = TxState::Open;
        }
        Some(tag)
    }

    /// ROLLBACK of a transaction on several nodes.
    pub(super) async fn roll_back_transaction(&mut self) -> &'static str {
        let answers = self.on_each_node(|_| Some("ROLLBACK".into())).await;
        drop(answers);
        self.end_transaction();
        "ROLLBACK"
    }

    /// Rolls back the transaction open on `lease`.
    pub(super) async fn roll_back(&mut self, lease: &mut Lease) {
        let connection = lease.connection();
        let mut out = BytesMut::new();
        // A connection between Flush and Sync answers nothing before a Sync.
        let mut answers = 1;
        if connection.awaiting_sync {
            protocol::sync(&mut out);
            answers = 2;
        }
        protocol::query(&mut out, "ROLLBACK");
        let rolled_back = async {
            connection.write(&out).await?;
            loop {
                let (tag, body) = connection.read().await?;
                if tag == tags::backend::READY_FOR_QUERY {
                    answers -= 1;
                    if answers == 0 {
                        connection.status = body.first().copied().unwrap_or(tags::status::FAILED);
                        connection.awaiting_sync = false;
                        return Ok::<_, BackendError>(());
                    }
                }
            }
        }
        .await;
        // (Not idle after it: an answer was still due, for a COPY batch in
        // flight; the connection closes and its server rolls back.)
        if rolled_back.is_err() || connection.status != tags::status::IDLE {
            connection.broken = true;
        }
    }
}

/// A node of the transaction could not be reached.
pub(super) fn lost_node(target: Target, error: &BackendError) -> ServerError {
    let node = match target {
        Target::Metadata => "the metadata node".to_string(),
        Target::Worker(node) => format!("worker node {node}"),
    };
    ServerError::new(
        sqlstate::CONNECTION_FAILURE,
        format!(
            "pg_shard coordinator: the connection to {node} of this transaction failed: {error}"
        ),
    )
}
