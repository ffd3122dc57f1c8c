//! The client's transaction: its state, the BEGIN held back until the
//! first statement picks a node, the server connection of each node it
//! reached (one per node for its whole life), its savepoints, and how the
//! coordinator answers and ends it.

use super::*;
use crate::net::tags;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TxState {
    Idle,
    Open,
    Failed,
}

pub(super) struct Transaction {
    pub(super) state: TxState,
    /// The BEGIN text, sent to each node with the transaction's first
    /// statement there.
    pub(super) begin: Option<String>,
    /// The connection of the node the last statement ran on.
    pub(super) pinned: Option<(Target, Lease)>,
    /// The connections of the other nodes the transaction reached.
    pub(super) parked: Vec<(Target, Lease)>,
    /// The nodes the transaction has begun on (a node whose connection was
    /// lost stays here: the transaction cannot begin there again).
    pub(super) members: Vec<Target>,
    /// Savepoints defined and not released, oldest first: a node the
    /// transaction reaches later gets them too, so that rolling back to
    /// one undoes its work there as well.
    pub(super) savepoints: Vec<String>,
    /// The metadata node ran a statement that may involve distributed
    /// tables: it runs the rest of the transaction (only it sees what that
    /// statement wrote through its own connections to the workers).
    pub(super) metadata_distributed: bool,
    /// Nodes where a statement that may write ran (router::may_write):
    /// only they take part in the commit decision.
    pub(super) wrote_on: Vec<Target>,
}

impl Transaction {
    pub(super) fn idle() -> Transaction {
        Transaction {
            state: TxState::Idle,
            begin: None,
            pinned: None,
            parked: Vec::new(),
            members: Vec::new(),
            savepoints: Vec::new(),
            metadata_distributed: false,
            wrote_on: Vec::new(),
        }
    }

    /// Server connections the transaction holds.
    pub(super) fn connections(&self) -> usize {
        usize::from(self.pinned.is_some()) + self.parked.len()
    }

    /// The coordinator ends the transaction itself: it runs on more than
    /// one node, or its last node's connection is not the one in use (it
    /// was lost, or a new node's could not be had), or it lost a node.
    pub(super) fn ended_by_coordinator(&self) -> bool {
        self.connections() > 1
            || (self.pinned.is_none() && self.connections() > 0)
            || (self.members.len() > self.connections() && self.connections() > 0)
    }

    pub(super) fn has_begun_on(&self, target: Target) -> bool {
        self.members.contains(&target)
    }

    pub(super) fn has_worker_members(&self) -> bool {
        self.members.iter().any(|t| matches!(t, Target::Worker(_)))
    }

    /// A statement that may write runs on `target`.
    pub(super) fn note_write(&mut self, target: Target, writes: bool) {
        if writes && !self.wrote_on.contains(&target) {
            self.wrote_on.push(target);
        }
    }

    /// The transaction has begun on `target`.
    pub(super) fn join(&mut self, target: Target) {
        if !self.members.contains(&target) {
            self.members.push(target);
        }
    }

    /// What a node the transaction reaches now runs first: BEGIN and the
    /// savepoints defined so far.
    pub(super) fn begin_on_new_node(&self) -> String {
        let mut text = self.begin.clone().unwrap_or_else(|| "BEGIN".into());
        for name in &self.savepoints {
            text.push_str(";\nSAVEPOINT ");
            text.push_str(&pg_shard_core::quote::ident(name));
        }
        text
    }

    /// The command tag when the coordinator answers `command` itself: a
    /// BEGIN outside a transaction (held back until the first statement
    /// picks the node), and the end of a transaction that sent nothing
    /// anywhere (a failed one ends as ROLLBACK, as on the server). None
    /// when the command goes to the transaction's node.
    pub(super) fn answered_here(&self, command: TransactionCommand) -> Option<&'static str> {
        match command {
            TransactionCommand::Begin if self.state == TxState::Idle => Some("BEGIN"),
            TransactionCommand::Commit | TransactionCommand::Rollback
                if self.state != TxState::Idle && self.connections() == 0 =>
            {
                Some(
                    if command == TransactionCommand::Commit && self.state == TxState::Open {
                        "COMMIT"
                    } else {
                        "ROLLBACK"
                    },
                )
            }
            _ => None,
        }
    }

    /// BEGIN was answered: `sql` goes with the first statement.
    pub(super) fn begin(&mut self, sql: String) {
        self.state = TxState::Open;
        self.begin = Some(sql);
    }

    /// Notes a savepoint command that succeeded on every node (or that the
    /// coordinator answered, before any node): false when the savepoint
    /// named does not exist.
    pub(super) fn note_savepoint(&mut self, command: &router::Savepoint) -> bool {
        let position = |name: &str| self.savepoints.iter().rposition(|s| s == name);
        match command {
            router::Savepoint::Define(name) => {
                self.savepoints.push(name.clone());
                true
            }
            router::Savepoint::Release(name) => match position(name) {
                Some(at) => {
                    self.savepoints.truncate(at);
                    true
                }
                None => false,
            },
            router::Savepoint::RollbackTo(name) => match position(name) {
                Some(at) => {
                    self.savepoints.truncate(at + 1);
                    true
                }
                None => false,
            },
        }
    }
}

