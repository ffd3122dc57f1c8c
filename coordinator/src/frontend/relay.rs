//! Relaying a server's answers to the client: what is expected back for
//! each message sent, notices and errors, and answers made up for messages
//! the coordinator handled itself.

use super::*;
use crate::net::tags;

/// What the coordinator expects back for each message it sent, in order.
pub(super) enum Expect {
    /// A prelude sent as a simple Query: swallowed up to its ReadyForQuery
    /// (errors are passed on).
    Hidden,
    ParseComplete {
        visible: bool,
        name: Option<String>,
    },
    BindComplete,
    CloseComplete,
    DescribeStatement,
    DescribePortal,
    Execute,
    /// A simple Query: everything up to ReadyForQuery.
    Query,
    Sync,
    /// CloseComplete of a server statement: it is gone from the connection.
    CloseStatement(String),
    /// A Sync the coordinator added (a side connection must not be left
    /// in an implicit transaction): its ReadyForQuery is not passed on.
    QuietSync,
    /// Not sent: the coordinator answers this message itself.
    Synthetic(Bytes),
}

pub(super) enum RelayError {
    Client(SessionError),
    Server(crate::backend::connection::BackendError),
    /// The server failed before answering anything (closed, or a FATAL
    /// error such as an administrator shutdown).
    ServerBeforeAnswer(crate::backend::connection::BackendError),
    /// The server ended the session with this error (already passed on).
    Fatal(String),
}

pub(super) fn synthetic(tag: u8) -> Expect {
    let mut out = BytesMut::new();
    protocol::empty(&mut out, tag);
    Expect::Synthetic(out.freeze())
}

