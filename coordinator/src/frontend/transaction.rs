//! The client's transaction: its state, the BEGIN held back until the
//! first statement picks the node, the pinned server connection, and how
//! the coordinator answers and ends it.

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
    /// The BEGIN text, sent with the first statement.
    pub(super) begin: Option<String>,
    /// The node and connection the transaction runs on, once it has begun.
    pub(super) pinned: Option<(Target, Lease)>,
}

impl Transaction {
    pub(super) fn idle() -> Transaction {
        Transaction {
            state: TxState::Idle,
            begin: None,
            pinned: None,
        }
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
                if self.state != TxState::Idle && self.pinned.is_none() =>
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
}

impl Session {
    pub(super) fn end_transaction(&mut self) {
        self.tx.state = TxState::Idle;
        self.tx.begin = None;
        if let Some((target, lease)) = self.tx.pinned.take() {
            self.release(target, lease);
        }
        self.portals.clear();
    }

    /// A statement needs another node than the transaction's: report it,
    /// roll the transaction back on its node, and fail it for the client.
    pub(super) async fn abort_pinned(&mut self, error: ServerError) {
        self.reply_error(error);
        if let Some((target, mut lease)) = self.tx.pinned.take() {
            self.roll_back(&mut lease).await;
            self.release(target, lease);
        }
        self.abort_held();
        self.tx.state = if self.tx.state == TxState::Idle {
            TxState::Idle
        } else {
            TxState::Failed
        };
        self.tx.begin = None;
    }

    /// Rolls back the transaction open on `lease`.
    async fn roll_back(&mut self, lease: &mut Lease) {
        {
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
                            connection.status =
                                body.first().copied().unwrap_or(tags::status::FAILED);
                            connection.awaiting_sync = false;
                            return Ok::<_, crate::backend::connection::BackendError>(());
                        }
                    }
                }
            }
            .await;
            if rolled_back.is_err() {
                connection.broken = true;
            }
        }
    }

    /// BEGIN, or COMMIT/ROLLBACK of a transaction that has not reached a
    /// server yet, sent with the extended protocol (as drivers and pgbench
    /// -M extended/prepared do): answered here, as in [`Self::simple_query`].
    /// False when the batch holds anything else.
    pub(super) fn answer_transaction_batch(&mut self, batch: &[BatchItem]) -> bool {
        // A transaction command bound in an earlier batch (ended by Flush,
        // as pg8000 sends them) and executed in this one.
        let pending = self.pending_transaction.take();
        let mut command = None;
        let mut executed = None;
        for item in batch {
            match &item.message {
                FrontendMessage::Bind(bind) => {
                    if command.is_some() {
                        return false;
                    }
                    let Some(statement) = &item.statement else {
                        return false;
                    };
                    let Analysis::Transaction(kind) = &*statement.analysis else {
                        return false;
                    };
                    command = Some((*kind, statement.sql.clone(), bind.portal.clone()));
                }
                FrontendMessage::Parse { .. } => {
                    let is_transaction = item
                        .statement
                        .as_ref()
                        .is_some_and(|s| matches!(*s.analysis, Analysis::Transaction(_)));
                    if !is_transaction {
                        return false;
                    }
                }
                FrontendMessage::Execute { portal, .. } => {
                    if executed.is_some() {
                        return false;
                    }
                    executed = Some(portal.clone());
                }
                FrontendMessage::Describe { .. }
                | FrontendMessage::Sync
                | FrontendMessage::Flush => {}
                _ => return false,
            }
        }
        if command.is_none() {
            command = pending;
        }
        let Some((kind, sql, portal)) = command else {
            return false;
        };
        if executed
            .as_ref()
            .is_some_and(|executed| *executed != portal)
        {
            return false;
        }
        if self.held.is_some() {
            return false;
        }
        let Some(tag) = self.tx.answered_here(kind) else {
            return false;
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
                    protocol::command_complete(&mut self.output, tag)
                }
                _ => {}
            }
        }
        if executed.is_none() {
            // Bound, not executed yet: it takes effect with its Execute.
            self.pending_transaction = Some((kind, sql, portal));
        } else if kind == TransactionCommand::Begin {
            self.tx.begin(sql);
        } else {
            self.end_transaction();
        }
        true
    }
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
}