impl Session {
    pub(super) fn end_transaction(&mut self) {
        let ended = std::mem::replace(&mut self.tx, Transaction::idle());
        for (target, mut lease) in ended.pinned.into_iter().chain(ended.parked) {
            // One still in a transaction (a node whose part was not ended)
            // closes: its server rolls back. Never pooled or kept so.
            if lease.connection().status != tags::status::IDLE {
                lease.connection().broken = true;
            }
            self.release(target, lease);
        }
        self.portals.clear();
    }

    /// A statement the transaction cannot run: report it, roll the
    /// transaction back on every node, and fail it for the client.
    pub(super) async fn abort_pinned(&mut self, error: ServerError) {
        self.reply_error(error);
        self.roll_back_everywhere().await;
        self.abort_held();
        self.start_over(self.tx.state != TxState::Idle);
    }

    /// The transaction is gone from every node: failed for the client (it
    /// ends it with ROLLBACK), or not there at all.
    pub(super) fn start_over(&mut self, failed: bool) {
        self.tx = Transaction {
            state: if failed {
                TxState::Failed
            } else {
                TxState::Idle
            },
            ..Transaction::idle()
        };
    }

    /// Rolls the transaction back on every node it reached and lets go of
    /// their connections (the transaction's state is left to the caller).
    pub(super) async fn roll_back_everywhere(&mut self) {
        let pinned = self.tx.pinned.take();
        let parked = std::mem::take(&mut self.tx.parked);
        for (target, mut lease) in pinned.into_iter().chain(parked) {
            self.roll_back(&mut lease).await;
            self.release(target, lease);
        }
    }

    /// A batch whose only statement is a transaction command the
    /// coordinator answers (as in [`Self::simple_query`]): BEGIN, and
    /// COMMIT/ROLLBACK of a transaction that has not reached a server yet;
    /// COMMIT/ROLLBACK of one on several nodes, and savepoint commands in
    /// a transaction. Sent with the extended protocol, as drivers and
    /// pgbench -M extended/prepared do. None when the batch holds anything
    /// else; else whether it succeeded (an error has been passed on).
    pub(super) async fn answer_transaction_batch(&mut self, batch: &[BatchItem]) -> Option<bool> {
        // A transaction command bound in an earlier batch (ended by Flush,
        // as pg8000 sends them) and executed in this one.
        let pending = self.pending_transaction.take();
        let mut command = None;
        let mut executed = None;
        for item in batch {
            match &item.message {
                FrontendMessage::Bind(bind) => {
                    if command.is_some() {
                        return None;
                    }
                    let statement = item.statement.as_ref()?;
                    let lone = match &*statement.analysis {
                        Analysis::Transaction(kind) => LoneCommand::Transaction(*kind),
                        Analysis::Savepoint(savepoint) => LoneCommand::Savepoint(savepoint.clone()),
                        Analysis::Deallocate { name } => LoneCommand::Deallocate(name.clone()),
                        _ => return None,
                    };
                    command = Some((lone, statement.sql.clone(), bind.portal.clone()));
                }
                FrontendMessage::Parse { .. } => {
                    let lone = item.statement.as_ref().is_some_and(|s| {
                        matches!(
                            *s.analysis,
                            Analysis::Transaction(_)
                                | Analysis::Savepoint(_)
                                | Analysis::Deallocate { .. }
                        )
                    });
                    if !lone {
                        return None;
                    }
                }
                FrontendMessage::Execute { portal, .. } => {
                    if executed.is_some() {
                        return None;
                    }
                    executed = Some(portal.clone());
                }
                FrontendMessage::Describe { .. }
                | FrontendMessage::Sync
                | FrontendMessage::Flush => {}
                _ => return None,
            }
        }
        if command.is_none() {
            command = pending;
        }
        let (lone, sql, portal) = command?;
        if executed
            .as_ref()
            .is_some_and(|executed| *executed != portal)
        {
            return None;
        }
        if self.held.is_some() {
            return None;
        }
        let answer = match &lone {
            LoneCommand::Transaction(kind) => match self.tx.answered_here(*kind) {
                Some(tag) => Answer::Tag(tag),
                None if self.tx.ended_by_coordinator() => Answer::Coordinated,
                None => return None,
            },
            LoneCommand::Savepoint(_) if self.tx.state != TxState::Idle => Answer::Coordinated,
            LoneCommand::Savepoint(_) => return None,
            LoneCommand::Deallocate(name) => match self.deallocate_here(name.as_deref()) {
                Some(tag) => Answer::Tag(tag),
                None => return None,
            },
        };
        for item in batch {
            match &item.message {
                FrontendMessage::Parse { .. } => {
                    protocol::empty(&mut self.output, tags::backend::PARSE_COMPLETE)
                }
                FrontendMessage::Bind(_) => {
                    protocol::empty(&mut self.output, tags::backend::BIND_COMPLETE)
                }
                FrontendMessage::Describe {
                    kind: tags::STATEMENT,
                    ..
                } => {
                    // No parameters, no rows.
                    protocol::parameter_description(&mut self.output, &[]);
                    protocol::empty(&mut self.output, tags::backend::NO_DATA);
                }
                FrontendMessage::Describe { .. } => {
                    protocol::empty(&mut self.output, tags::backend::NO_DATA)
                }
                FrontendMessage::Execute { .. } => {
                    let tag = match (&answer, &lone) {
                        (Answer::Tag(tag), _) => Some(*tag),
                        (Answer::Coordinated, LoneCommand::Transaction(kind)) => {
                            self.end_transaction_here(*kind).await
                        }
                        (Answer::Coordinated, LoneCommand::Savepoint(savepoint)) => {
                            self.savepoint(savepoint).await
                        }
                        (Answer::Coordinated, LoneCommand::Deallocate(_)) => None,
                    };
                    match tag {
                        Some(tag) => protocol::command_complete(&mut self.output, tag),
                        // The rest of the batch is skipped, as after a
                        // server's error.
                        None => return Some(false),
                    }
                }
                _ => {}
            }
        }
        match (executed, answer, lone) {
            // Bound, not executed yet: it takes effect with its Execute.
            (None, _, lone) => self.pending_transaction = Some((lone, sql, portal)),
            (Some(_), Answer::Tag(_), LoneCommand::Transaction(TransactionCommand::Begin)) => {
                self.tx.begin(sql)
            }
            (Some(_), Answer::Tag(_), LoneCommand::Deallocate(_)) => {}
            (Some(_), Answer::Tag(_), _) => self.end_transaction(),
            (Some(_), Answer::Coordinated, _) => {}
        }
        Some(true)
    }
}