impl Session {
    /// Writes `request` and relays the answers for `expects`. Returns the
    /// outcome and whether an error was relayed.
    pub(super) async fn relay(
        &mut self,
        connection: &mut ServerConnection,
        request: &[u8],
        expects: Vec<Expect>,
        retryable: bool,
        side_connection: bool,
    ) -> Result<(Outcome, bool), RelayError> {
        // Written while answers are read (a long pipeline's answers may
        // fill the socket before the request is all written).
        let mut pending = request;
        self.server_skipping = false;
        let mut queue: VecDeque<Expect> = expects.into();
        let mut held_error: Option<ServerError> = None;
        let mut saw_error = false;
        let mut received_any = false;
        self.emit_synthetic(&mut queue);
        while !queue.is_empty() {
            let (tag, body) = match connection.read_writing(&mut pending).await {
                Ok(message) => message,
                Err(e) if !received_any => return Err(RelayError::ServerBeforeAnswer(e)),
                Err(e) => return Err(RelayError::Server(e)),
            };
            if !received_any && tag == tags::backend::ERROR_RESPONSE {
                let error = ServerError::parse(&body);
                if error.severity == "FATAL" {
                    connection.broken = true;
                    return Err(RelayError::ServerBeforeAnswer(
                        crate::backend::connection::BackendError::Refused(error),
                    ));
                }
            }
            received_any = true;
            let hidden = matches!(queue.front(), Some(Expect::Hidden));
            match tag {
                tags::backend::NOTICE_RESPONSE | tags::backend::NOTIFICATION_RESPONSE => {
                    if !hidden {
                        self.pass_notice(tag, &body);
                    }
                    continue;
                }
                tags::backend::PARAMETER_STATUS => {
                    connection.note_parameter(&body);
                    if !hidden {
                        if let Some(value) = body.strip_prefix(b"client_encoding\0".as_slice()) {
                            self.utf8_client = value == b"UTF8\0";
                        }
                        if let Some(value) = body.strip_prefix(b"is_superuser\0".as_slice()) {
                            self.superuser = value == b"on\0";
                        }
                        self.pass(tag, &body);
                    }
                    continue;
                }
                tags::backend::ERROR_RESPONSE => {
                    saw_error = true;
                    let error = ServerError::parse(&body);
                    if matches!(error.severity.as_str(), "FATAL" | "PANIC") && !self.hold_cancels {
                        // The server ends the session: so does the client's
                        // (a shared connection's reads run again instead).
                        connection.broken = true;
                        self.pass(tag, &body);
                        self.flush_relay().await?;
                        return Err(RelayError::Fatal(error.message));
                    }
                    // A shard table the map names that is not on its
                    // worker (retired after a move, or the database was
                    // dropped and created again) means a stale map too: it
                    // is read again and the statement retried, as for PS001.
                    let held = !self.flushed_in_statement
                        && ((retryable
                            && (error.code == sqlstate::WRONG_SHARD
                                || error.code == sqlstate::UNDEFINED_TABLE))
                            || (self.hold_cancels
                                && error.code == sqlstate::QUERY_CANCELED
                                && !self.cancel_requested()));
                    let deadlock = error.code == sqlstate::QUERY_CANCELED
                        && self
                            .deadlock_fired
                            .as_ref()
                            .is_some_and(|fired| fired.load(Ordering::Acquire));
                    if deadlock {
                        let timeout = self.shared.config.distributed_deadlock_timeout;
                        self.reply_error(super::deadlock::deadlock_error(timeout));
                    } else if held {
                        held_error = Some(error);
                    } else {
                        self.pass(tag, &body);
                    }
                    match queue.front() {
                        Some(Expect::Hidden | Expect::Query) => {}
                        _ => {
                            self.server_skipping = true;
                            // The server skips to Sync; so do the expectations.
                            while let Some(front) = queue.front() {
                                if matches!(front, Expect::Sync | Expect::QuietSync) {
                                    break;
                                }
                                queue.pop_front();
                            }
                        }
                    }
                    continue;
                }
                tags::backend::READY_FOR_QUERY => {
                    self.server_skipping = false;
                    connection.status = body.first().copied().unwrap_or(tags::status::FAILED);
                    // Messages the server skipped (after an error, until
                    // Sync) answer nothing: their expectations go too.
                    while queue.front().is_some_and(|e| {
                        !matches!(
                            e,
                            Expect::Hidden | Expect::Query | Expect::Sync | Expect::QuietSync
                        )
                    }) {
                        queue.pop_front();
                    }
                    let front = queue.pop_front();
                    if matches!(
                        front,
                        Some(Expect::Query | Expect::Sync | Expect::QuietSync)
                    ) {
                        connection.awaiting_sync = false;
                    }
                    if matches!(front, Some(Expect::Query | Expect::Sync)) && held_error.is_none() {
                        let status = if side_connection {
                            self.status_byte()
                        } else {
                            connection.status
                        };
                        self.pass(tag, &[status]);
                    }
                    self.emit_synthetic(&mut queue);
                    continue;
                }
                tags::backend::COPY_IN_RESPONSE => {
                    // COPY FROM STDIN: the client's data goes to the server.
                    // In the extended protocol the server ignored the Sync
                    // sent before the data; libpq sends another after it.
                    let extended = matches!(queue.front(), Some(Expect::Execute));
                    connection
                        .write(std::mem::take(&mut pending))
                        .await
                        .map_err(RelayError::Server)?;
                    self.pass(tag, &body);
                    self.flush_relay().await?;
                    self.pump_copy_data(connection, extended).await?;
                    if extended && !queue.iter().any(|e| matches!(e, Expect::Sync)) {
                        // A batch ended by Flush (as pg8000 sends COPY):
                        // the Sync after the data, forwarded with it, ends
                        // the batch; its ReadyForQuery goes to the client.
                        queue.push_back(Expect::Sync);
                        self.synced_by_copy = true;
                    }
                    continue;
                }
                _ => {}
            }
            let Some(front) = queue.front_mut() else {
                break;
            };
            let done = match front {
                Expect::Hidden => false,
                Expect::Query => {
                    self.pass(tag, &body);
                    false
                }
                Expect::ParseComplete { visible, name } => {
                    if let Some(name) = name.take() {
                        connection.prepared.insert(name);
                    }
                    if *visible {
                        self.pass(tag, &body);
                    }
                    true
                }
                Expect::DescribeStatement => {
                    self.pass(tag, &body);
                    tag != tags::backend::PARAMETER_DESCRIPTION
                }
                Expect::Execute => {
                    self.pass(tag, &body);
                    matches!(
                        tag,
                        tags::backend::COMMAND_COMPLETE
                            | tags::backend::EMPTY_QUERY_RESPONSE
                            | tags::backend::PORTAL_SUSPENDED
                    )
                }
                Expect::CloseStatement(name) => {
                    connection.prepared.remove(name.as_str());
                    self.pass(tag, &body);
                    true
                }
                Expect::BindComplete
                | Expect::CloseComplete
                | Expect::DescribePortal
                | Expect::Sync => {
                    self.pass(tag, &body);
                    true
                }
                Expect::Synthetic(_) | Expect::QuietSync => true,
            };
            if done {
                queue.pop_front();
                self.emit_synthetic(&mut queue);
            }
            if self.output.len() >= OUTPUT_FLUSH_BYTES && held_error.is_none() {
                self.flush_relay().await?;
            }
        }
        // What the server skips (after an error) or answers with nothing
        // (a Flush at the end) may still be unwritten.
        connection
            .write(pending)
            .await
            .map_err(RelayError::Server)?;
        match held_error {
            Some(error) => Ok((Outcome::WrongShard(error), true)),
            None => Ok((Outcome::Done, saw_error)),
        }
    }

    async fn flush_relay(&mut self) -> Result<(), RelayError> {
        self.flush().await.map_err(RelayError::Client)
    }

    fn emit_synthetic(&mut self, queue: &mut VecDeque<Expect>) {
        while let Some(Expect::Synthetic(bytes)) = queue.front() {
            self.output.put_slice(bytes);
            queue.pop_front();
        }
    }

    /// A notice, or a notification (its sender named as the client that
    /// sent it, see notifiers.rs).
    pub(super) fn pass_notice(&mut self, tag: u8, body: &[u8]) {
        match (tag, self.shared.notifiers.as_client(body)) {
            (tags::backend::NOTIFICATION_RESPONSE, Some(rewritten)) => self.pass(tag, &rewritten),
            _ => self.pass(tag, body),
        }
    }

    pub(super) fn pass(&mut self, tag: u8, body: &[u8]) {
        let at = protocol::begin_message(&mut self.output, tag);
        self.output.put_slice(body);
        protocol::end_message(&mut self.output, at);
    }
}