/// A transaction command alone in an extended-protocol batch.
pub(super) enum LoneCommand {
    Transaction(TransactionCommand),
    Savepoint(router::Savepoint),
    Deallocate(Option<String>),
}

/// How the coordinator answers it.
enum Answer {
    Tag(&'static str),
    /// Run on the transaction's nodes by the coordinator.
    Coordinated,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transaction(state: TxState) -> Transaction {
        Transaction {
            state,
            ..Transaction::idle()
        }
    }

    #[test]
    fn begin_is_answered_outside_a_transaction_only() {
        assert_eq!(
            Transaction::idle().answered_here(TransactionCommand::Begin),
            Some("BEGIN")
        );
        assert_eq!(
            transaction(TxState::Open).answered_here(TransactionCommand::Begin),
            None,
            "a BEGIN inside a transaction goes to its node (which warns)"
        );
    }

    #[test]
    fn an_unsent_transaction_ends_here() {
        let open = transaction(TxState::Open);
        assert_eq!(
            open.answered_here(TransactionCommand::Commit),
            Some("COMMIT")
        );
        assert_eq!(
            open.answered_here(TransactionCommand::Rollback),
            Some("ROLLBACK")
        );
        let failed = transaction(TxState::Failed);
        assert_eq!(
            failed.answered_here(TransactionCommand::Commit),
            Some("ROLLBACK"),
            "COMMIT of a failed transaction rolls back"
        );
        assert_eq!(
            Transaction::idle().answered_here(TransactionCommand::Commit),
            None,
            "outside a transaction the server warns"
        );
    }

    #[test]
    fn begin_keeps_its_text_for_the_first_statement() {
        let mut tx = Transaction::idle();
        tx.begin("BEGIN ISOLATION LEVEL SERIALIZABLE".into());
        assert_eq!(tx.state, TxState::Open);
        assert_eq!(
            tx.begin.as_deref(),
            Some("BEGIN ISOLATION LEVEL SERIALIZABLE")
        );
    }

    #[test]
    fn a_node_reached_later_gets_begin_and_the_savepoints() {
        let mut tx = Transaction::idle();
        tx.begin("BEGIN ISOLATION LEVEL REPEATABLE READ".into());
        assert!(tx.note_savepoint(&router::Savepoint::Define("a".into())));
        assert!(tx.note_savepoint(&router::Savepoint::Define("Odd \"name".into())));
        assert_eq!(
            tx.begin_on_new_node(),
            "BEGIN ISOLATION LEVEL REPEATABLE READ;\nSAVEPOINT \"a\";\nSAVEPOINT \"Odd \"\"name\""
        );
    }

    #[test]
    fn savepoints_follow_release_and_rollback_to() {
        let mut tx = Transaction::idle();
        for name in ["a", "b", "a", "c"] {
            tx.note_savepoint(&router::Savepoint::Define(name.into()));
        }
        // ROLLBACK TO keeps the savepoint (the latest of that name).
        assert!(tx.note_savepoint(&router::Savepoint::RollbackTo("a".into())));
        assert_eq!(tx.savepoints, ["a", "b", "a"]);
        // RELEASE drops it and every later one.
        assert!(tx.note_savepoint(&router::Savepoint::Release("b".into())));
        assert_eq!(tx.savepoints, ["a"]);
        assert!(!tx.note_savepoint(&router::Savepoint::Release("zzz".into())));
        assert!(!tx.note_savepoint(&router::Savepoint::RollbackTo("b".into())));
        assert_eq!(tx.savepoints, ["a"]);
    }
}
